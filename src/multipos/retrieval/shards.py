"""Large-corpus retrieval: corpus embeddings encoded in contiguous shards across processes, written as
memory-mapped ``.npy`` files, and exact top-k searched shard by shard and merged.

Layout of a shard folder (written by :func:`encode_shards`, read by :class:`ShardedEmbeddings`)::

    manifest.json          {"format", "count", "dim", "dtype", "kind", "model", "max_length", "bf16",
                            "shards": [{"file", "ids", "start", "stop"}, ...]}
    shard-00000.npy        embeddings of corpus rows [start, stop), float32 or float16 [stop − start, dim]
    shard-00000.ids.json   the passage ids of those rows, in corpus order

Every file is written under a temporary name and renamed when complete (:mod:`multipos.atomic`), so a
shard file that exists is whole. Under ``torch.distributed`` (gloo on CPU, nccl on GPU; e.g. ``torchrun``)
rank r encodes shards r, r + world, r + 2·world, … and never holds more than one shard's embeddings
(the ``.npy`` is filled batch by batch through ``np.lib.format.open_memmap``); rank 0 writes the manifest
after a barrier. Without a process group, ``rank`` / ``world_size`` can be passed by hand (one job of a
SLURM array per rank).

Exact search (:func:`search_shards`, :func:`distributed_search`): each shard is searched with a FAISS
``IndexFlatIP`` for its tie-complete top-k and the candidates are merged by (score descending, corpus row
ascending) (:mod:`multipos.retrieval.topk`), so the run is the same — ids and scores — whatever the number of shards or
processes, ties included.
"""

from __future__ import annotations

import json
import logging
import math
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from multipos import atomic
from multipos.formats.types import Run
from multipos.retrieval.dense import index_topk
from multipos.retrieval.topk import merge_topk

log = logging.getLogger(__name__)

FORMAT = "multipos-shards/1"
MANIFEST = "manifest.json"
DTYPES = ("float32", "float16")
#: Rows encoded per call of :func:`multipos.retrieval.encoding.encode` (bounds the float32 buffer for float16 shards).
ENCODE_CHUNK = 1 << 16


def shard_bounds(count: int, num_shards: int) -> list[tuple[int, int]]:
    """Contiguous row ranges ``[(start, stop), ...]`` splitting ``count`` rows into ``num_shards`` shards whose
    sizes differ by at most one (the first ``count % num_shards`` shards get the extra row).

    Raises ValueError for ``num_shards`` < 1 or ``count`` < 0.
    """
    if num_shards < 1 or count < 0:
        raise ValueError(f"need num_shards ≥ 1 and count ≥ 0; got num_shards={num_shards}, count={count}")
    base, extra = divmod(count, num_shards)
    bounds, start = [], 0
    for s in range(num_shards):
        stop = start + base + (s < extra)
        bounds.append((start, stop))
        start = stop
    return bounds


def _dist():
    """``torch.distributed`` when a process group is initialised, else None."""
    import torch.distributed as dist

    return dist if dist.is_available() and dist.is_initialized() else None


def _write_npy(path: Path, shape: tuple[int, int], dtype: str, fill) -> None:
    """Create ``path`` as an ``.npy`` memmap of ``shape``/``dtype`` under a temporary name, let ``fill(array)``
    write it, flush it and rename it into place; on any exception the temporary file is removed."""
    from multipos.retrieval.encoding import _preallocate

    tmp = atomic.temp_path(path)
    try:
        out = np.lib.format.open_memmap(tmp, mode="w+", dtype=np.dtype(dtype), shape=shape)
        _preallocate(tmp)
        fill(out)
        out.flush()  # msync before the rename makes it a shard
        del out
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def _entry(s: int, start: int, stop: int) -> dict:
    name = f"shard-{s:05d}"
    return {"file": f"{name}.npy", "ids": f"{name}.ids.json", "start": start, "stop": stop}


def _write_shard(folder: Path, entry: dict, ids: list[str], dim: int, dtype: str, fill) -> None:
    """Shard ``entry``'s ``.npy`` (filled by ``fill(memmap)``) and its ids file, each written atomically."""
    _write_npy(folder / entry["file"], (entry["stop"] - entry["start"], dim), dtype, fill)
    atomic.write_json(folder / entry["ids"], ids[entry["start"] : entry["stop"]], indent=None)


def _write_manifest(folder: Path, count: int, dim: int, dtype: str, entries: list[dict], **meta) -> Path:
    return atomic.write_json(folder / MANIFEST, {"format": FORMAT, "count": count, "dim": dim, "dtype": dtype,
                                                 **meta, "shards": entries})


