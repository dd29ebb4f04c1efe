"""Every corpus passage a candidate: exact full-corpus objectives in bounded memory (query-side fine-tuning).

With ``passages.candidates=corpus`` the candidate pool of query i is the whole corpus: D+_i its training positives
(as the regime, M and first/random-M select them) and D−_i every passage not judged for it. The objectives of
:mod:`multipos.losses` stay what they are, functions of a score matrix and two masks; what changes is the matrix
they are given. Every objective sees the negatives only through

* a log-sum-exp over D− (or over D+ ∪ D−, which is ``logaddexp`` of the one over D+ and the one over D−), or
* the highest negative score (:data:`multipos.losses.HARDEST_NEGATIVE`: the LSEPair ``maxn`` variants),

so the [B, N] corpus matrix can be replaced **exactly** by a [B, P + 1] matrix: the P ≤ M positive scores and one
column holding that summary of the negatives (``lse_n s_n`` or ``max_n s_n``), marked as the only negative. The
summary is computed over the corpus in chunks of ``chunk_size`` rows (online log-sum-exp), so memory is
O(B × chunk_size) whatever N is, and its gradient with respect to the query embedding is exact:

    ∂/∂q  log Σ_{n∈D−} exp(q·e_n / τ)  =  Σ_n softmax_n · e_n / τ

(the softmax-weighted mean of the negative embeddings, accumulated in the same pass). The passage embeddings are
frozen, so nothing flows to them. :func:`full_corpus_scores` is the unchunked reference (the [B, N] matrix and its
masks), used by the tests to check loss and gradients of every objective against this path.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Sequence

import torch
from torch import Tensor

from multipos.losses import _NEG
from multipos.model.transfer import to_device

log = logging.getLogger(__name__)

SUMMARIES = ("lse", "max")
#: Rows a chunk holds where nothing says how many fit (a CPU, or ``passages.chunk_size`` given as a number).
DEFAULT_CHUNK_SIZE = 65536
#: Share of the device's free memory one chunk's working set may take (the rest: the optimizer step, autograd).
FREE_MEMORY_SHARE = 0.5


def chunk_bytes_per_row(batch: int, dim: int) -> int:
    """Device bytes one corpus row costs inside a chunk of :func:`negative_summary` (``lse``, float32): four float32
    values per query (its score, the masked score, the shifted score and the exp-weight: 16 bytes × ``batch``), its
    judged-mask entry per query (1 byte × ``batch``) and its embedding cast to float32 (4 bytes × ``dim``)."""
    return batch * (4 * 4 + 1) + 4 * dim


def auto_chunk_size(batch: int, rows: int, dim: int, device: torch.device, free_bytes: int | None = None) -> int:
    """The chunk size ``passages.chunk_size=auto`` picks: on a CUDA device the most rows whose working set
    (:func:`chunk_bytes_per_row`) fits in :data:`FREE_MEMORY_SHARE` of its free memory (``free_bytes``, default
    :func:`torch.cuda.mem_get_info`), ``rows`` (the whole corpus, one chunk) where it all fits; elsewhere
    :data:`DEFAULT_CHUNK_SIZE` (host memory is not the limit a chunk is sized against). At least 1,024 rows (or
    ``rows`` when fewer). Raises ValueError for ``batch``, ``rows`` or ``dim`` < 1."""
    if min(batch, rows, dim) < 1:
        raise ValueError(f"auto_chunk_size: batch, rows and dim must be >= 1, got {batch}, {rows}, {dim}")
    if device.type != "cuda" and free_bytes is None:
        return min(DEFAULT_CHUNK_SIZE, rows)
    if free_bytes is None:
        free_bytes = torch.cuda.mem_get_info(device)[0]
    fit = int(FREE_MEMORY_SHARE * free_bytes) // chunk_bytes_per_row(batch, dim)
    return min(rows, max(fit, 1024))


def chunk_size_setting(setting: int | str | None) -> int | None:
    """``passages.chunk_size`` checked: its number of rows, or None for ``auto`` (or null). Raises ValueError for a
    number < 1 or any other string."""
    if setting in (None, "auto"):
        return None
    if isinstance(setting, str) and not setting.isdigit():
        raise ValueError(f"passages.chunk_size must be a number of rows >= 1 or auto, got {setting!r}")
    if int(setting) < 1:
        raise ValueError(f"passages.chunk_size must be >= 1, got {setting}")
    return int(setting)


def resolve_chunk_size(setting: int | str | None, batch: int, rows: int, dim: int, device: torch.device) -> int:
    """``passages.chunk_size`` as rows: a number as it is, ``auto`` (or null) through :func:`auto_chunk_size`, the
    choice logged with what it was made from. Raises what :func:`chunk_size_setting` raises."""
    size = chunk_size_setting(setting)
    if size is not None:
        return size
    free = torch.cuda.mem_get_info(device)[0] if device.type == "cuda" else None
    size = auto_chunk_size(batch, rows, dim, device, free_bytes=free)
    log.info("passages.chunk_size=auto: %d corpus rows a chunk (%s of %d rows; B=%d, dim %d, %s%s)", size,
             "one chunk" if size >= rows else f"{-(-rows // size)} chunks", rows, batch, dim, device.type,
             f", {free / 1e9:.1f} GB free" if free is not None else "")
    return size


@dataclass
class CorpusTargets:
    """Positives and judged passages of a batch's queries as corpus rows.

    positive_rows: [B, P] int64, each query's positives (padded with 0 where ``positive_valid`` is False);
    positive_valid: [B, P] bool; judged: [K, 2] int64 (query row, corpus row) pairs excluded from the negatives —
    every passage judged for the query, whatever its grade, its positives included.
    """

    positive_rows: Tensor
    positive_valid: Tensor
    judged: Tensor

    def to(self, device) -> "CorpusTargets":
        """The same targets on ``device`` (to a CUDA device without a host wait,
        :func:`multipos.model.transfer.to_device`)."""
        return CorpusTargets(*(to_device(t, device) for t in (self.positive_rows, self.positive_valid, self.judged)))


def corpus_targets(positives: Sequence[Sequence[str]], judged: Sequence[set[str]],
                   row: dict[str, int]) -> CorpusTargets:
    """Build :class:`CorpusTargets` from per-query positive ids (in order) and judged ids.

    Judged ids outside the corpus are skipped (they cannot be candidates). Raises ValueError naming the query row
    and the passage for a positive that is not in the corpus, or for a query without positives.
    """
    width = max((len(p) for p in positives), default=0)
    rows = torch.zeros(len(positives), max(width, 1), dtype=torch.long)
    valid = torch.zeros(len(positives), max(width, 1), dtype=torch.bool)
    pairs: list[tuple[int, int]] = []
    for i, (pos, jud) in enumerate(zip(positives, judged)):
        if not pos:
            raise ValueError(f"corpus candidates: query row {i} has no positive")
        for j, pid in enumerate(pos):
            if pid not in row:
                raise ValueError(f"corpus candidates: positive {pid!r} of query row {i} is not in the corpus")
            rows[i, j], valid[i, j] = row[pid], True
        pairs += [(i, row[p]) for p in set(jud) | set(pos) if p in row]
    judged_t = torch.tensor(sorted(pairs), dtype=torch.long).reshape(-1, 2)
    return CorpusTargets(rows, valid, judged_t)


def _chunk_mask(judged: Tensor, lo: int, hi: int, shape: tuple[int, int], device) -> Tensor:
    """bool [B, hi − lo]: True where the (query, row) pair is judged (excluded from the negatives).

    Fixed shapes only, so nothing is read back from the device: every judged pair is written, those outside the
    chunk into one extra column that is then dropped (a boolean selection of the pairs would make the host wait for
    the device once per chunk)."""
    b, width = shape
    mask = torch.zeros(b, width + 1, dtype=torch.bool, device=device)
    if judged.numel():
        inside = (judged[:, 1] >= lo) & (judged[:, 1] < hi)
        # a tensor value on the device: ``mask[i, j] = True`` would copy the Python scalar from pageable host memory
        # to a CUDA device, a host wait per chunk (seen by tests/test_cuda.py on an H200, 2026-11-27)
        mask.index_put_((judged[:, 0], torch.where(inside, judged[:, 1] - lo, width)),
                        torch.ones((), dtype=torch.bool, device=device))
    return mask[:, :width]


#: How the chunk loop multiplies the queries with a bf16 / fp16 index: ``cast`` (each chunk cast to float32, then one
#: float32 matmul: exact; the training default) or ``split`` (:func:`split_product`, no cast of the index; #68, to be
#: measured against ``cast`` on a GPU by ``bench/bench_paper_scale.py`` before it may become the default).
PRODUCTS = ("cast", "split")


def split_product_applies(a: Tensor, b: Tensor) -> bool:
    """Whether :func:`split_product` of ``a`` with a low-precision ``b`` runs as matmuls in ``b``'s dtype with
    float32 output (``torch.mm(..., out_dtype=torch.float32)``: CUDA, a float32 ``a``, a bf16 / fp16 ``b``)."""
    return a.device.type == "cuda" and a.dtype == torch.float32 and b.dtype in (torch.bfloat16, torch.float16)


def split_product(a: Tensor, b: Tensor) -> Tensor:
    """``a @ b`` [M, N] for ``a`` [M, K] in a wide float dtype and ``b`` [K, N] stored narrower, in ``a``'s dtype,
    without casting ``b`` where the device allows (:func:`split_product_applies`): ``a`` is split in two halves of
    ``b``'s dtype, ``hi = a`` rounded to it and ``lo = a − hi`` rounded to it, and ``a @ b ≈ hi @ b + lo @ b`` (#68).
    A product of two bf16 (or two float32) numbers is exact in the wider accumulator, so the error left is that of
    ``a − hi − lo``: about 2⁻¹⁶ of ``a`` for bf16 halves (2⁻²² fp16, 2⁻⁴⁸ float32 halves of float64), where rounding
    ``a`` to bf16 once leaves 2⁻⁸ (q·e / τ moved by up to about 0.05 at τ = 0.05, :func:`corpus_scores`).

    Where no matmul with a wider output exists (a CPU, a float64 ``a``) the same two products run on ``b`` cast to
    ``a``'s dtype: the same numbers, for the tests. Same dtypes: ``a @ b``.
    """
    if b.dtype == a.dtype:
        return a @ b
    hi = a.to(b.dtype)
    lo = (a - hi.to(a.dtype)).to(b.dtype)
    if split_product_applies(a, b):
        return torch.mm(hi, b, out_dtype=a.dtype) + torch.mm(lo, b, out_dtype=a.dtype)
    wide = b.to(a.dtype)
    return hi.to(a.dtype) @ wide + lo.to(a.dtype) @ wide


def _product(a: Tensor, b: Tensor, product: str) -> Tensor:
    """``a @ b`` in ``a``'s dtype as :data:`PRODUCTS` names: ``cast`` (``b`` cast) or ``split``."""
    return split_product(a, b) if product == "split" else a @ b.to(a.dtype)


