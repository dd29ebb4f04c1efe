"""Encoding passages and queries with a :class:`~multipos.model.encoder.DualEncoder`: length-sorted batches, on the
trainer's accelerator, bf16 where native, and an on-disk embedding cache keyed by weights and corpus text.

Corpora above :data:`MEMMAP_THRESHOLD` passages are encoded straight into a memory-mapped ``.npy`` cache file
(:func:`cached_encode`), which :mod:`multipos.retrieval.dense` searches in shards.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import logging
import os
import secrets
import struct
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import torch
from tqdm.auto import tqdm

from multipos.hardware import native_bf16
from multipos.model.encoder import DualEncoder
from multipos.model.transfer import to_device

log = logging.getLogger(__name__)

#: Corpora with more passages than this are encoded straight into a memory-mapped ``.npy`` cache file
#: and cache hits are memory-mapped read-only (8.8M × 768 float32 = 27 GB would not fit in RAM twice).
MEMMAP_THRESHOLD = 1_000_000


def autocast_context(device: torch.device, bf16: bool):
    """bf16 autocast on the device when requested (CPU or CUDA), else a no-op context."""
    if bf16:
        return torch.autocast(device_type=device.type, dtype=torch.bfloat16)
    return contextlib.nullcontext()


def encoding_device(model: DualEncoder, device: str | torch.device | None = "auto") -> torch.device:
    """Put ``model`` on the device it encodes on (see :func:`encode`'s ``device``) and return that device."""
    current = next(model.parameters()).device
    if device is None:
        return current
    if device == "auto":
        if current.type != "cpu" or not torch.cuda.is_available():
            return current
        device = "cuda"
    target = torch.device(device)
    if target != current:
        model.to(target)
    return next(model.parameters()).device


TOKENIZE_BATCHES = 16
"""Batches tokenised in one tokenizer call by :func:`encode`: a fast tokenizer spreads one call over every core, so
on a GPU machine tokenisation (which bounded encoding there: 1,200-2,100 passages/s on an H100, 2026-11-25) no longer
runs one small batch at a time, and the GPU is waited for once per window instead of once per batch. Still about
2,400 passages/s at 256 tokens on the H200 (H5, 2026-11-26) with each window tokenised while the GPU waited, so on
CUDA the next window is tokenised in a background thread while the GPU encodes this one (``encode(overlap=...)``)."""


def trim_padding(tokens: dict[str, torch.Tensor], side: str = "right") -> dict[str, torch.Tensor]:
    """Drop the padding columns that no row of ``tokens`` needs ([n, L] tensors with an ``attention_mask``) → the
    same rows padded to their own longest, as the tokenizer pads a batch of exactly these texts. ``side``: the
    tokenizer's ``padding_side`` (``left`` keeps the last columns). Raises ValueError for another side."""
    if side not in ("right", "left"):
        raise ValueError(f"padding side must be 'right' or 'left', got {side!r}")
    width = int(tokens["attention_mask"].sum(dim=1).max()) if tokens["attention_mask"].numel() else 0
    cols = slice(0, width) if side == "right" else slice(tokens["attention_mask"].shape[1] - width, None)
    return {k: v[:, cols] for k, v in tokens.items()}


def encode(
    model: DualEncoder,
    texts: list[str],
    kind: str = "passage",
    max_length: int | None = None,
    batch_size: int = 64,
    bf16: bool | None = None,
    progress: bool = True,
    *,
    out: np.ndarray | None = None,
    device: str | torch.device | None = "auto",
    overlap: bool | None = None,
) -> np.ndarray:
    """Embed ``texts`` → float32 array [len(texts), H], in input order.

    Texts are sorted by length (characters, then tokens within each tokenised window of ``batch_size`` ×
    ``TOKENIZE_BATCHES`` texts) so each batch pads little; ``kind`` selects the query
    or passage encoder and default truncation length. Runs under ``torch.inference_mode`` and,
    with ``bf16``, bf16 autocast (embeddings match fp32 to cosine ≥ 0.9999 on MiniLM); ``bf16=None``
    uses it only where bf16 is native (:func:`multipos.auto_precision`: emulated bf16 on a CPU without
    AVX512-BF16/AMX is many times slower than fp32).

    ``device``: where to encode. ``"auto"`` (default) moves a model that sits on the CPU to the GPU when
    CUDA is available (the zero-shot reference, the teacher, and the final evaluation after Lightning has
    moved the trained model back to the CPU) and leaves it there; ``None`` keeps the model where it is
    (retrieval validation during ``fit``); anything else is passed to ``model.to``.

    ``overlap``: tokenise the next window in a background thread while the device encodes this one (the embeddings
    are the same); ``None`` (default) does so on CUDA, where the GPU otherwise waits for the tokenizer, and not on a
    CPU, whose cores the model already uses. The log line says how long tokenising took and how long encoding
    waited for it. Each batch goes to a CUDA device pinned and non-blocking
    (:func:`multipos.model.transfer.to_device`), so
    the host queues the next batch while the device encodes this one; it waits once per window, for its embeddings.

    ``out``: optional preallocated float32 array [len(texts), H] (e.g. an ``np.lib.format.open_memmap``
    file) that is filled batch by batch and returned, so a huge corpus never exists twice in RAM.
    Raises ValueError if its shape or dtype does not match.
    """
    shape = (len(texts), model.hidden_size)
    if out is None:
        out = np.zeros(shape, dtype=np.float32)
    elif tuple(out.shape) != shape or out.dtype != np.float32:
        raise ValueError(f"out must be a float32 array of shape {shape}; got {out.dtype} {tuple(out.shape)}")
    began = time.perf_counter()
    # the move happens outside inference mode: parameters moved inside it become inference tensors, and training
    # the model afterwards fails ("Inference tensors cannot be saved for backward"; seen on CUDA, where the
    # frozen-index or zero-shot encoding moves a CPU model to the GPU before Lightning trains it)
    device = encoding_device(model, device)
    bf16 = native_bf16() if bf16 is None else bf16
    was_training = model.training
    model.eval()
    order = np.argsort([-len(t) for t in texts], kind="stable")
    fn = model.encode_queries if kind == "query" else model.encode_passages
    side = getattr(model.tokenizer, "padding_side", "right")
    window = batch_size * TOKENIZE_BATCHES
    windows = [order[first : first + window] for first in range(0, len(texts), window)]
    tokenising = [0.0]  # seconds spent in the tokenizer, in whichever thread

    def tokenize(idx: np.ndarray) -> dict[str, torch.Tensor]:
        start = time.perf_counter()
        tokens = model.tokenize([texts[i] for i in idx], kind=kind, max_length=max_length)
        tokenising[0] += time.perf_counter() - start
        return tokens

    overlap = device.type == "cuda" if overlap is None else overlap
    pool = ThreadPoolExecutor(1, thread_name_prefix="multipos-tokenize") if overlap and len(windows) > 1 else None
    pending = pool.submit(tokenize, windows[0]) if pool is not None else None
    waited = 0.0
    # disable=None: the bar shows only on a terminal
    bar = tqdm(total=-(-len(texts) // batch_size), desc=f"encode {kind}s", disable=None if progress else True,
               leave=False)
    try:
        with torch.inference_mode():
            for w, idx in enumerate(windows):
                asked = time.perf_counter()
                if pool is None:
                    tokens = tokenize(idx)
                else:  # this window's tokens, then the next window's tokenisation starts while the device works
                    tokens = pending.result()
                    if w + 1 < len(windows):
                        pending = pool.submit(tokenize, windows[w + 1])
                waited += time.perf_counter() - asked
                # within the window, by length in tokens: characters predict it poorly (TREC DL 2019 passages,
                # batches of 64: 1.45 tokens through the encoder per real token sorted by characters, 1.06 so)
                by_tokens = torch.argsort(tokens["attention_mask"].sum(1), descending=True, stable=True)
                idx = idx[by_tokens.numpy()]
                tokens = {k: v[by_tokens] for k, v in tokens.items()}
                embs = []
                for start in range(0, len(idx), batch_size):
                    batch = trim_padding({k: v[start : start + batch_size] for k, v in tokens.items()}, side)
                    with autocast_context(device, bf16):
                        # pinned, non-blocking copies: the host queues the next batch while the device encodes
                        embs.append(fn({k: to_device(v, device) for k, v in batch.items()}).float())
                    bar.update(1)
                out[idx] = torch.cat(embs).cpu().numpy()  # one device-to-host copy (and wait) per window
    finally:
        bar.close()
        if pool is not None:
            pool.shutdown(wait=True, cancel_futures=True)
        model.train(was_training)
    seconds = time.perf_counter() - began
    log.info("encoded %d %s on %s (%s) in %.1f s (%.0f/s; tokenising %.1f s, %s)", len(texts),
             "queries" if kind == "query" else "passages", device, "bf16" if bf16 else "fp32", seconds,
             len(texts) / max(seconds, 1e-9), tokenising[0],
             f"in a background thread, waited for {waited:.1f} s" if pool is not None else "in turn with the model")
    return out


def corpus_digest(ids: list[str], texts: list[str]) -> str:
    """16 hex digits of sha1 over every (id, text) pair in order (UTF-8, each length-prefixed): an edited,
    added, removed or reordered passage changes it, even when its length is unchanged (about 2 s per million
    passages of MS MARCO length). The corpus part of the embedding and dense-negative cache keys."""
    h = hashlib.sha1()
    pack = struct.Struct("<QQ").pack
    for i, t in zip(ids, texts):
        ib, tb = i.encode("utf-8", "surrogatepass"), t.encode("utf-8", "surrogatepass")
        h.update(pack(len(ib), len(tb)))
        h.update(ib)
        h.update(tb)
    return h.hexdigest()[:16]


def _cache_key(model: DualEncoder, ids: list[str], texts: list[str], max_length: int | None,
               bf16: bool = True) -> str:
    """``{model.fingerprint()}-{corpus_digest(ids, texts)}-{max length}-{bf16|fp32}``.

    ``model.fingerprint()`` hashes the passage encoder weights *and* its pooling + normalisation; the corpus
    part (:func:`corpus_digest`) hashes every id and the full text. The key ignores ``tag`` (the set name) so
    sets sharing a corpus (NFCorpus dev/test) share embeddings.
    """
    precision = "bf16" if bf16 else "fp32"
    return f"{model.fingerprint()}-{corpus_digest(ids, texts)}-{max_length or model.passage_max_length}-{precision}"


def _preallocate(path: Path) -> None:
    """Reserve the disk blocks of ``path`` now: ENOSPC is an OSError here, rather than a SIGBUS when a
    sparse memmap page is written back to a full disk. Skipped where the file system cannot do it."""
    if not hasattr(os, "posix_fallocate"):  # pragma: no cover - macOS / Windows
        return
    with open(path, "r+b") as f:
        try:
            os.posix_fallocate(f.fileno(), 0, os.fstat(f.fileno()).st_size)
        except OSError as e:  # pragma: no cover - file system specific
            if e.errno not in (errno.EOPNOTSUPP, errno.EINVAL, errno.ENOSYS):
                raise


def cached_encode(model: DualEncoder, ids: list[str], texts: list[str], cache_dir: Path | None, tag: str, *,
                  memmap_threshold: int | None = None, **kw) -> np.ndarray:
    """:func:`encode` with an on-disk cache keyed by (model weights, corpus ids+texts, max length, bf16).

    The key is ``{model.fingerprint()}-{sha1(ids, texts)}-{max length}-{bf16|fp32}`` (:func:`_cache_key`);
    pooling and normalisation are part of ``model.fingerprint()``. ``batch_size`` is not (it changes
    embeddings only within numerical noise). ``cache_dir=None`` disables caching; ``tag`` only labels the
    log line.

    Corpora with more than ``memmap_threshold`` passages (default :data:`MEMMAP_THRESHOLD`) are encoded
    directly into an ``open_memmap`` ``.npy`` file, and cache hits for them are returned as read-only
    memmaps (``mmap_mode="r"``); smaller ones are encoded in memory and ``np.load``-ed whole.

    Crash safety: embeddings are written to a uniquely named ``*.tmp.npy`` file in the cache folder and
    renamed (atomically, same file system) to ``{key}.npy`` only once complete and flushed; an exception
    removes the temp file. A killed process can leave a ``*.tmp.npy`` behind, which is never read as a
    hit (delete it by hand, or ``make clean-cache``). A cached file that is empty, truncated or unreadable,
    or whose shape does not match the corpus, is ignored and re-encoded (and replaced).
    """
    if cache_dir is None:
        return encode(model, texts, **kw)
    threshold = MEMMAP_THRESHOLD if memmap_threshold is None else memmap_threshold
    big = len(texts) > threshold
    if kw.get("bf16") is None:
        kw["bf16"] = native_bf16()
    key = _cache_key(model, ids, texts, kw.get("max_length"), kw["bf16"])
    path = Path(cache_dir) / "embeddings" / f"{key}.npy"
    shape = (len(texts), model.hidden_size)
    if path.is_file():
        try:
            emb = np.load(path, mmap_mode="r" if big else None)
        except (OSError, ValueError, EOFError) as e:  # empty, truncated or corrupt (e.g. written by another tool)
            log.warning("embedding cache %s unreadable (%s); re-encoding", path, e)
        else:
            if tuple(emb.shape) == shape and emb.dtype == np.float32:
                log.info("embedding cache hit (%s): %s", tag, path)
                return emb
            log.warning("embedding cache %s has shape %s, expected %s; re-encoding", path, emb.shape, shape)
            del emb
    path.parent.mkdir(parents=True, exist_ok=True)
    stale = sorted(path.parent.glob(f"{key}.*.tmp.npy"))
    if stale:
        log.warning("leftover partial embedding files (crashed or concurrent run?): %s", ", ".join(map(str, stale)))
    tmp = path.with_name(f"{key}.{os.getpid()}-{secrets.token_hex(4)}.tmp.npy")
    try:
        if big:
            log.info("encoding %d passages (%s) into memory-mapped %s", len(texts), tag, tmp)
            out = np.lib.format.open_memmap(tmp, mode="w+", dtype=np.float32, shape=shape)
            _preallocate(tmp)
            encode(model, texts, out=out, **kw)
            out.flush()  # msync: the data is on disk before the rename makes it a cache entry
            del out
        else:
            emb = encode(model, texts, **kw)
            with open(tmp, "wb") as f:
                np.save(f, emb)
                f.flush()
                os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return np.load(path, mmap_mode="r") if big else emb


# ----------------------------------------------------------------------------------------------- FAISS