def _check_corpus(ids: list[str], rows: int, dtype: str) -> None:
    if len(ids) != rows:
        raise ValueError(f"{len(ids)} passage ids for {rows} corpus rows")
    if len(set(ids)) != len(ids):
        raise ValueError("duplicate passage ids in the corpus")
    if dtype not in DTYPES:
        raise ValueError(f"shard dtype must be one of {DTYPES}; got {dtype!r}")


def encode_shards(model, ids: list[str], texts: list[str], folder: str | os.PathLike, *, num_shards: int | None = None,
                  rank: int | None = None, world_size: int | None = None, kind: str = "passage",
                  max_length: int | None = None, batch_size: int = 64, bf16: bool | None = None,
                  dtype: str = "float32", progress: bool = False) -> Path:
    """Encode this process's shards of a corpus into ``folder`` and (rank 0) its manifest → manifest path.

    Args:
        model: a :class:`multipos.model.encoder.DualEncoder` (on the device this rank uses).
        ids, texts: the whole corpus, in order (every rank passes the same lists; only the rows of its shards
            are encoded).
        num_shards: shards in all (default: the world size); rank r encodes shards r, r + world, ….
        rank, world_size: default from the initialised ``torch.distributed`` group, else 0 and 1.
        kind, max_length, batch_size, bf16: as :func:`multipos.retrieval.encoding.encode` (``bf16=None``: where native);
            the model encodes on the device it is on.
        dtype: ``float32`` or ``float16`` on disk (float16 halves disk and page cache; search copies rows to
            float32 in chunks, so scores then differ from a float32 run by the fp16 rounding, ~1e-3 relative).

    Peak memory per process: the model, one batch and (float16 only) a float32 buffer of
    :data:`ENCODE_CHUNK` × dim; embeddings go straight to the memory-mapped file. With a process group
    the call ends with a barrier after the manifest is written, so every rank can read the folder.

    Raises ValueError for mismatched ids/texts, duplicate ids, an unknown dtype or a rank outside the world.
    """
    from multipos.retrieval.encoding import encode, native_bf16

    _check_corpus(ids, len(texts), dtype)
    bf16 = native_bf16() if bf16 is None else bool(bf16)
    dist = _dist()
    rank = (dist.get_rank() if dist else 0) if rank is None else int(rank)
    world_size = (dist.get_world_size() if dist else 1) if world_size is None else int(world_size)
    if not 0 <= rank < world_size:
        raise ValueError(f"encode_shards: rank {rank} outside world size {world_size}")
    entries = [_entry(s, a, b) for s, (a, b) in enumerate(shard_bounds(len(ids), num_shards or world_size))]
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    kw = dict(kind=kind, max_length=max_length, batch_size=batch_size, bf16=bf16, progress=progress, device=None)
    for s in range(rank, len(entries), world_size):
        start, stop = entries[s]["start"], entries[s]["stop"]
        log.info("rank %d/%d: encoding shard %d/%d (rows %d–%d) into %s", rank, world_size, s + 1, len(entries),
                 start, stop, folder / entries[s]["file"])

        def fill(out, start=start, stop=stop):
            for lo in range(start, stop, ENCODE_CHUNK):
                hi = min(lo + ENCODE_CHUNK, stop)
                part = out[lo - start : hi - start]
                if dtype == "float32":
                    encode(model, texts[lo:hi], out=part, **kw)
                else:
                    part[:] = encode(model, texts[lo:hi], **kw)

        _write_shard(folder, entries[s], ids, model.hidden_size, dtype, fill)
    if dist:
        dist.barrier()
    if rank == 0:
        _write_manifest(folder, len(ids), model.hidden_size, dtype, entries, kind=kind, model=model.fingerprint(),
                        max_length=max_length, bf16=bf16)
    if dist:
        dist.barrier()
    return folder / MANIFEST


def save_shards(emb: np.ndarray, ids: list[str], folder: str | os.PathLike, num_shards: int,
                dtype: str = "float32") -> Path:
    """Write embeddings computed already (``emb`` [N, dim], array or memmap, e.g. a
    :func:`multipos.retrieval.encoding.cached_encode` file) as ``num_shards`` shards plus manifest, in this process →
    manifest path. Rows are copied shard by shard. Raises ValueError as :func:`encode_shards`."""
    _check_corpus(ids, len(emb), dtype)
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    entries = [_entry(s, a, b) for s, (a, b) in enumerate(shard_bounds(len(ids), num_shards))]
    for e in entries:
        def fill(out, e=e):
            out[:] = emb[e["start"] : e["stop"]]

        _write_shard(folder, e, ids, emb.shape[1], dtype, fill)
    return _write_manifest(folder, len(ids), int(emb.shape[1]), dtype, entries)


