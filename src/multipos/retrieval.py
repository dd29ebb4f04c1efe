"""Dense retrieval: encode a corpus (length-sorted, cached), index it with FAISS, search top-k.

Index kinds (config key ``eval.index``): ``flat`` (exact, the default), ``hnsw`` and ``ivf`` (approximate,
for large corpora). Corpora too big for one index (21M × 768 float32 = 64 GB) are searched in shards
(``search(..., shard_size=...)``) from a memory-mapped embedding cache (:func:`cached_encode`).
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import logging
import math
import os
import secrets
import struct
import time
from pathlib import Path

import numpy as np
import torch
from tqdm.auto import tqdm

from multipos.model import DualEncoder
from multipos.readers import Run

log = logging.getLogger(__name__)

#: Corpora with more passages than this are encoded straight into a memory-mapped ``.npy`` cache file
#: and cache hits are memory-mapped read-only (8.8M × 768 float32 = 27 GB would not fit in RAM twice).
MEMMAP_THRESHOLD = 1_000_000
#: FAISS index kinds accepted by :func:`build_index` / :func:`search` (``eval.index``).
INDEX_KINDS = ("flat", "hnsw", "ivf")
#: Rows copied to contiguous float32 and added to an index at a time (bounds the extra memory of a
#: memmap or non-float32 input to 256k × H × 4 bytes: 768 MB at H = 768).
ADD_CHUNK = 1 << 18
_GPU_HINT = ("install a CUDA build of faiss (pip install faiss-gpu-cu12, i.e. multipos[gpu]; or conda install "
             "-c pytorch faiss-gpu) and a CUDA torch, or pass use_gpu='auto'/False")


def autocast_context(device: torch.device, bf16: bool):
    """bf16 autocast on the device when requested (CPU or CUDA), else a no-op context."""
    if bf16:
        return torch.autocast(device_type=device.type, dtype=torch.bfloat16)
    return contextlib.nullcontext()


def native_bf16() -> bool:
    """True where bf16 is native (:func:`multipos.auto_precision`): the meaning of ``bf16=None`` here."""
    from multipos import auto_precision

    return auto_precision() == "bf16-mixed"


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


@torch.inference_mode()
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
) -> np.ndarray:
    """Embed ``texts`` → float32 array [len(texts), H], in input order.

    Texts are sorted by length (characters) so each batch pads little; ``kind`` selects the query
    or passage encoder and default truncation length. Runs under ``torch.inference_mode`` and,
    with ``bf16``, bf16 autocast (embeddings match fp32 to cosine ≥ 0.9999 on MiniLM); ``bf16=None``
    uses it only where bf16 is native (:func:`multipos.auto_precision`: emulated bf16 on a CPU without
    AVX512-BF16/AMX is many times slower than fp32).

    ``device``: where to encode. ``"auto"`` (default) moves a model that sits on the CPU to the GPU when
    CUDA is available (the zero-shot reference, the teacher, and the final evaluation after Lightning has
    moved the trained model back to the CPU) and leaves it there; ``None`` keeps the model where it is
    (retrieval validation during ``fit``); anything else is passed to ``model.to``.

    ``out``: optional preallocated float32 array [len(texts), H] (e.g. an ``np.lib.format.open_memmap``
    file) that is filled batch by batch and returned, so a huge corpus never exists twice in RAM.
    Raises ValueError if its shape or dtype does not match.
    """
    shape = (len(texts), model.hidden_size)
    if out is None:
        out = np.zeros(shape, dtype=np.float32)
    elif tuple(out.shape) != shape or out.dtype != np.float32:
        raise ValueError(f"out must be a float32 array of shape {shape}; got {out.dtype} {tuple(out.shape)}")
    device = encoding_device(model, device)
    bf16 = native_bf16() if bf16 is None else bf16
    was_training = model.training
    model.eval()
    order = np.argsort([-len(t) for t in texts], kind="stable")
    fn = model.encode_queries if kind == "query" else model.encode_passages
    # disable=None: the bar shows only on a terminal
    bar = tqdm(range(0, len(texts), batch_size), desc=f"encode {kind}s", disable=None if progress else True, leave=False)
    try:
        for start in bar:
            idx = order[start : start + batch_size]
            tokens = model.tokenize([texts[i] for i in idx], kind=kind, max_length=max_length)
            tokens = {k: v.to(device) for k, v in tokens.items()}
            with autocast_context(device, bf16):
                emb = fn(tokens)
            out[idx] = emb.float().cpu().numpy()
    finally:
        model.train(was_training)
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


def gpu_available() -> bool:
    """True when faiss was built with GPU support and sees a GPU *and* ``torch.cuda.is_available()``."""
    import faiss

    get_num_gpus = getattr(faiss, "get_num_gpus", None)
    if get_num_gpus is None:
        return False
    try:
        n = int(get_num_gpus())
    except RuntimeError:  # pragma: no cover - broken CUDA driver
        return False
    return n > 0 and torch.cuda.is_available()


def _want_gpu(kind: str, use_gpu) -> bool:
    """Resolve ``use_gpu`` ("auto" | True | False) for an index ``kind``; see :func:`build_index`."""
    if not (isinstance(use_gpu, bool) or use_gpu == "auto"):
        raise ValueError(f"use_gpu must be 'auto', True or False; got {use_gpu!r}")
    if use_gpu is False:
        return False
    available = gpu_available()
    if use_gpu is True and not available:
        raise RuntimeError(f"use_gpu=True but faiss has no usable GPU (faiss GPU count 0, no faiss GPU support, "
                           f"or torch.cuda.is_available() is False): {_GPU_HINT}")
    if kind == "hnsw":
        if available:
            (log.warning if use_gpu is True else log.info)("faiss has no GPU HNSW index: the hnsw index stays on CPU")
        return False
    return available


def _to_gpu(index):
    """``index`` (an empty CPU flat / IVF index) cloned onto all visible GPUs. Called by
    :func:`build_index` only when :func:`_want_gpu` says so (never for hnsw).

    Multiple GPUs hold replicas (each GPU the whole index, queries split between them): shard the corpus
    with ``search(..., shard_size=...)`` when it does not fit on one GPU.
    """
    import faiss

    log.info("moving the FAISS index to %d GPU(s)", faiss.get_num_gpus())
    return faiss.index_cpu_to_all_gpus(index)


def default_nlist(n: int) -> int:
    """IVF list count for ``n`` passages: round(4·√n), at most n // 39 (FAISS warns below 39 training
    points per centroid), clamped to [1, n]. 100k → 1265, 8.84M (MS MARCO) → 11894, 21M (DPR Wikipedia) → 18337."""
    return max(1, min(round(4 * math.sqrt(n)), n // 39, n))


def _add(index, passage_emb: np.ndarray) -> None:
    """Add rows to ``index`` ADD_CHUNK at a time, each as contiguous float32 (memmaps are read lazily)."""
    for start in range(0, len(passage_emb), ADD_CHUNK):
        index.add(np.ascontiguousarray(passage_emb[start : start + ADD_CHUNK], dtype=np.float32))


def build_index(passage_emb: np.ndarray, kind: str = "flat", *, hnsw_m: int = 32, ef_construction: int = 200,
                ef_search: int = 128, nlist: int | None = None, nprobe: int = 32, use_gpu="auto"):
    """FAISS inner-product index over ``passage_emb`` [N, H] (any float dtype, array or memmap; rows are
    copied to float32 ADD_CHUNK at a time). Scores are raw inner products (cosine for normalised embeddings).

    Kinds (config key ``eval.index``):

    * ``flat``: IndexFlatIP, exact. Memory N·H·4 bytes.
    * ``hnsw``: IndexHNSWFlat (inner product), ``hnsw_m`` links per node, ``ef_construction`` build beam,
      ``ef_search`` search beam. FAISS does *not* widen the beam to k: a plain ``index.search`` returns at
      most ~ef_search useful hits (and -1 ids beyond); :func:`search_index` / :func:`search` search with
      max(ef_search, k). Memory ≈ N·(H·4 + hnsw_m·8) bytes. Always on CPU (FAISS has no GPU HNSW).
    * ``ivf``: IndexIVFFlat with an IndexFlatIP coarse quantizer (inner product), ``nlist`` k-means lists
      (None → :func:`default_nlist`; clamped to [1, N]) trained on at most 256·nlist passages drawn with a
      fixed seed (all of them for small corpora), searching ``nprobe`` lists (clamped to nlist).

    ``use_gpu``: ``"auto"`` moves flat/ivf indexes to all GPUs when :func:`gpu_available`; ``True`` requires
    a GPU (RuntimeError with an install hint otherwise); ``False`` stays on CPU. GPU search needs k ≤ 2048.

    Raises ValueError for an unknown kind, a non-2-D array, an empty corpus for ``ivf`` or a bad ``use_gpu``.
    """
    import faiss

    if kind not in INDEX_KINDS:
        raise ValueError(f"unknown FAISS index kind {kind!r} (config key eval.index); allowed: {', '.join(INDEX_KINDS)}")
    if passage_emb.ndim != 2:
        raise ValueError(f"passage_emb must be 2-D [N, H]; got shape {passage_emb.shape}")
    n, dim = passage_emb.shape
    gpu = _want_gpu(kind, use_gpu)
    start = time.perf_counter()
    if kind == "flat":
        index = faiss.IndexFlatIP(dim)
        if gpu:
            index = _to_gpu(index)
        _add(index, passage_emb)
    elif kind == "hnsw":
        index = faiss.IndexHNSWFlat(dim, hnsw_m, faiss.METRIC_INNER_PRODUCT)
        index.hnsw.efConstruction = ef_construction
        index.hnsw.efSearch = ef_search
        _add(index, passage_emb)
    else:
        if n == 0:
            raise ValueError("an ivf index needs at least one passage to train on")
        lists = default_nlist(n) if nlist is None else min(max(1, int(nlist)), n)
        if nlist is not None and lists != nlist:
            log.warning("ivf: nlist=%d clamped to %d for %d passages", nlist, lists, n)
        quantizer = faiss.IndexFlatIP(dim)
        index = faiss.IndexIVFFlat(quantizer, dim, lists, faiss.METRIC_INNER_PRODUCT)
        index.nprobe = max(1, min(int(nprobe), lists))  # copied by the GPU cloner
        if gpu:
            index = _to_gpu(index)  # untrained: k-means then runs on the GPU
        n_train = min(n, 256 * lists)
        if n_train < n:
            rows = np.sort(np.random.default_rng(0).choice(n, size=n_train, replace=False))
            train = np.ascontiguousarray(passage_emb[rows], dtype=np.float32)
        else:
            train = np.ascontiguousarray(passage_emb, dtype=np.float32)
        index.train(train)
        del train
        _add(index, passage_emb)
    log.info("built %s FAISS index over %d × %d passages%s in %.1fs", kind, n, dim, " on GPU" if gpu else "",
             time.perf_counter() - start)
    return index


def search_index(index, query_emb: np.ndarray, k: int, query_batch_size: int = 4096) -> tuple[np.ndarray, np.ndarray]:
    """Search a :func:`build_index` index → (scores float32 [Q, k], row ids int64 [Q, k]), best first per
    row; missing hits have id -1. Queries go ``query_batch_size`` at a time; an HNSW index is searched with
    efSearch = max(its efSearch, k) (FAISS would otherwise return at most ~efSearch good hits)."""
    import faiss

    queries = np.ascontiguousarray(query_emb, dtype=np.float32)
    params = None
    if hasattr(index, "hnsw"):
        params = faiss.SearchParametersHNSW(efSearch=max(index.hnsw.efSearch, k))
    parts = [index.search(queries[q : q + query_batch_size], k, params=params)
             for q in range(0, len(queries), query_batch_size)]
    if not parts:
        return np.empty((0, k), dtype=np.float32), np.empty((0, k), dtype=np.int64)
    return np.concatenate([d for d, _ in parts]), np.concatenate([i for _, i in parts])


def search(query_emb: np.ndarray, passage_emb: np.ndarray, query_ids: list[str], passage_ids: list[str],
           k: int = 1000, index_kind: str = "flat", shard_size: int | None = None, query_batch_size: int = 4096,
           **index_kw) -> Run:
    """Top-``k`` passages per query by inner product: {query id → {passage id → score}}, best first.

    ``query_emb`` [Q, H], ``passage_emb`` [N, H] (array or memmap, any float dtype); ``query_ids`` /
    ``passage_ids`` name their rows. Scores are Python floats; ``k > N`` returns all N passages (fewer
    when an approximate index finds fewer). ``index_kind`` and ``**index_kw`` (``hnsw_m``, ``nprobe``,
    ``use_gpu``, ...) go to :func:`build_index`.

    ``shard_size`` (passages per shard; None = one index): builds one index per contiguous shard, in
    turn, searches it and merges its top-k into the running global top-k, so peak memory is one shard's
    index (+ Q·k·12 bytes of results). Exact for ``flat`` (equal to the unsharded run, ties at the k-th
    score included: :func:`multipos.topk.shard_topk`); for hnsw/ivf every shard is its own approximate
    index. Queries are searched ``query_batch_size`` at a time (:func:`search_index`; HNSW with efSearch ≥ k).
    Equal scores are ordered by passage row (:func:`multipos.topk.merge_topk`). Shards written to disk by
    several processes: :mod:`multipos.shards`. Raises ValueError on mismatched ids/rows or k < 1.
    """
    if len(query_ids) != len(query_emb) or len(passage_ids) != len(passage_emb):
        raise ValueError(f"{len(query_ids)} query ids for {len(query_emb)} query rows, "
                         f"{len(passage_ids)} passage ids for {len(passage_emb)} passage rows")
    if k < 1:
        raise ValueError(f"k must be ≥ 1; got {k}")
    if index_kind not in INDEX_KINDS:  # fail before any work
        raise ValueError(f"unknown FAISS index kind {index_kind!r} (config key eval.index); allowed: {', '.join(INDEX_KINDS)}")
    from multipos.topk import index_topk, merge_topk

    n = len(passage_ids)
    if n == 0 or len(query_ids) == 0:
        return {qid: {} for qid in query_ids}
    queries = np.ascontiguousarray(query_emb, dtype=np.float32)
    size = n if shard_size is None else int(shard_size)
    if size < 1:
        raise ValueError(f"shard_size must be ≥ 1; got {shard_size}")
    k_all = min(k, n)
    scores = np.empty((len(queries), 0), dtype=np.float32)
    ids = np.empty((len(queries), 0), dtype=np.int64)
    n_shards = math.ceil(n / size)
    bar = tqdm(range(0, n, size), desc="FAISS search over shards", unit="shard", disable=None if n_shards > 1 else True)
    for s, lo in enumerate(bar):  # progress bar on a terminal, for sharded (large) corpora
        hi = min(lo + size, n)
        if n_shards > 1:
            log.info("FAISS shard %d/%d: passages %d–%d", s + 1, n_shards, lo, hi)
        d, i = index_topk(passage_emb[lo:hi], queries, k, index_kind, query_batch_size, **index_kw)
        # best first; equal scores by corpus row, also at the k-th score (flat shards are tie-complete)
        scores, ids = merge_topk([scores, d], [ids, np.where(i >= 0, i + lo, -1)], k_all)
    scores, ids = scores.tolist(), ids.tolist()
    return {qid: {passage_ids[j]: s for j, s in zip(ids[r], scores[r]) if j >= 0} for r, qid in enumerate(query_ids)}