@torch.no_grad()
def _stream_negatives(q: Tensor, passages: Tensor, temperature: float, judged: Tensor, chunk_size: int,
                      summary: str, product: str = "cast") -> tuple[Tensor, Tensor]:
    """One pass over the corpus in chunks → (value [B], direction [B, H]) of the negatives' summary.

    ``lse``: value = log Σ_{n∈D−} exp(s_n), direction = Σ_n softmax_n e_n (online log-sum-exp with rescaling).
    ``max``: value = max_n s_n, direction = e_argmax. Rows without a negative: value ``_NEG``, direction 0.
    Computed in ``q``'s dtype (float32 at least); ``product`` (:data:`PRODUCTS`): how a narrower index is multiplied.
    """
    dtype = q.dtype
    b, n = q.shape[0], passages.shape[0]
    run_max = torch.full((b,), float("-inf"), dtype=dtype, device=q.device)
    run_sum = torch.zeros(b, dtype=dtype, device=q.device)
    direction = torch.zeros(b, passages.shape[1], dtype=dtype, device=q.device)
    for lo in range(0, n, chunk_size):
        hi = min(lo + chunk_size, n)
        e = passages[lo:hi] if product == "split" else passages[lo:hi].to(dtype)
        s = _product(q, e.T, product) / temperature  # [B, C]
        s = s.masked_fill(_chunk_mask(judged, lo, hi, s.shape, q.device), float("-inf"))
        c_max, c_arg = s.max(dim=1)
        if summary == "max":
            better = c_max > run_max
            run_max = torch.where(better, c_max, run_max)
            direction = torch.where(better[:, None], e[c_arg].to(dtype), direction)
            continue
        new_max = torch.maximum(run_max, c_max)
        safe = torch.where(torch.isfinite(new_max), new_max, torch.zeros_like(new_max))
        scale = torch.exp(run_max - safe)  # 0 where run_max is −inf
        w = torch.exp(s - safe[:, None])  # [B, C], 0 at excluded columns
        run_sum = run_sum * scale + w.sum(1)
        direction = direction * scale[:, None] + _product(w, e, product)
        run_max = new_max
    empty = ~torch.isfinite(run_max)
    if summary == "max":
        value = run_max
    else:
        value = run_max + torch.log(run_sum.clamp(min=torch.finfo(dtype).tiny))
        direction = direction / run_sum.clamp(min=torch.finfo(dtype).tiny)[:, None]
    return value.masked_fill(empty, _NEG), direction.masked_fill(empty[:, None], 0.0)