@dataclass
class ShardedEmbeddings:
    """A shard folder written by :func:`encode_shards`, opened read-only.

    ``count`` rows of ``dim`` values (``dtype`` on disk) in ``len(shards)`` contiguous shards; ``shards[i]``
    is ``{"file", "ids", "start", "stop"}``. Embeddings are memory-mapped one shard at a time
    (:meth:`embeddings`), ids read per shard (:meth:`ids`).
    """

    folder: Path
    count: int
    dim: int
    dtype: str
    shards: list[dict]
    meta: dict

    @classmethod
    def open(cls, folder: str | os.PathLike) -> "ShardedEmbeddings":
        """Read and check ``folder/manifest.json``: format, dtype, and shard ranges that are contiguous from 0
        to ``count``. Shard files are checked when used. Raises FileNotFoundError without a manifest and
        ValueError naming the manifest and field for anything inconsistent."""
        folder = Path(folder)
        path = folder / MANIFEST
        if not path.is_file():
            raise FileNotFoundError(f"{path}: no shard manifest "
                                    "(encode the corpus with multipos.retrieval.shards.encode_shards)")
        meta = json.loads(path.read_text())
        if meta.get("format") != FORMAT:
            raise ValueError(f"{path}: field 'format' is {meta.get('format')!r}, expected {FORMAT!r}")
        if meta.get("dtype") not in DTYPES:
            raise ValueError(f"{path}: field 'dtype' is {meta.get('dtype')!r}; allowed: {', '.join(DTYPES)}")
        shards, expect = meta.get("shards") or [], 0
        for i, s in enumerate(shards):
            if s.get("start") != expect or not isinstance(s.get("stop"), int) or s["stop"] < s["start"]:
                raise ValueError(f"{path}: shards[{i}] covers rows {s.get('start')}–{s.get('stop')}; expected a "
                                 f"range starting at row {expect}")
            expect = s["stop"]
        if expect != meta.get("count"):
            raise ValueError(f"{path}: shards cover {expect} rows but field 'count' is {meta.get('count')}")
        return cls(folder, int(meta["count"]), int(meta["dim"]), meta["dtype"], shards, meta)

    def embeddings(self, i: int) -> np.ndarray:
        """Shard ``i``'s embeddings, memory-mapped read-only: [stop − start, dim] of ``dtype``.

        Raises FileNotFoundError for a missing shard file (not encoded yet, or its rank failed) and ValueError
        when its shape or dtype differs from the manifest."""
        s = self.shards[i]
        path = self.folder / s["file"]
        if not path.is_file():
            raise FileNotFoundError(f"{path}: shard {i} of {self.folder / MANIFEST} is missing (its rank has not "
                                    "finished or failed)")
        emb = np.load(path, mmap_mode="r")
        shape = (s["stop"] - s["start"], self.dim)
        if tuple(emb.shape) != shape or emb.dtype != np.dtype(self.dtype):
            raise ValueError(f"{path}: {emb.dtype} {tuple(emb.shape)}, but {self.folder / MANIFEST} says "
                             f"{self.dtype} {shape}")
        return emb

    def ids(self, i: int) -> list[str]:
        """Passage ids of shard ``i``'s rows. Raises ValueError when their number differs from the manifest."""
        s = self.shards[i]
        path = self.folder / s["ids"]
        ids = json.loads(path.read_text())
        if len(ids) != s["stop"] - s["start"]:
            raise ValueError(f"{path}: {len(ids)} ids for rows {s['start']}–{s['stop']} of {self.folder / MANIFEST}")
        return ids


def _search_shard(store: ShardedEmbeddings, s: int, queries: np.ndarray, k: int, index_kind: str, index_kw: dict):
    """Candidates of shard ``s``: (scores, global rows, {row: id}) for every query."""
    start = store.shards[s]["start"]
    d, i = index_topk(store.embeddings(s), queries, k, index_kind, **index_kw)
    ids = store.ids(s)
    names = {int(r) + start: ids[r] for r in np.unique(i) if r >= 0}
    return d, np.where(i >= 0, i + start, -1), names


def _to_run(query_ids: list[str], scores: np.ndarray, rows: np.ndarray, names: dict[int, str]) -> Run:
    scores, rows = scores.tolist(), rows.tolist()
    return {q: {names[r]: s for r, s in zip(rows[j], scores[j]) if r >= 0} for j, q in enumerate(query_ids)}


