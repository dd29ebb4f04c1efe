"""Judges: the language models the annotation stages ask, behind one interface.

* :class:`OpenAIJudge` — any OpenAI-compatible HTTP endpoint (vLLM, llama.cpp's server, a hosted API) through the
  official ``openai`` client: base URL, model and key are settings.
* :class:`TransformersJudge` — a local Hugging Face causal LM (GGUF files too, through transformers' GGUF loading,
  ``gguf_file``), greedy decoding with the model's chat template.

A judge answers chat messages with a :class:`multipos.annotate.cache.Completion`; :meth:`Judge.ask` puts the cache in
front of it and counts calls, tokens and cache hits (:attr:`Judge.stats`).
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field

from multipos.annotate.cache import CallCache, Completion, call_key

__all__ = ["Judge", "JudgeStats", "OpenAIJudge", "TransformersJudge"]


@dataclass
class JudgeStats:
    """What the judge cost: calls made, cache hits, tokens, seconds spent waiting on the backend."""

    calls: int = 0
    cache_hits: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    seconds: float = 0.0
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def as_dict(self) -> dict:
        return {"calls": self.calls, "cache_hits": self.cache_hits, "prompt_tokens": self.prompt_tokens,
                "completion_tokens": self.completion_tokens, "seconds": round(self.seconds, 3)}


class Judge:
    """Base class: :meth:`complete` asks the backend; :meth:`ask` asks through the cache.

    Args: backend: a name for the cache key (``openai``, ``transformers``); model: the model name; settings:
    generation settings that change answers (temperature, max tokens), part of the cache key.
    """

    backend = "judge"

    def __init__(self, model: str, cache: CallCache | None = None, settings: dict | None = None):
        self.model, self.cache, self.settings = model, cache, dict(settings or {})
        self.stats = JudgeStats()

    def complete(self, messages: list[dict]) -> Completion:  # pragma: no cover - implemented by the backends
        raise NotImplementedError

    def ask(self, messages: list[dict], prompt_version: str) -> Completion:
        """The answer to ``messages`` from the cache, or from the backend (then cached)."""
        key = call_key(self.backend, self.model, prompt_version, messages, self.settings)
        if self.cache is not None:
            hit = self.cache.get(key)
            if hit is not None:
                with self.stats._lock:
                    self.stats.cache_hits += 1
                return hit
        start = time.perf_counter()
        answer = self.complete(messages)
        with self.stats._lock:
            self.stats.calls += 1
            self.stats.prompt_tokens += answer.prompt_tokens
            self.stats.completion_tokens += answer.completion_tokens
            self.stats.seconds += time.perf_counter() - start
        if self.cache is not None:
            self.cache.put(key, answer)
        return answer


class OpenAIJudge(Judge):
    """An OpenAI-compatible chat endpoint (``openai.OpenAI(base_url=..., api_key=...)``).

    Args: base_url (e.g. ``http://127.0.0.1:8000/v1`` for vLLM or llama.cpp's server), model, api_key (``EMPTY``
    for local servers), temperature, max_tokens, timeout (seconds), max_retries (the client's retries on network
    errors and 429 / 5xx answers).
    """

    backend = "openai"

    def __init__(self, base_url: str, model: str, api_key: str = "EMPTY", temperature: float = 0.0,
                 max_tokens: int = 256, timeout: float = 120.0, max_retries: int = 3, cache: CallCache | None = None):
        super().__init__(model, cache, {"temperature": temperature, "max_tokens": max_tokens})
        import openai

        self.client = openai.OpenAI(base_url=base_url, api_key=api_key, timeout=timeout, max_retries=max_retries)

    def complete(self, messages: list[dict]) -> Completion:
        r = self.client.chat.completions.create(model=self.model, messages=messages, **self.settings)
        usage = r.usage
        return Completion(r.choices[0].message.content or "", getattr(usage, "prompt_tokens", 0) or 0,
                          getattr(usage, "completion_tokens", 0) or 0)


class TransformersJudge(Judge):
    """A local causal LM through transformers: ``path`` a folder or hub id, ``gguf_file`` a GGUF file in it.

    Greedy decoding of at most ``max_new_tokens`` tokens after the model's chat template; calls are serialised (one
    model, one lock)."""

    backend = "transformers"

    def __init__(self, path: str, gguf_file: str | None = None, max_new_tokens: int = 256,
                 cache: CallCache | None = None):
        super().__init__(f"{path}::{gguf_file}" if gguf_file else path, cache, {"max_new_tokens": max_new_tokens})
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        kwargs = {"gguf_file": gguf_file} if gguf_file else {}
        self.tokenizer = AutoTokenizer.from_pretrained(path, **kwargs)
        self.lm = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, **kwargs).eval()
        self._lock = threading.Lock()

    def complete(self, messages: list[dict]) -> Completion:
        import torch

        enc = self.tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_tensors="pt",
                                                 return_dict=True)
        ids = enc["input_ids"]
        with self._lock, torch.inference_mode():
            out = self.lm.generate(**enc, max_new_tokens=self.settings["max_new_tokens"], do_sample=False,
                                   pad_token_id=self.tokenizer.eos_token_id)
        new = out[0, ids.shape[1]:]
        return Completion(self.tokenizer.decode(new, skip_special_tokens=True), int(ids.shape[1]), int(new.shape[0]))
