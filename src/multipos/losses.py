"""Contrastive objectives for training with several positive passages per query.

Every objective is a pure function of one score matrix and two masks (README, "The science in code")::

    scores         [B, N]  s(q_i, d_j) for query i and every passage j in the batch (already / tau)
    positive_mask  [B, N]  True where passage j is a training positive of query i      (D+_i)
    negative_mask  [B, N]  True where passage j is a negative of query i (hard or in-batch) (D-_i)

A column in neither mask is ignored for that query (e.g. another query's passage that is a judged
positive of query i, i.e. a false negative).  The candidate pool of query i is D_i = D+_i ∪ D-_i, and
P(d | q_i) = exp(s_id) / Σ_{d' ∈ D_i} exp(s_id')  (paper, Sec. 3, "candidate pool").

Each objective returns the **unreduced** per-query loss ``[B]``; the caller averages.

Dtype rule (:func:`compute`): the loss is computed, and returned, in the wider of float32 and the
input dtype, i.e. ``torch.promote_types(scores.dtype, torch.float32)``: bf16 / fp16 / fp32 scores are
computed in float32, float64 scores stay float64 (loss returned in float64). Every objective uses
``logsumexp`` / ``logaddexp`` so any finite input gives a finite loss and finite gradients.

Objectives (paper, Sec. 3 "Training objectives"):

=====================  =====================================================================
``singlelh``           InfoNCE on the first positive: −log P(d+_1 | q)               (Eq. 1)
``rand1lh``            InfoNCE on one positive drawn uniformly per epoch (the data side draws it
                       and passes a one-positive mask): −log P(d+_r | q)            (Eq. 1)
``jointlh``            mean NLL over positives: −1/|D+| Σ_{p∈D+} log P(p | q)        (Eq. 2)
``summarglh``          marginal likelihood: −log Σ_{p∈D+} P(p | q)                    (Eq. 3)
``lsepair``            log(1 + Σ_{p∈D+} Σ_{n∈D−} exp(s_n − s_p))                      (Eq. 4)
``lsepair_maxp``       LSEPair with only the highest-scoring positive: log(1 + Σ_n exp(s_n − max_p s_p))
``lsepair_minp``       LSEPair with only the lowest-scoring positive:  log(1 + Σ_n exp(s_n − min_p s_p))
``lsepair_maxn``       LSEPair with only the hardest negative: log(1 + Σ_p exp(max_n s_n − s_p))
``lsepair_minp_maxn``  hardest pair only: log(1 + exp(max_n s_n − min_p s_p))
``recontriever``       relevance-reweighted likelihood (ReContriever, Lei et al. 2023):
                       −Σ_{p∈D+} w_p log [exp(s_p) / (exp(s_p) + Σ_{n∈D−} exp(s_n))],
                       w_p = softmax_{p'∈D+}(sg(s_p'))_p  (sg = stop-gradient, i.e. detached
                       scores normalised over the query's positives; each positive competes only
                       with the negatives, as in ReContriever's per-pair InfoNCE)
=====================  =====================================================================

With |D+| = 1 every objective except the ``maxn`` variants equals InfoNCE.

Soft-target objectives (:data:`SOFT_OBJECTIVES`) also take a target matrix ``[B, N]``:

=====================  =====================================================================
``kl``                 KL distillation: Σ_d T_d (log T_d − log P(d | q)), T = weights normalised over D
``margin_mse``         MarginMSE: mean_{p,n} ((s_p − s_n) − (t_p − t_n))², teacher scores t
``jointlh_weighted``   −Σ_p w_p log P(p | q) / Σ_p w_p, grade weights w
``summarglh_weighted`` −log Σ_p w_p P(p | q), grade weights w ∈ (0, 1]
=====================  =====================================================================
"""

from __future__ import annotations

from typing import Callable

import torch
from torch import Tensor, nn

__all__ = ["OBJECTIVES", "SOFT_OBJECTIVES", "SINGLE_POSITIVE", "HARDEST_NEGATIVE", "ContrastiveLoss", "compute",
           "check_name", "soft_targets"]

# A large finite stand-in for −inf: keeps logsumexp and its gradient finite on empty sets.
# Representable in both compute dtypes (float32 max ≈ 3.4e38, float64 ≈ 1.8e308), and stays finite
# when two of them are added (−2e30), so it never turns into −inf; exp(_NEG − s) underflows to
# exactly 0 for any realistic score s in either dtype.
_NEG = -1.0e30