def negative_summary(q: Tensor, passages: Tensor, temperature: float, judged: Tensor, chunk_size: int,
                     summary: str = "lse", product: str = "cast") -> Tensor:
    """The negatives of each query summarised in one differentiable score [B] (module docstring).

    Args:
        q: query embeddings [B, H] (with gradient).
        passages: the frozen corpus embeddings [N, H] (any float dtype; no gradient).
        temperature: τ > 0, scores are q·e / τ.
        judged: [K, 2] (query row, corpus row) pairs that are not negatives (:class:`CorpusTargets`).
        chunk_size: corpus rows scored at a time (memory O(B × chunk_size)).
        summary: ``lse`` (log Σ_{n∈D−} exp s_n) or ``max`` (max_n s_n).
        product: how the chunks of a narrower index are multiplied (:data:`PRODUCTS`; ``cast``, exact, or ``split``).

    Returns [B] in ``q``'s dtype (at least float32): the exact value, and the exact gradient with respect to ``q``
    (softmax-weighted mean of the negatives / τ for ``lse``, the hardest negative / τ for ``max``).

    Raises ValueError for an unknown ``summary`` or ``product``, or ``chunk_size`` < 1.
    """
    if product not in PRODUCTS:
        raise ValueError(f"unknown index product {product!r}; allowed: {', '.join(PRODUCTS)}")
    if summary not in SUMMARIES:
        raise ValueError(f"unknown negative summary {summary!r}; allowed: {', '.join(SUMMARIES)}")
    if int(chunk_size) < 1:
        raise ValueError(f"passages.chunk_size must be >= 1, got {chunk_size}")
    qc = q.to(torch.promote_types(q.dtype, torch.float32))
    value, direction = _stream_negatives(qc.detach(), passages, temperature, judged, int(chunk_size), summary,
                                         product)
    linear = (qc * direction).sum(-1) / temperature  # gradient direction/τ; its value is replaced by ``value``
    return value + linear - linear.detach()


