"""The frozen passage index of query-side fine-tuning: every corpus passage encoded once by the starting passage
encoder, looked up by corpus row during training instead of being encoded.

Query-side fine-tuning (DensePhrases, Lee et al., EMNLP 2021, Sec. 4.2 "query-side fine-tuning") keeps the passage
encoder E_d at its starting checkpoint and trains only the query encoder E_q. The passage embeddings then never
change, so they are computed once, through the same on-disk embedding cache as evaluation
(:func:`multipos.retrieval.encoding.cached_encode`, keyed by the passage encoder's weights, the corpus, the length and
the precision): the zero-shot reference, the teacher ordering, the dev retrieval of every epoch and the final
evaluation on the same corpus reuse them and encode only queries.

Memory: the index is N × H in ``dtype``. MS MARCO (8.84M × 768) is 13.6 GB in bf16 (27.2 GB in float32); NQ's
DPR Wikipedia (21.0M × 768) is 32.3 GB in bf16 (docs/query-side.md).
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Sequence

import numpy as np
import torch
from torch import Tensor

log = logging.getLogger(__name__)

#: Rows converted from the (possibly memory-mapped) float32 cache to the index dtype at a time.
_COPY_CHUNK = 1 << 18
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def index_dtype(name: str) -> torch.dtype:
    """``auto`` → bfloat16 when a CUDA device is present (half the device memory), else float32; or one of
    :data:`DTYPES`. Raises ValueError naming ``passages.index.dtype`` for anything else."""
    if name == "auto":
        return torch.bfloat16 if torch.cuda.is_available() else torch.float32
    if name not in DTYPES:
        raise ValueError(f"passages.index.dtype={name!r}; allowed: auto, {', '.join(DTYPES)}")
    return DTYPES[name]


class FrozenPassageIndex:
    """Passage embeddings [N, H] of a corpus with their ids, looked up by id.

    Args:
        ids: the N passage ids in corpus order (row i is ``ids[i]``).
        embeddings: [N, H] tensor (any float dtype; not trained).

    Raises ValueError when ``ids`` and ``embeddings`` disagree in length or ``ids`` repeats an id.
    """

    def __init__(self, ids: Sequence[str], embeddings: Tensor):
        if embeddings.dim() != 2 or embeddings.shape[0] != len(ids):
            raise ValueError(f"passage index: {len(ids)} ids but embeddings of shape {tuple(embeddings.shape)}")
        self.ids = list(ids)
        self.row = {pid: i for i, pid in enumerate(self.ids)}
        if len(self.row) != len(self.ids):
            raise ValueError("passage index: the corpus repeats a passage id")
        self.embeddings = embeddings

    def __len__(self) -> int:
        return len(self.ids)

    @property
    def hidden_size(self) -> int:
        """H: the width of the stored passage embeddings ([N, H])."""
        return int(self.embeddings.shape[1])

    def rows(self, passage_ids: Sequence[str]) -> Tensor:
        """Corpus rows [len(passage_ids)] (int64) of ``passage_ids``.

        Raises KeyError naming the first id that is not in the indexed corpus (a training passage outside the
        corpus the index was built from)."""
        return self.rows_of(self.row, passage_ids)

    @staticmethod
    def rows_of(row: dict[str, int], passage_ids: Sequence[str]) -> Tensor:
        """:meth:`rows` for an id → row mapping (the LightningModule keeps the mapping, the embeddings as a
        buffer): int64 [len(passage_ids)]. Raises KeyError as :meth:`rows` does."""
        try:
            return torch.tensor([row[p] for p in passage_ids], dtype=torch.long)
        except KeyError as e:
            raise KeyError(f"passage {e.args[0]!r} is not in the frozen passage index ({len(row)} passages): "
                           "query-side training looks passages up in the training corpus") from None

    @classmethod
    def encode(cls, model, ids: Sequence[str], texts: Sequence[str], cache: Path | None, *,
               max_length: int | None = None, batch_size: int = 64, bf16: bool | None = None,
               dtype: str = "auto") -> "FrozenPassageIndex":
        """Encode the corpus with ``model``'s passage encoder (a :class:`~multipos.model.encoder.DualEncoder`)
        through the embedding cache → an index of ``dtype`` (:func:`index_dtype`), embeddings [N, H] on the CPU (the
        LightningModule moves them to the training device as a non-persistent buffer).

        ``max_length`` / ``batch_size`` / ``bf16``: those of evaluation (``eval.passage_max_length``,
        ``eval.batch_size``, ``eval.bf16``), so that evaluation finds these embeddings in the cache. Raises
        ValueError for an unknown ``dtype`` (:func:`index_dtype`).
        """
        from multipos.retrieval.encoding import cached_encode

        start = time.perf_counter()
        emb = cached_encode(model, list(ids), list(texts), cache, tag="frozen passage index", kind="passage",
                            max_length=max_length, batch_size=batch_size, bf16=bf16)
        torch_dtype = index_dtype(dtype)
        out = torch.empty(emb.shape, dtype=torch_dtype)
        for lo in range(0, len(emb), _COPY_CHUNK):
            out[lo: lo + _COPY_CHUNK] = torch.from_numpy(np.array(emb[lo: lo + _COPY_CHUNK], dtype=np.float32))
        log.info("frozen passage index: %d × %d passages (%s, %.1f MB) in %.1f s", out.shape[0], out.shape[1],
                 str(torch_dtype).replace("torch.", ""), out.numel() * out.element_size() / 2**20,
                 time.perf_counter() - start)
        return cls(ids, out)


def check_settings(passages) -> None:
    """Validate a ``passages`` config node (``conf/passages``) before anything is built.

    Raises ValueError naming ``passages.candidates`` for an unknown value or for ``corpus`` without the frozen index
    (two-tower training encodes passages every step: the whole corpus cannot be a candidate), and naming
    ``passages.index`` when the frozen index has no index settings.
    """
    if not passages:
        return
    candidates = passages.get("candidates", "group")
    if candidates not in ("group", "corpus"):
        raise ValueError(f"passages.candidates={candidates!r}; allowed: group, corpus")
    if candidates == "corpus" and not passages.get("frozen"):
        raise ValueError("passages.candidates=corpus needs the frozen passage index (passages=frozen_index): "
                         "two-tower training encodes its passages every step")
    if passages.get("frozen") and not passages.get("index"):
        raise ValueError("passages.frozen=true needs passages.index (how the corpus is encoded; "
                         "conf/passages/frozen_index.yaml)")


def for_training(passages, model, corpus, cache: Path | None) -> FrozenPassageIndex | None:
    """The frozen passage index of a training run, or None for two-tower training (``passages.frozen`` false).

    Freezes ``model``'s passage encoder (:meth:`multipos.model.encoder.DualEncoder.freeze_passage_encoder`) and encodes
    ``corpus`` (a :class:`multipos.formats.types.Corpus`) with ``passages.index`` through the embedding cache ``cache``.
    Raises ValueError as :func:`check_settings` does.
    """
    check_settings(passages)
    if not passages or not passages.get("frozen"):
        return None
    from hydra.utils import instantiate

    model.freeze_passage_encoder()
    ids = corpus.ids
    return instantiate(passages.index)(model, ids, corpus.texts(ids), cache)