def _masked(scores: Tensor, mask: Tensor) -> Tensor:
    """``scores`` where ``mask`` else a huge negative number ([B, N], dtype of ``scores``)."""
    return scores.masked_fill(~mask, _NEG)


def _lse(scores: Tensor, mask: Tensor) -> Tensor:
    """log Σ_{j: mask} exp(scores_j) per row, [B]; ≈ −1e30 for an empty row."""
    return torch.logsumexp(_masked(scores, mask), dim=-1)


def _log_softplus_pool(first: Tensor, second: Tensor) -> Tensor:
    """log(1 + exp(first + second)) computed stably, elementwise ([B]).

    ``logaddexp(x, 0)`` rather than ``F.softplus(x)``: softplus returns ``x`` itself above its
    ``threshold=20``, which drops exp(−20) ≈ 2e-9 from the value and from the gradient (sigmoid) —
    invisible in float32 but a real error in float64.
    """
    x = first + second
    return torch.logaddexp(x, torch.zeros_like(x))


def infonce(scores: Tensor, positive_mask: Tensor, negative_mask: Tensor) -> Tensor:
    """InfoNCE for a mask with exactly one positive per row: −s_p + log Σ_{d∈D} exp(s_d).

    Args: scores [B, N] float; positive_mask, negative_mask [B, N] bool. Returns [B], dtype of scores.
    Used by ``singlelh`` and ``rand1lh`` (paper Eq. 1); with several positives in the mask it
    is the mean over positives of −log P(p | q) with the softmax over D = D+ ∪ D−, i.e. JointLH.
    """
    return jointlh(scores, positive_mask, negative_mask)


def jointlh(scores: Tensor, positive_mask: Tensor, negative_mask: Tensor) -> Tensor:
    """JointLH (paper Eq. 2): −1/|D+| Σ_{p∈D+} log P(p | q), softmax over D = D+ ∪ D−. [B, N] → [B]."""
    pool = positive_mask | negative_mask
    log_z = _lse(scores, pool)  # [B]
    n_pos = positive_mask.sum(-1).clamp(min=1)
    log_p = (scores - log_z[:, None]).masked_fill(~positive_mask, 0.0)
    return -log_p.sum(-1) / n_pos


def summarglh(scores: Tensor, positive_mask: Tensor, negative_mask: Tensor) -> Tensor:
    """SumMargLH (paper Eq. 3): −log Σ_{p∈D+} P(p | q) = log Σ_D exp(s) − log Σ_{D+} exp(s). [B]."""
    pool = positive_mask | negative_mask
    return _lse(scores, pool) - _lse(scores, positive_mask)


def lsepair(scores: Tensor, positive_mask: Tensor, negative_mask: Tensor) -> Tensor:
    """LSEPair (paper Eq. 4): log(1 + Σ_{p∈D+} Σ_{n∈D−} exp(s_n − s_p)).

    The double sum factorises: Σ_{p,n} exp(s_n − s_p) = exp(lse_n(s_n) + lse_p(−s_p)). [B, N] → [B].
    """
    return _log_softplus_pool(_lse(scores, negative_mask), _lse(-scores, positive_mask))


def lsepair_maxp(scores: Tensor, positive_mask: Tensor, negative_mask: Tensor) -> Tensor:
    """LSEPair-maxP (paper Sec. 5, LSEPair variants): log(1 + Σ_n exp(s_n − max_p s_p)). [B]."""
    max_p = _masked(scores, positive_mask).amax(-1)
    return _log_softplus_pool(_lse(scores, negative_mask), -max_p)


def lsepair_minp(scores: Tensor, positive_mask: Tensor, negative_mask: Tensor) -> Tensor:
    """LSEPair-minP (paper Sec. 5, LSEPair variants): log(1 + Σ_n exp(s_n − min_p s_p)). [B]."""
    min_p = -_masked(-scores, positive_mask).amax(-1)
    return _log_softplus_pool(_lse(scores, negative_mask), -min_p)