def corpus_scores(q: Tensor, passages: Tensor, temperature: float, targets: CorpusTargets, chunk_size: int,
                  summary: str = "lse", product: str = "cast") -> tuple[Tensor, Tensor, Tensor]:
    """The exact reduced problem of the whole corpus → (scores [B, P + 1], positive_mask, negative_mask).

    Columns 0..P−1 are each query's positives (q·e_p / τ, with gradient; padding columns are in neither mask),
    column P the negatives' summary (:func:`negative_summary`), the only negative column. Any objective of
    :mod:`multipos.losses` on these three gives the loss and the query gradient of the same objective on the
    [B, N] corpus matrix of :func:`full_corpus_scores` (with ``summary="max"`` for
    :data:`multipos.losses.HARDEST_NEGATIVE`, else ``"lse"``).

    Computed in float32 at least, also under autocast (bf16-mixed training): there a bf16 matmul would round each
    score q·e (8 significant bits) and, at τ = 0.05, move q·e / τ by up to about 0.05 (random unit vectors, 384
    dimensions, 64 × 3,633 pairs).
    """
    with torch.autocast(device_type=q.device.type, enabled=False):
        qc = q.to(torch.promote_types(q.dtype, torch.float32))
        pos_emb = passages[targets.positive_rows].to(qc.dtype)  # [B, P, H]
        pos = torch.einsum("bh,bph->bp", qc, pos_emb) / temperature
        neg = negative_summary(qc, passages, temperature, targets.judged, chunk_size, summary, product)
        scores = torch.cat([pos, neg[:, None]], dim=1)
    b, p = targets.positive_valid.shape
    positive_mask = torch.cat([targets.positive_valid, torch.zeros(b, 1, dtype=torch.bool, device=q.device)], dim=1)
    negative_mask = torch.zeros(b, p + 1, dtype=torch.bool, device=q.device)
    negative_mask[:, p] = True
    return scores, positive_mask, negative_mask


def full_corpus_scores(q: Tensor, passages: Tensor, temperature: float,
                       targets: CorpusTargets) -> tuple[Tensor, Tensor, Tensor]:
    """The unchunked reference: scores [B, N] = q·Eᵀ / τ over the whole corpus, positive_mask [B, N] (the targets'
    positives), negative_mask [B, N] (every passage not judged for the query). Memory O(B × N)."""
    qc = q.to(torch.promote_types(q.dtype, torch.float32))
    scores = qc @ passages.to(qc.dtype).T / temperature
    b, n = scores.shape
    positive_mask = torch.zeros(b, n, dtype=torch.bool, device=q.device)
    rows = torch.arange(b, device=q.device)[:, None].expand_as(targets.positive_rows)
    positive_mask[rows[targets.positive_valid], targets.positive_rows[targets.positive_valid]] = True
    negative_mask = ~_chunk_mask(targets.judged, 0, n, (b, n), q.device)
    return scores, positive_mask, negative_mask & ~positive_mask
