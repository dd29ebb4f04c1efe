"""Dual encoder E_q, E_d over Hugging Face ``AutoModel`` (paper Sec. 3, "Dual encoder")."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from torch import Tensor, nn
from transformers import AutoModel, AutoTokenizer

from multipos.assets import resolve_model

POOLINGS = ("cls", "mean")
_CONFIG_FILE = "multipos_encoder.json"


def pool(hidden: Tensor, attention_mask: Tensor, pooling: str) -> Tensor:
    """Pool token states [B, L, H] with mask [B, L] into [B, H] by ``cls`` (first token) or ``mean``.

    Raises ValueError for an unknown pooling name.
    """
    if pooling == "cls":
        return hidden[:, 0]
    if pooling == "mean":
        mask = attention_mask.unsqueeze(-1).to(hidden.dtype)
        return (hidden * mask).sum(1) / mask.sum(1).clamp(min=1e-9)
    raise ValueError(f"unknown pooling {pooling!r} (model.pooling); allowed: {', '.join(POOLINGS)}")


class DualEncoder(nn.Module):
    """Query and passage encoders with s(q, d) = ⟨E_q(q), E_d(d)⟩ / τ.

    Args:
        name_or_path: HF checkpoint folder, bare asset name or hub id (see :func:`resolve_model`);
            a folder saved by :meth:`save_pretrained` restores pooling/normalisation/temperature
            unless they are given explicitly.
        pooling: ``cls`` or ``mean``.
        normalize: L2-normalise embeddings (cosine similarity).
        temperature: τ > 0; scores are divided by it (1.0 = raw dot product).
        shared: one encoder for queries and passages (True) or untied copies (False).
        query_max_length, passage_max_length: truncation lengths in tokens.
        attention_dropout: override the checkpoint's attention-probability dropout (None = keep).
            ``model=minilm`` uses 0.0: in a profiler run, sampling the [B·G, heads, L, L] masks took
            about half of MiniLM's training forward pass on CPU (the full-step benchmark in
            ``bench/`` showed a smaller difference).
        hidden_dropout: override the checkpoint's hidden-state dropout (None = keep).

    Raises: ValueError for an unknown pooling or τ ≤ 0.
    """

    def __init__(
        self,
        name_or_path: str,
        pooling: str | None = None,
        normalize: bool | None = None,
        temperature: float | None = None,
        shared: bool | None = None,
        query_max_length: int = 32,
        passage_max_length: int = 128,
        attention_dropout: float | None = None,
        hidden_dropout: float | None = None,
    ):
        super().__init__()
        path = resolve_model(name_or_path)
        saved = {}
        if Path(path, _CONFIG_FILE).is_file():
            saved = json.loads(Path(path, _CONFIG_FILE).read_text())
        self.pooling = pooling if pooling is not None else saved.get("pooling", "cls")
        self.normalize = bool(normalize if normalize is not None else saved.get("normalize", False))
        self.temperature = float(temperature if temperature is not None else saved.get("temperature", 1.0))
        self.shared = bool(shared if shared is not None else saved.get("shared", True))
        if self.pooling not in POOLINGS:
            raise ValueError(f"unknown pooling {self.pooling!r} (model.pooling); allowed: {', '.join(POOLINGS)}")
        if self.temperature <= 0:
            raise ValueError(f"model.temperature must be > 0, got {self.temperature}")
        self.query_max_length = query_max_length
        self.passage_max_length = passage_max_length
        self.name_or_path = path
        untied_saved = Path(path, "query_encoder").is_dir()
        overrides = {}
        if attention_dropout is not None:
            overrides["attention_probs_dropout_prob"] = attention_dropout
        if hidden_dropout is not None:
            overrides["hidden_dropout_prob"] = hidden_dropout
        self.query_encoder = AutoModel.from_pretrained(str(Path(path, "query_encoder")) if untied_saved else path, **overrides)
        if self.shared:
            self.passage_encoder = self.query_encoder
        else:
            self.passage_encoder = AutoModel.from_pretrained(
                str(Path(path, "passage_encoder")) if untied_saved else path, **overrides)
        # from_pretrained returns eval mode; training must turn dropout back on (MACHINE-NOTES).
        self.train()
        self.tokenizer = AutoTokenizer.from_pretrained(str(Path(path, "query_encoder")) if untied_saved else path)

    @property
    def hidden_size(self) -> int:
        return self.query_encoder.config.hidden_size

    def _embed(self, encoder: nn.Module, tokens: dict[str, Tensor]) -> Tensor:
        out = encoder(input_ids=tokens["input_ids"], attention_mask=tokens["attention_mask"])
        emb = pool(out.last_hidden_state, tokens["attention_mask"], self.pooling)
        if self.normalize:
            emb = nn.functional.normalize(emb.float(), dim=-1)
        return emb

    def encode_queries(self, tokens: dict[str, Tensor]) -> Tensor:
        """Query embeddings [B, H] from tokenizer output (``input_ids``, ``attention_mask`` [B, Lq])."""
        return self._embed(self.query_encoder, tokens)

    def encode_passages(self, tokens: dict[str, Tensor]) -> Tensor:
        """Passage embeddings [N, H] from tokenizer output ([N, Lp])."""
        return self._embed(self.passage_encoder, tokens)

    def score(self, q: Tensor, p: Tensor) -> Tensor:
        """Score matrix [B, N] = q [B, H] · p [N, H]ᵀ / τ, in float32."""
        return q.float() @ p.float().T / self.temperature

    def tokenize(self, texts: list[str], kind: str = "passage", max_length: int | None = None) -> dict[str, Tensor]:
        """Tokenise ``texts`` with padding to the longest, truncated to the query/passage length."""
        if max_length is None:
            max_length = self.query_max_length if kind == "query" else self.passage_max_length
        return self.tokenizer(texts, padding=True, truncation=True, max_length=max_length, return_tensors="pt")

    def save_pretrained(self, path: str | Path) -> None:
        """Save in HF format (loadable by ``AutoModel``/``AutoTokenizer``); untied encoders go to
        ``query_encoder/`` and ``passage_encoder/``. Pooling, normalisation and τ go to
        ``multipos_encoder.json``."""
        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        if self.shared:
            self.query_encoder.save_pretrained(path)
            self.tokenizer.save_pretrained(path)
        else:
            for sub, enc in (("query_encoder", self.query_encoder), ("passage_encoder", self.passage_encoder)):
                enc.save_pretrained(path / sub)
                self.tokenizer.save_pretrained(path / sub)
        meta = {"pooling": self.pooling, "normalize": self.normalize, "temperature": self.temperature, "shared": self.shared}
        (path / _CONFIG_FILE).write_text(json.dumps(meta, indent=2))

    @torch.no_grad()
    def fingerprint(self) -> str:
        """Cheap content hash of the passage encoder weights (for embedding caches)."""
        import hashlib

        h = hashlib.sha1()
        for name, t in sorted(self.passage_encoder.state_dict().items()):
            h.update(name.encode())
            flat = t.detach().float().flatten()
            h.update(flat[:: max(1, flat.numel() // 64)].cpu().numpy().tobytes())
        h.update(f"{self.pooling}{self.normalize}".encode())
        return h.hexdigest()[:16]