def lsepair_maxn(scores: Tensor, positive_mask: Tensor, negative_mask: Tensor) -> Tensor:
    """LSEPair-maxN (paper Sec. 5, LSEPair variants): log(1 + Σ_p exp(max_n s_n − s_p)). [B].

    A query without negatives gets loss 0.
    """
    max_n = _masked(scores, negative_mask).amax(-1)
    return _log_softplus_pool(max_n, _lse(-scores, positive_mask))


def lsepair_minp_maxn(scores: Tensor, positive_mask: Tensor, negative_mask: Tensor) -> Tensor:
    """LSEPair-minP-maxN (paper Sec. 5): log(1 + exp(max_n s_n − min_p s_p)), the hardest pair. [B]."""
    max_n = _masked(scores, negative_mask).amax(-1)
    min_p = -_masked(-scores, positive_mask).amax(-1)
    return _log_softplus_pool(max_n, -min_p)


def recontriever(scores: Tensor, positive_mask: Tensor, negative_mask: Tensor) -> Tensor:
    """Relevance-reweighted likelihood in the style of ReContriever (Lei et al., ACL Findings 2023).

    L = −Σ_{p∈D+} w_p [s_p − log(exp(s_p) + Σ_{n∈D−} exp(s_n))],  w = softmax over D+ of the
    detached scores. Each positive competes only with the negatives; weights sum to 1 per query,
    so with one positive this is InfoNCE. [B, N] → [B].
    """
    weights = torch.softmax(_masked(scores.detach(), positive_mask), dim=-1)  # 0 off D+
    lse_neg = _lse(scores, negative_mask)  # [B]
    per_pos = torch.logaddexp(scores, lse_neg[:, None]) - scores  # [B, N]: −log P_p over {p} ∪ D−
    return (weights * per_pos.masked_fill(~positive_mask, 0.0)).sum(-1)


def soft_targets(teacher_scores: Tensor, known_mask: Tensor, temperature: float = 1.0) -> Tensor:
    """Target distribution of KL distillation from a teacher's scores (Hinton et al., 2015, Eq. 1):
    T_ij = exp(t_ij / τ_t) / Σ_{k known} exp(t_ik / τ_t) over the candidates whose teacher score is known, 0 elsewhere.

    Args: teacher_scores [B, N] float (any value where unknown); known_mask [B, N] bool; temperature τ_t > 0 (the
    teacher temperature setting). Returns [B, N] in the dtype of ``teacher_scores``; a row with no known score is 0.
    Raises ValueError for τ_t <= 0.
    """
    if not temperature > 0:
        raise ValueError(f"teacher temperature must be > 0, got {temperature}")
    logits = _masked(teacher_scores / temperature, known_mask)
    return torch.softmax(logits, dim=-1).masked_fill(~known_mask, 0.0) * known_mask.any(-1, keepdim=True)


def kl_divergence(scores: Tensor, positive_mask: Tensor, negative_mask: Tensor, target: Tensor) -> Tensor:
    """KL distillation: KL(T ‖ P) = Σ_{d∈D} T_d (log T_d − log P(d | q)), P the softmax over D = D+ ∪ D−.

    ``target`` [B, N] holds non-negative weights (grade weights, or :func:`soft_targets` of a teacher's scores);
    they are normalised over D per row, T = w / Σ_D w, and 0·log 0 = 0. Candidates with weight 0 (in-batch or
    corpus negatives without a teacher score) enter only P's normaliser. References: Hinton et al. 2015
    (distillation); Tevatron's DistilTevatronTrainer and sentence-transformers' ``DistillKLDivLoss`` use the same
    loss with a teacher's softmax as T. Relations: with one positive of weight 1 and 0 elsewhere it is InfoNCE
    (Eq. 1); with equal weights on the positives it is −1/|D+| Σ_p log P(p) − log |D+|, JointLH (Eq. 2) shifted by a
    constant; with weights on the positives only, it is ``jointlh_weighted`` plus a constant (the same gradient and
    the same model). [B, N] → [B]; a row whose weights sum to 0 gets loss 0.
    """
    pool = positive_mask | negative_mask
    w = target.masked_fill(~pool, 0.0).clamp(min=0.0)
    total = w.sum(-1, keepdim=True)
    t = w / total.clamp(min=torch.finfo(w.dtype).tiny)
    log_p = scores - _lse(scores, pool)[:, None]
    log_t = torch.log(t.clamp(min=torch.finfo(t.dtype).tiny))
    return (t * (log_t - log_p)).masked_fill(t <= 0, 0.0).sum(-1)


