"""Gradient diagnostics (paper Sec. 3.3 and App. A): where each objective puts its gradient among a query's positives.

Everything here is a function of one batch's score matrix and masks (the shapes of :mod:`multipos.losses`)::

    scores         [B, N]  s(q_i, d_j), already divided by τ
    positive_mask  [B, N]  D+_i (bool);  negative_mask [B, N]  D−_i (bool); columns in neither are ignored

P(d | q_i, D_i) = exp(s_id) / Σ_{d'∈D_i} exp(s_id') over the candidate pool D_i = D+_i ∪ D−_i. Gradients are
those of each query's own loss L_i (the batch loss is their mean, which only divides them by B).

Closed forms of App. A (checked against autograd in ``tests/training/test_diagnostics.py``), with P(D+) = Σ_{p∈D+} P(p):

* JointLH (Eq. 2):   ∂L/∂s_p = P(p) − 1/|D+|          — every positive is pulled toward probability 1/|D+|
  (a positive above 1/|D+| is pushed down);  ∂L/∂s_n = P(n).
* SumMargLH (Eq. 3): ∂L/∂s_p = P(p) − P(p)/P(D+)       — the pull −∂L/∂s_p = P(p)(1 − P(D+))/P(D+) is
  proportional to P(p): the highest-scoring positive gets most of it;  ∂L/∂s_n = P(n).
* LSEPair (Eq. 4):   −∂L/∂s_p = Σ_n exp(s_n − s_p) / (1 + Σ_{p'∈D+, n∈D−} exp(s_n − s_p')) — proportional to
  exp(−s_p): the weakest positive gets most of it;  ∂L/∂s_n = Σ_p exp(s_n − s_p) / (1 + Σ_{p',n} exp(s_n − s_p')).

:class:`multipos.training.callbacks.GradientDiagnostics` (``callbacks=diagnostics``) logs, every N training steps, from
the
``scores`` and masks that :meth:`multipos.training.module.RetrieverModule.training_step` returns (autograd on a
detached copy:
no extra forward pass), under ``diag/``:

* per objective ``<obj>`` (the trained one and ``objectives``), over queries with |D+| ≥ 2:
  ``diag/<obj>/grad_share_top`` and ``diag/<obj>/grad_share_weakest`` — the pull −∂L/∂s_p on the top-scoring and on the
  weakest positive divided by Σ_{p∈D+} |∂L/∂s_p| (in [−1, 1]; negative when that positive is pushed down);
  ``diag/<obj>/grad_rank`` — the positives' rank among the query's positives (0 = top-scoring, 1 = weakest, ties by
  column order) averaged with weights |∂L/∂s_p|;
* shared by all objectives: ``diag/pos_entropy`` — entropy (nats) of P(d+ | q, D) renormalised over the query's
  positives, against ``diag/pos_entropy_max`` = log |D+| (uniform); ``diag/p_pos`` — mean P(d+ | q, D) against
  ``diag/p_pos_uniform`` = 1/|D+| (JointLH's target); ``diag/margin`` — mean s_p − s_n over (positive, negative)
  pairs, in score units (s/τ); ``diag/false_negative_fraction`` — share of the batch's columns in neither mask
  (in-batch passages masked out as judged positives of the query).

Every value is a batch mean over queries. Cost: ``bench/bench_diagnostics.py`` (well under 2 % of a training step).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import Tensor

from multipos.losses import compute

__all__ = ["CLOSED_FORMS", "batch_diagnostics", "closed_form_gradient", "objective_gradient",
           "positive_gradient_stats", "score_statistics"]

#: Objectives watched besides the trained one (``callbacks.gradient_diagnostics.objectives``).
DEFAULT_OBJECTIVES = ("jointlh", "summarglh", "lsepair")
#: Keys a training step's ``outputs`` must hold for the callback.
OUTPUT_KEYS = ("scores", "positive_mask", "negative_mask")


def _inputs(scores: Tensor, positive_mask: Tensor, negative_mask: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """Checked float scores (the wider of float32 and their dtype) and masks with D− ∩ D+ removed.

    Raises ValueError (naming the argument) for non-2-D scores, masks of another shape or not bool, or a query
    row without positive.
    """
    if scores.dim() != 2:
        raise ValueError(f"scores must be [B, N], got shape {tuple(scores.shape)}")
    for field, mask in (("positive_mask", positive_mask), ("negative_mask", negative_mask)):
        if mask.shape != scores.shape or mask.dtype != torch.bool:
            raise ValueError(f"{field} must be a bool tensor of shape {tuple(scores.shape)}, "
                             f"got {mask.dtype} {tuple(mask.shape)}")
    if bool((positive_mask.sum(-1) == 0).any()):
        raise ValueError(f"query rows {(positive_mask.sum(-1) == 0).nonzero().flatten().tolist()[:10]} "
                         "have no positive")
    s = scores.detach().to(torch.promote_types(scores.dtype, torch.float32))
    return s, positive_mask, negative_mask & ~positive_mask


def _masked_softmax(scores: Tensor, mask: Tensor) -> Tensor:
    """softmax of ``scores`` over the columns of ``mask`` per row, 0 elsewhere ([B, N])."""
    return torch.softmax(scores.masked_fill(~mask, -math.inf), dim=-1)


def _jointlh_gradient(s: Tensor, pos: Tensor, neg: Tensor) -> Tensor:
    p = _masked_softmax(s, pos | neg)
    return p - pos.to(s.dtype) / pos.sum(-1, keepdim=True).to(s.dtype)


def _summarglh_gradient(s: Tensor, pos: Tensor, neg: Tensor) -> Tensor:
    return _masked_softmax(s, pos | neg) - _masked_softmax(s, pos)  # P(p)/P(D+) = softmax over D+


def _lsepair_gradient(s: Tensor, pos: Tensor, neg: Tensor) -> Tensor:
    lse_n = torch.logsumexp(s.masked_fill(~neg, -math.inf), -1, keepdim=True)  # log Σ_n exp(s_n)
    lse_p = torch.logsumexp((-s).masked_fill(~pos, -math.inf), -1, keepdim=True)  # log Σ_p exp(−s_p)
    log1p_pairs = torch.logaddexp(lse_n + lse_p, torch.zeros_like(lse_n))  # log(1 + Σ_{p,n} exp(s_n − s_p))
    pull = torch.exp(lse_n - s - log1p_pairs).masked_fill(~pos, 0.0)
    push = torch.exp(s + lse_p - log1p_pairs).masked_fill(~neg, 0.0)
    return (push - pull).nan_to_num(0.0)  # a row without negatives has no gradient (−inf − −inf)


#: Objective name → App. A closed-form gradient ``(scores, positive_mask, negative_mask) -> ∂L_i/∂s_ij [B, N]``.
CLOSED_FORMS = {"jointlh": _jointlh_gradient, "summarglh": _summarglh_gradient, "lsepair": _lsepair_gradient}


def closed_form_gradient(name: str, scores: Tensor, positive_mask: Tensor, negative_mask: Tensor) -> Tensor:
    """∂L_i/∂s_ij of objective ``name`` from the closed forms of App. A (module docstring), [B, N].

    Args: name: ``jointlh``, ``summarglh`` or ``lsepair``; scores [B, N] (s/τ); positive_mask, negative_mask [B, N] bool
    (a column flagged both counts as positive). Returns [B, N] in the wider of float32 and ``scores.dtype``; 0 on
    columns outside D+ ∪ D−. Raises ValueError for another objective or bad input (see :func:`_inputs`).
    """
    if name not in CLOSED_FORMS:
        raise ValueError(f"no closed-form gradient for objective {name!r}; have {', '.join(CLOSED_FORMS)}")
    return CLOSED_FORMS[name](*_inputs(scores, positive_mask, negative_mask))


def objective_gradient(name: str, scores: Tensor, positive_mask: Tensor, negative_mask: Tensor,
                       normalize_by_positives: bool = False) -> Tensor:
    """∂L_i/∂s_ij of any objective of :data:`multipos.losses.OBJECTIVES` by autograd on a detached copy of ``scores``.

    Args as :func:`multipos.losses.compute`. Returns [B, N] in the wider of float32 and ``scores.dtype``; 0 on ignored
    columns. Runs under ``torch.enable_grad`` (also inside no-grad code); the model's graph is not touched.
    Raises ValueError as :func:`multipos.losses.compute`.
    """
    s, pos, neg = _inputs(scores, positive_mask, negative_mask)
    with torch.enable_grad():
        s = s.clone().requires_grad_(True)
        (grad,) = torch.autograd.grad(compute(name, s, pos, neg, normalize_by_positives).sum(), s)
    return grad


def positive_gradient_stats(grad: Tensor, scores: Tensor, positive_mask: Tensor) -> dict[str, float]:
    """Where the positive-side gradient goes, averaged over queries with |D+| ≥ 2 and some gradient.

    Args: grad [B, N] ∂L_i/∂s_ij; scores [B, N]; positive_mask [B, N] bool. With pull_p = −∂L/∂s_p and
    W = Σ_{p∈D+} |pull_p|, returns ``{"grad_share_top": pull_top / W, "grad_share_weakest": pull_weakest / W,
    "grad_rank": Σ_p |pull_p| r_p / W}``, r_p = rank of p among the query's positives / (|D+| − 1) (0 = top-scoring,
    1 = weakest; equal scores in column order). Empty dict when no query qualifies.
    """
    pos = positive_mask
    n_pos = pos.sum(-1)
    pull = (-grad).masked_fill(~pos, 0.0)
    weight = pull.abs().sum(-1)
    rows = (n_pos >= 2) & (weight > 0)
    if not bool(rows.any()):
        return {}
    order = (scores.detach().to(pull.dtype).masked_fill(~pos, -math.inf)
             .sort(dim=-1, descending=True, stable=True).indices)
    rank = torch.empty_like(order).scatter_(1, order,
                                            torch.arange(order.shape[1], device=order.device).expand_as(order))
    r = rank.to(pull.dtype) / (n_pos[:, None] - 1).clamp(min=1)
    top = pull.gather(1, order[:, :1]).squeeze(1)
    weakest = pull.gather(1, order.gather(1, (n_pos - 1).clamp(min=0)[:, None])).squeeze(1)  # last positive in order
    weighted = (pull.abs() * r).masked_fill(~pos, 0.0).sum(-1)
    w = weight[rows]
    return {"grad_share_top": (top[rows] / w).mean().item(), "grad_share_weakest": (weakest[rows] / w).mean().item(),
            "grad_rank": (weighted[rows] / w).mean().item()}


def score_statistics(scores: Tensor, positive_mask: Tensor, negative_mask: Tensor) -> dict[str, float]:
    """Objective-independent statistics of one batch (batch means over queries), see the module docstring.

    Args: scores [B, N] (s/τ); masks [B, N] bool. Returns ``pos_entropy`` (nats) and ``pos_entropy_max`` (log |D+|),
    ``p_pos`` and ``p_pos_uniform`` (1/|D+|), ``margin`` (score units, queries with negatives; left out when none has
    any) and ``false_negative_fraction`` (columns in neither mask / N). Raises ValueError for bad input.
    """
    s, pos, neg = _inputs(scores, positive_mask, negative_mask)
    n_pos = pos.sum(-1).to(s.dtype)
    within = _masked_softmax(s, pos)  # P(d+ | q, D) renormalised over D+
    entropy = -(within * torch.log(within)).masked_fill(~pos, 0.0).sum(-1)
    p_pool = _masked_softmax(s, pos | neg)
    out = {"pos_entropy": entropy.mean().item(), "pos_entropy_max": torch.log(n_pos).mean().item(),
           "p_pos": ((p_pool * pos).sum(-1) / n_pos).mean().item(), "p_pos_uniform": (1.0 / n_pos).mean().item()}
    n_neg = neg.sum(-1).to(s.dtype)
    has_neg = n_neg > 0
    if bool(has_neg.any()):
        margin = (s * pos).sum(-1) / n_pos - (s * neg).sum(-1) / n_neg.clamp(min=1)
        out["margin"] = margin[has_neg].mean().item()
    out["false_negative_fraction"] = (~(pos | neg)).to(s.dtype).mean().item()
    return out


def batch_diagnostics(scores: Tensor, positive_mask: Tensor, negative_mask: Tensor, objectives: Sequence[str],
                      normalize_by_positives: bool = False, prefix: str = "diag") -> dict[str, float]:
    """All diagnostics of one batch → ``{"<prefix>/<obj>/grad_share_top": …, "<prefix>/pos_entropy": …, …}``.

    Args: scores [B, N] (s/τ), masks [B, N] bool; objectives: names of :data:`multipos.losses.OBJECTIVES` whose
    gradient is analysed (by autograd, :func:`objective_gradient`); normalize_by_positives: as the trained loss.
    Raises ValueError for bad input or objective names (as :func:`multipos.losses.compute`).
    """
    out = {f"{prefix}/{k}": v for k, v in score_statistics(scores, positive_mask, negative_mask).items()}
    for name in objectives:
        grad = objective_gradient(name, scores, positive_mask, negative_mask, normalize_by_positives)
        out.update({f"{prefix}/{name}/{k}": v for k, v in positive_gradient_stats(grad, scores, positive_mask).items()})
    return out