def _check(query_emb, query_ids, store: ShardedEmbeddings, k: int) -> np.ndarray:
    if len(query_ids) != len(query_emb):
        raise ValueError(f"{len(query_ids)} query ids for {len(query_emb)} query rows")
    if k < 1:
        raise ValueError(f"k must be ≥ 1; got {k}")
    queries = np.ascontiguousarray(query_emb, dtype=np.float32)
    if queries.ndim != 2 or queries.shape[1] != store.dim:
        raise ValueError(f"query embeddings {queries.shape} do not match the corpus dim {store.dim} "
                         f"({store.folder / MANIFEST})")
    return queries


def search_shards(query_emb: np.ndarray, store: ShardedEmbeddings, query_ids: list[str], k: int = 1000,
                  index_kind: str = "flat", **index_kw) -> Run:
    """Top-``k`` passages per query over every shard of ``store``, in this process: {query id → {passage id →
    score}}, best first (equal scores by corpus row).

    ``query_emb`` [Q, dim] float. Shards are indexed and searched one at a time and merged into a running
    top-k, so peak memory is one shard's index plus Q·k·12 bytes. ``index_kind="flat"`` is exact and gives
    the same run whatever the sharding; ``hnsw`` / ``ivf`` (``**index_kw`` as
    :func:`multipos.retrieval.dense.build_index`) make every shard its own approximate index.
    Raises ValueError for mismatched ids/rows, a wrong dim or k < 1.
    """
    queries = _check(query_emb, query_ids, store, k)
    scores = np.empty((len(queries), 0), np.float32)
    rows = np.empty((len(queries), 0), np.int64)
    names: dict[int, str] = {}
    for s in range(len(store.shards)):
        d, i, found = _search_shard(store, s, queries, k, index_kind, index_kw)
        scores, rows = merge_topk([scores, d], [rows, i], k)
        kept = set(np.unique(rows).tolist())
        names = {r: n for r, n in {**names, **found}.items() if r in kept}
    return _to_run(query_ids, scores, rows, names)


def distributed_search(query_emb: np.ndarray, store: ShardedEmbeddings, query_ids: list[str], k: int = 1000,
                       index_kind: str = "flat", **index_kw) -> Run | None:
    """:func:`search_shards` with the shards split over the ``torch.distributed`` ranks (rank r searches shards
    r, r + world, …); candidates are gathered on rank 0, which merges them and returns the run. Other ranks
    return None. Every rank must pass the same query embeddings. Without a process group this is
    :func:`search_shards`. Each rank sends at most Q × k' candidates (12 bytes each, plus their ids; k' > k
    only where ties straddle the k-th score).
    """
    dist = _dist()
    if dist is None:
        return search_shards(query_emb, store, query_ids, k, index_kind, **index_kw)
    queries = _check(query_emb, query_ids, store, k)
    rank, world = dist.get_rank(), dist.get_world_size()
    parts = [_search_shard(store, s, queries, k, index_kind, index_kw) for s in range(rank, len(store.shards), world)]
    if len(parts) > 1:  # this rank's shards merged first: it sends Q × k candidates, not Q × k per shard
        d, i = merge_topk([p[0] for p in parts], [p[1] for p in parts], k)
        kept = set(np.unique(i).tolist())
        parts = [(d, i, {r: n for p in parts for r, n in p[2].items() if r in kept})]
    gathered = [None] * world if rank == 0 else None
    dist.gather_object(parts, gathered, dst=0)
    if rank != 0:
        return None
    parts = [p for ranked in gathered for p in ranked]
    if not parts:
        return {q: {} for q in query_ids}
    scores, rows = merge_topk([p[0] for p in parts], [p[1] for p in parts], k)
    names = {r: n for p in parts for r, n in p[2].items()}
    return _to_run(query_ids, scores, rows, names)


def shards_for_memory(count: int, dim: int, budget_bytes: float, bytes_per_value: int = 4) -> int:
    """Fewest equal shards whose flat index (count/shards × dim × ``bytes_per_value`` bytes) fits in
    ``budget_bytes`` (e.g. a GPU's free memory minus the search workspace): ⌈count·dim·b / budget⌉.
    8.8M × 768 float32 (27 GB) in a 16 GB budget → 2 shards; 21M × 768 (64.5 GB) → 5."""
    if budget_bytes <= 0:
        raise ValueError(f"budget_bytes must be > 0; got {budget_bytes}")
    return max(1, math.ceil(count * dim * bytes_per_value / budget_bytes))