def margin_mse(scores: Tensor, positive_mask: Tensor, negative_mask: Tensor, target: Tensor) -> Tensor:
    """MarginMSE (Hofstätter et al., 2020, Eq. 1): mean over pairs (p ∈ D+, n ∈ D−) of
    ((s_p − s_n) − (t_p − t_n))², the student's margin against the teacher's.

    ``target`` [B, N] holds the teacher's scores in the units of ``scores``; NaN marks a candidate without one (an
    in-batch or corpus negative), which forms no pair. Relations: sentence-transformers' ``MarginMSELoss`` with one
    positive and one negative; not a likelihood, so it does not reduce to InfoNCE. [B, N] → [B]; a row without a
    pair gets loss 0.
    """
    known = ~torch.isnan(target)
    t = torch.nan_to_num(target, nan=0.0)
    pos, neg = positive_mask & known, negative_mask & known
    diff = (scores - t)  # (s_p − s_n) − (t_p − t_n) = (s_p − t_p) − (s_n − t_n)
    sq = (diff[:, :, None] - diff[:, None, :]) ** 2  # [B, N, N]: pair (p = j, n = k)
    pairs = pos[:, :, None] & neg[:, None, :]
    n_pairs = pairs.sum((-1, -2))
    return (sq * pairs).sum((-1, -2)) / n_pairs.clamp(min=1)


def jointlh_weighted(scores: Tensor, positive_mask: Tensor, negative_mask: Tensor, target: Tensor) -> Tensor:
    """Grade-weighted JointLH: −Σ_{p∈D+} w_p log P(p | q) / Σ_{p∈D+} w_p, softmax over D = D+ ∪ D−.

    ``target`` [B, N]: the positives' weights w_p ≥ 0 (e.g. from their grades, ``data.targets``). A multipos
    extension of JointLH (paper Eq. 2) to graded positives; Zhang et al. (2025)'s "multi-softmax" soft-label
    cross-entropy is the same loss with weights normalised to sum to 1. Relations: equal weights give JointLH; one
    positive gives InfoNCE (Eq. 1). [B, N] → [B]; a row whose positive weights sum to 0 gets loss 0.
    """
    w = target.masked_fill(~positive_mask, 0.0).clamp(min=0.0)
    log_p = (scores - _lse(scores, positive_mask | negative_mask)[:, None]).masked_fill(~positive_mask, 0.0)
    return -(w * log_p).sum(-1) / w.sum(-1).clamp(min=torch.finfo(w.dtype).tiny)


def summarglh_weighted(scores: Tensor, positive_mask: Tensor, negative_mask: Tensor, target: Tensor) -> Tensor:
    """Grade-weighted SumMargLH: −log Σ_{p∈D+} w_p P(p | q) = log Σ_D exp(s) − log Σ_{D+} w_p exp(s_p).

    ``target`` [B, N]: the positives' weights w_p in (0, 1] (the top grade 1). A multipos extension of SumMargLH
    (paper Eq. 3) to graded positives. Relations: all weights 1 give SumMargLH; one positive of weight 1 gives
    InfoNCE (Eq. 1). [B, N] → [B]. Raises nothing; weights ≤ 0 drop that positive from the sum (a row with none
    left gets the ≈1e30 loss of an empty log-sum-exp: the data side gives every positive a weight > 0).
    """
    w = target.masked_fill(~positive_mask, 0.0)
    weighted = positive_mask & (w > 0)
    log_w = torch.log(w.clamp(min=torch.finfo(w.dtype).tiny))
    return _lse(scores, positive_mask | negative_mask) - _lse(scores + log_w, weighted)


Objective = Callable[[Tensor, Tensor, Tensor], Tensor]
SoftObjective = Callable[[Tensor, Tensor, Tensor, Tensor], Tensor]

#: Registry: objective name (as in ``conf/loss/<name>.yaml``) → implementation.
OBJECTIVES: dict[str, Objective] = {
    "singlelh": infonce,
    "rand1lh": infonce,
    "jointlh": jointlh,
    "summarglh": summarglh,
    "lsepair": lsepair,
    "lsepair_maxp": lsepair_maxp,
    "lsepair_maxn": lsepair_maxn,
    "lsepair_minp": lsepair_minp,
    "lsepair_minp_maxn": lsepair_minp_maxn,
    "recontriever": recontriever,
}

