"""Passages tokenised once, so that collating a two-tower batch is padding rather than tokenising.

Collating a B=64 × G=8 NFCorpus batch at 128 tokens spends 94 % of its time in the tokenizer (0.18 of 0.19 s on the
2-core EPYC, 2026-11-26), since every passage is tokenised in full before it is truncated; DataLoader workers are
single-threaded, and on a GPU the Lightning loop waited for them (``lightning_vs_bare`` 0.65 with 4 workers on the
H200, docs/gpu.md). :class:`PassageTokens` tokenises the passages training will draw (positives and hard-negative
pools) in one batched call of the fast tokenizer in the main process, which uses every core, and keeps their token
ids as one ragged array; a batch then copies its rows into one array filled with the pad id, on the tokenizer's
padding side. Passages it does not hold (random top-ups from the whole corpus) are tokenised on the fly, as before.
The batches are exactly those of tokenising the texts in the collate function (tests/data/test_passage_tokens.py);
Tevatron pre-tokenises its training data for the same reason.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Sequence

import numpy as np
import torch
from transformers import BatchEncoding

log = logging.getLogger(__name__)

#: passages tokenised per tokenizer call while building the store (bounds the Python lists held at once)
CHUNK = 20_000


class PassageTokens:
    """Token ids of passages (``prompt + passage.full_text()``, truncated to ``max_length`` tokens with the
    tokenizer's special tokens, unpadded), stored ragged: ``flat`` (uint16 when the vocabulary fits, else int32)
    holds every stored passage's ids one after another, ``offsets[i]:offsets[i + 1]`` those of row i.

    Args:
        tokenizer: a Hugging Face (fast) tokenizer; corpus: a :class:`multipos.formats.types.Corpus` (``corpus[pid]``);
        prompt: text put before every passage; max_length: tokens per passage, special tokens included.

    ``exact`` is False when a single passage's encoding holds more than its ids (an attention mask not all ones or
    token type ids not all zero), which the store would not reproduce: :meth:`add` then stores nothing and
    :meth:`batch` tokenises every text, as without a store.
    """

    def __init__(self, tokenizer, corpus, prompt: str, max_length: int):
        self.tokenizer, self.corpus, self.prompt, self.max_length = tokenizer, corpus, prompt, int(max_length)
        self.dtype = np.uint16 if len(tokenizer) <= np.iinfo(np.uint16).max + 1 else np.int32
        self.rows: dict[str, int] = {}
        self.flat = np.empty(0, dtype=self.dtype)
        self.offsets = np.zeros(1, dtype=np.int64)
        self.exact = True

    def __len__(self) -> int:
        return len(self.rows)

    def matches(self, tokenizer, prompt: str, max_length: int) -> bool:
        """Whether this store tokenises as ``tokenizer`` with ``prompt`` and ``max_length`` would."""
        return tokenizer is self.tokenizer and prompt == self.prompt and int(max_length) == self.max_length

    def _encode(self, passage_ids: Sequence[str]) -> dict[str, list[list[int]]]:
        return self.tokenizer(self._texts(passage_ids), truncation=True, max_length=self.max_length)

    def _texts(self, passage_ids: Sequence[str]) -> list[str]:
        try:
            return [self.prompt + self.corpus[p].full_text() for p in passage_ids]
        except KeyError as err:
            raise KeyError(f"passage {err.args[0]!r} of a training group is not in the corpus "
                           f"({len(self.corpus)} passages): a hard negative or positive id the corpus file lacks"
                           ) from None

    def add(self, passage_ids: Iterable[str]) -> int:
        """Tokenise the passages of ``passage_ids`` not stored yet (one tokenizer call per :data:`CHUNK`) and store
        their ids → how many were added (0 once ``exact`` is False). Raises KeyError naming an id not in the corpus."""
        new = [p for p in dict.fromkeys(passage_ids) if p not in self.rows]
        if not new or not self.exact:
            return 0
        start = time.perf_counter()
        parts, lengths = [], []
        for i in range(0, len(new), CHUNK):
            enc = self._encode(new[i : i + CHUNK])
            if not _ids_suffice(enc):
                log.info("passage tokens: the tokenizer's encoding holds more than token ids; batches tokenise texts")
                self.exact = False
                return 0
            lengths.extend(len(ids) for ids in enc["input_ids"])
            parts.extend(np.asarray(ids, dtype=self.dtype) for ids in enc["input_ids"])
        base = len(self.rows)
        self.rows.update((p, base + k) for k, p in enumerate(new))
        self.flat = np.concatenate([self.flat, *parts])
        self.offsets = np.concatenate([self.offsets, self.offsets[-1] + np.cumsum(lengths, dtype=np.int64)])
        log.info("passage tokens: %d passages tokenised in %.1f s (%d stored, %.1f MB)", len(new),
                 time.perf_counter() - start, len(self.rows), self.flat.nbytes / 1e6)
        return len(new)

    def batch(self, passage_ids: Sequence[str]):
        """Tokenizer output for ``passage_ids`` in order, padded to the longest: int64 tensors [n, L]
        (L ≤ ``max_length``) on the tokenizer's padding side, equal to ``tokenizer(texts, padding=True,
        truncation=True, max_length=max_length, return_tensors="pt")``. Passages not stored are tokenised here.

        The rows are copied into one array filled with the pad id rather than padded by ``tokenizer.pad``, whose
        Python lists made it 26 of the 30 ms of collating a B=64 × G=8 batch at 128 tokens (2-core EPYC,
        2026-11-26). Raises ValueError when the tokenizer has no pad token (as ``tokenizer.pad`` does)."""
        if not self.exact:
            return self.tokenizer(self._texts(passage_ids), padding=True, truncation=True,
                                  max_length=self.max_length, return_tensors="pt")
        missing = [p for p in passage_ids if p not in self.rows]
        fresh = dict(zip(missing, self._encode(missing)["input_ids"])) if missing else {}
        rows = []
        for p in passage_ids:
            row = self.rows.get(p)
            rows.append(np.asarray(fresh[p]) if row is None else self.flat[self.offsets[row] : self.offsets[row + 1]])
        pad_id = self.tokenizer.pad_token_id
        if pad_id is None:
            raise ValueError(f"passage tokens: the tokenizer {type(self.tokenizer).__name__} has no pad token, so a "
                             "batch of passages cannot be padded (set tokenizer.pad_token)")
        lengths = np.fromiter((len(r) for r in rows), dtype=np.int64, count=len(rows))
        width = int(lengths.max()) if len(rows) else 0
        ids = np.full((len(rows), width), pad_id, dtype=np.int64)
        left = self.tokenizer.padding_side == "left"
        for i, r in enumerate(rows):
            if left:
                ids[i, width - len(r) :] = r
            else:
                ids[i, : len(r)] = r
        positions = np.arange(width)
        mask = positions >= width - lengths[:, None] if left else positions < lengths[:, None]
        features = {"input_ids": torch.from_numpy(ids)}
        names = self.tokenizer.model_input_names
        if "token_type_ids" in names:
            features["token_type_ids"] = torch.zeros(ids.shape, dtype=torch.int64)
        if "attention_mask" in names:
            features["attention_mask"] = torch.from_numpy(mask.astype(np.int64))
        return BatchEncoding(features)


def _ids_suffice(encoding) -> bool:
    """Whether ``encoding`` (unpadded) is determined by its ids: attention masks all ones, token type ids all zero."""
    masks, types = encoding.get("attention_mask"), encoding.get("token_type_ids")
    return (masks is None or all(all(m) for m in masks)) and (types is None or not any(any(t) for t in types))
