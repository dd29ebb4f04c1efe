"""The sentence-transformers folder format, both ways: the settings a folder carries (pooling, L2 normalisation,
query / passage prompts) and one encoder written so that ``SentenceTransformer(folder)`` embeds exactly as
:class:`multipos.model.encoder.DualEncoder` does (same pooling, normalisation and prompts).

Files (the legacy sentence-transformers 2–5 layout, which 6.x still reads): ``modules.json`` (Transformer, Pooling,
optionally Normalize), ``sentence_bert_config.json`` (``max_seq_length``), ``1_Pooling/config.json`` (one boolean per
pooling mode, or ``pooling_mode`` from 6.x on), ``config_sentence_transformers.json`` (``prompts``,
``similarity_fn_name``). Prompts are written under ``query`` and ``document``: ``encode_query`` uses the first,
``encode_document`` the second (it also accepts ``passage`` or ``corpus`` when reading).
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from torch import nn

from multipos import atomic

__all__ = ["POOLING_MODES", "ST_FORMAT_VERSION", "read_settings", "write_side"]

#: multipos pooling name → the boolean of ``1_Pooling/config.json`` that selects it.
POOLING_MODES = {"cls": "pooling_mode_cls_token", "mean": "pooling_mode_mean_tokens",
                 "lasttoken": "pooling_mode_lasttoken"}
#: Oldest sentence-transformers release that reads every key :func:`write_side` writes (``similarity_fn_name``
#: appeared in 3.0); later releases read the same folders.
ST_FORMAT_VERSION = "3.0.0"
#: Prompt names, in the order sentence-transformers' ``encode_document`` looks for them.
PASSAGE_PROMPT_NAMES = ("document", "passage", "corpus")


def _pooling(folder: Path, module: dict) -> str | None:
    try:
        cfg = json.loads((folder / module.get("path", "") / "config.json").read_text())
    except (OSError, ValueError):
        return None
    mode = cfg.get("pooling_mode")  # sentence-transformers ≥ 6
    if mode is None:  # ≤ 5: one boolean per mode
        on = [k for k, v in cfg.items() if k.startswith("pooling_mode_") and v is True]
        by_key = {v: k for k, v in POOLING_MODES.items()}
        mode = by_key.get(on[0]) if len(on) == 1 else None
    return mode if mode in POOLING_MODES else None


def _prompts(folder: Path) -> dict:
    try:
        prompts = json.loads((folder / "config_sentence_transformers.json").read_text()).get("prompts") or {}
    except (OSError, ValueError, AttributeError):
        return {}
    out = {}
    if isinstance(prompts.get("query"), str):
        out["query_prompt"] = prompts["query"]
    passage = next((prompts[n] for n in PASSAGE_PROMPT_NAMES if isinstance(prompts.get(n), str)), None)
    if passage is not None:
        out["passage_prompt"] = passage
    return out


def read_settings(path: str | Path) -> dict:
    """Settings of a sentence-transformers folder: ``pooling`` (``cls`` / ``mean`` / ``lasttoken``) and
    ``normalize`` from ``modules.json`` (a Pooling module, optionally followed by Normalize), ``query_prompt`` /
    ``passage_prompt`` from ``config_sentence_transformers.json``'s ``prompts`` where present.

    Returns ``{}`` for a folder without ``modules.json`` or with another pooling mode (prompts alone are still
    returned). All-MiniLM-L6-v2 gives ``{"pooling": "mean", "normalize": True}``.
    """
    folder = Path(path)
    prompts = _prompts(folder)
    try:
        modules = json.loads((folder / "modules.json").read_text())
    except (OSError, ValueError):
        return prompts
    out: dict = {}
    for module in modules if isinstance(modules, list) else ():
        kind = str(module.get("type", ""))
        if kind.endswith("Pooling"):
            mode = _pooling(folder, module)
            if mode is None:
                return prompts
            out["pooling"] = mode
        elif kind.endswith("Normalize"):
            out["normalize"] = True
    if "pooling" not in out:
        return prompts
    out.setdefault("normalize", False)
    return {**out, **prompts}


def write_side(folder: Path, encoder: nn.Module, tokenizer, pooling: str, normalize: bool, max_length: int,
               query_prompt: str = "", passage_prompt: str = "") -> None:
    """Write ``encoder`` and ``tokenizer`` to ``folder`` as a Hugging Face checkpoint that is also a
    sentence-transformers model with ``pooling`` (a key of :data:`POOLING_MODES`), optional L2 normalisation,
    ``max_seq_length`` = ``max_length`` tokens and the prompts (empty = none).

    Raises ValueError for a pooling that sentence-transformers cannot express here.
    """
    if pooling not in POOLING_MODES:
        raise ValueError(f"pooling {pooling!r} has no sentence-transformers Pooling mode; "
                         f"allowed: {', '.join(POOLING_MODES)}")
    import transformers

    encoder.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    modules = [{"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
               {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"}]
    if normalize:
        modules.append({"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"})
        (folder / "2_Normalize").mkdir(exist_ok=True)
    atomic.write_json(folder / "modules.json", modules)
    atomic.write_json(folder / "sentence_bert_config.json", {"max_seq_length": int(max_length), "do_lower_case": False})
    atomic.write_json(folder / "1_Pooling" / "config.json", {
        "word_embedding_dimension": int(encoder.config.hidden_size),
        **{key: pooling == name for name, key in POOLING_MODES.items()},
        "pooling_mode_max_tokens": False,
        "pooling_mode_mean_sqrt_len_tokens": False,
        "pooling_mode_weightedmean_tokens": False,
        "include_prompt": True,  # the prompt's tokens are pooled too, as multipos encodes "<prompt><text>"
    })
    prompts = {name: text for name, text in (("query", query_prompt), ("document", passage_prompt)) if text}
    atomic.write_json(folder / "config_sentence_transformers.json", {
        "__version__": {"sentence_transformers": ST_FORMAT_VERSION, "transformers": transformers.__version__,
                        "pytorch": torch.__version__},
        "prompts": prompts,
        "default_prompt_name": None,
        # τ is not part of the embeddings: multipos scores are these similarities / τ (same ranking)
        "similarity_fn_name": "cosine" if normalize else "dot",
    })