#: Objectives that also take a target matrix [B, N] (weights or teacher scores; ``compute(..., target=)``).
SOFT_OBJECTIVES: dict[str, SoftObjective] = {
    "kl": kl_divergence,
    "margin_mse": margin_mse,
    "jointlh_weighted": jointlh_weighted,
    "summarglh_weighted": summarglh_weighted,
}

#: Objectives trained on a single positive per query → which positive is kept (``"first"`` /
#: ``"random"``). The single source of that rule: the training-stage plan reads it to configure each
#: stage's positive selection; the objectives themselves only check that the mask holds one positive.
SINGLE_POSITIVE: dict[str, str] = {"singlelh": "first", "rand1lh": "random"}


#: Objectives that see the negatives only through the highest negative score (max_n s_n). Every other objective
#: sees them only through a log-sum-exp over D− (or over D+ ∪ D−): :mod:`multipos.training.corpus_candidates` relies on
#: this to replace a whole corpus of negatives by one exact summary column.
HARDEST_NEGATIVE: frozenset[str] = frozenset({"lsepair_maxn", "lsepair_minp_maxn"})


def check_name(name: str) -> str:
    """Return ``name`` if it is a known objective (:data:`OBJECTIVES` or :data:`SOFT_OBJECTIVES`), else raise
    ``ValueError`` listing the allowed names."""
    if name not in OBJECTIVES and name not in SOFT_OBJECTIVES:
        allowed = ", ".join(sorted({*OBJECTIVES, *SOFT_OBJECTIVES}))
        raise ValueError(f"unknown objective {name!r} (loss.name); allowed: {allowed}")
    return name


def _check_rows(name: str, n_pos: Tensor) -> None:
    """Raise ValueError naming the rows (at most 10) of ``n_pos`` [B] (positives per query) that have no positive,
    or several for a single-positive objective. Reads values back to the host (a device sync on an accelerator)."""
    if bool((n_pos == 0).any()):
        rows = (n_pos == 0).nonzero().flatten().tolist()[:10]
        raise ValueError(f"objective {name!r}: query rows {rows} have no positive in positive_mask")
    if name in SINGLE_POSITIVE and bool((n_pos > 1).any()):
        rows = (n_pos > 1).nonzero().flatten().tolist()[:10]
        raise ValueError(f"objective {name!r} trains on one positive per query, but rows {rows} have several "
                         f"(the training stage must keep the {SINGLE_POSITIVE[name]!r} positive, "
                         "see multipos.losses.SINGLE_POSITIVE)")


def compute(
    name: str,
    scores: Tensor,
    positive_mask: Tensor,
    negative_mask: Tensor | None = None,
    normalize_by_positives: bool = False,
    *,
    check_rows: bool = True,
    target: Tensor | None = None,
) -> Tensor:
    """Per-query loss of objective ``name`` exactly as the paper defines it.

    Args:
        name: one of :data:`OBJECTIVES` (``singlelh``, ``rand1lh``, ``jointlh``, ``summarglh``,
            ``lsepair``, ``lsepair_maxp``, ``lsepair_maxn``, ``lsepair_minp``,
            ``lsepair_minp_maxn``, ``recontriever``). For ``rand1lh`` / ``singlelh`` pass a mask
            that holds the one selected positive.
        scores: [B, N] float (bf16, fp16, fp32 or fp64), query–passage scores already divided by
            the temperature.
        positive_mask: [B, N] bool, D+ per query; every row needs at least one True.
        negative_mask: [B, N] bool, D− per query; default ``~positive_mask``. Columns in neither
            mask are ignored. A positive that is also flagged negative counts as positive only.
            A row may have no negative: its loss is then 0 for every objective except ``jointlh``,
            which becomes −1/|D+| Σ_p log of the softmax over D+ alone.
        normalize_by_positives: divide each query's loss by |D+| (paper Sec. 3, optional
            normalisation; a no-op for the already averaged ``jointlh``).
        target: [B, N] float, required by the objectives of :data:`SOFT_OBJECTIVES` (weights or teacher scores,
            as each one's docstring says) and refused by the others.
        check_rows: check each row's positives (none, or several for ``singlelh`` / ``rand1lh``). These
            checks read the masks' values back to the host, which on an accelerator makes the host wait
            for the device; :class:`ContrastiveLoss` makes them on its first batch only. Shapes and
            dtypes are always checked (no value is read).

    Returns:
        [B] unreduced loss per query, in the wider of float32 and ``scores.dtype``
        (``torch.promote_types(scores.dtype, torch.float32)``): float64 scores give a float64 loss;
        bf16 / fp16 / fp32 scores give a float32 loss. Gradients flow back in ``scores.dtype``.

    Raises:
        ValueError: unknown ``name``, shape mismatch, non-boolean masks, a missing or unexpected ``target``; with
            ``check_rows``, a query row with no positive, or several positives in a row for ``singlelh`` /
            ``rand1lh``.
    """
    check_name(name)
    soft = name in SOFT_OBJECTIVES
    if soft and target is None:
        raise ValueError(f"objective {name!r} needs a target matrix [B, N] (data.targets: grades or a teacher)")
    if not soft and target is not None:
        raise ValueError(f"objective {name!r} takes no target matrix (the soft-target ones: "
                         f"{', '.join(sorted(SOFT_OBJECTIVES))})")
    if soft and target.shape != scores.shape:
        raise ValueError(f"target shape {tuple(target.shape)} != scores shape {tuple(scores.shape)}")
    if scores.dim() != 2:
        raise ValueError(f"scores must be [B, N], got shape {tuple(scores.shape)}")
    for field, mask in (("positive_mask", positive_mask), ("negative_mask", negative_mask)):
        if mask is None:
            continue
        if mask.shape != scores.shape:
            raise ValueError(f"{field} shape {tuple(mask.shape)} != scores shape {tuple(scores.shape)}")
        if mask.dtype != torch.bool:
            raise ValueError(f"{field} must be a bool tensor, got {mask.dtype}")
    n_pos = positive_mask.sum(-1)
    if check_rows:
        _check_rows(name, n_pos)
    if negative_mask is None:
        negative_mask = ~positive_mask
    negative_mask = negative_mask & ~positive_mask
    wide = torch.promote_types(scores.dtype, torch.float32)
    if soft:
        loss = SOFT_OBJECTIVES[name](scores.to(wide), positive_mask, negative_mask, target.to(wide))
    else:
        loss = OBJECTIVES[name](scores.to(wide), positive_mask, negative_mask)
    if normalize_by_positives and name != "jointlh":
        loss = loss / n_pos.to(loss.dtype)
    return loss


class ContrastiveLoss(nn.Module):
    """Batch loss = mean over queries of :func:`multipos.losses.compute` (``conf/loss/<name>.yaml``).

    Args: name: objective name; normalize_by_positives: divide each query's loss by |D+|.
    Raises: ValueError for an unknown objective name.

    The masks' rows (a positive in every row; one for ``singlelh`` / ``rand1lh``) are checked on the first batch
    this module scores, so that a misconfigured training stage fails at its first step. Later batches skip that
    check: it reads values back to the host, which on an accelerator would make the host wait for the device in the
    middle of every step. The masks of later batches are built by the same code
    (:func:`multipos.data.groups.group_masks`, :func:`multipos.training.corpus_candidates.corpus_scores`).

    Which positive a single-positive objective trains on is not asked of this module: the
    training-stage plan reads :data:`SINGLE_POSITIVE`.
    """

    def __init__(self, name: str, normalize_by_positives: bool = False):
        super().__init__()
        self.name = check_name(name)
        self.normalize_by_positives = normalize_by_positives
        self.rows_checked = False

    def forward(self, scores: Tensor, positive_mask: Tensor, negative_mask: Tensor,
                target: Tensor | None = None) -> Tensor:
        """scores [B, N], masks [B, N] (and, for a soft-target objective, target [B, N]) → scalar mean loss (dtype
        rule of :func:`compute`; rows checked on the first call, class docstring)."""
        loss = compute(self.name, scores, positive_mask, negative_mask, self.normalize_by_positives,
                       check_rows=not self.rows_checked, target=target)
        self.rows_checked = True
        return loss.mean()
