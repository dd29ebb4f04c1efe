"""Soft-target objectives (multipos.losses.SOFT_OBJECTIVES) against independent float64 loops, their gradients, and
their reductions to InfoNCE / JointLH / SumMargLH."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from multipos.losses import SOFT_OBJECTIVES, compute, soft_targets


def _case(seed: int, b: int = 4, n: int = 9):
    g = torch.Generator().manual_seed(seed)
    scores = torch.randn(b, n, generator=g, dtype=torch.float64) * 3
    pos = torch.zeros(b, n, dtype=torch.bool)
    neg = torch.zeros(b, n, dtype=torch.bool)
    for i in range(b):
        perm = torch.randperm(n, generator=g)
        k = 1 + i % 3
        pos[i, perm[:k]] = True
        neg[i, perm[k:n - 1]] = True  # the last column of the permutation is ignored
    weights = torch.rand(b, n, generator=g, dtype=torch.float64) * 0.9 + 0.1
    teacher = torch.randn(b, n, generator=g, dtype=torch.float64)
    return scores, pos, neg, weights, teacher


def _log_p(s, pool):
    z = math.log(sum(math.exp(s[j]) for j in pool))
    return {j: s[j] - z for j in pool}


def reference(name, s, pos, neg, t):
    """Row-by-row float64 loops, written from the docstring equations."""
    out = []
    for i in range(s.shape[0]):
        P = [j for j in range(s.shape[1]) if pos[i, j]]
        N = [j for j in range(s.shape[1]) if neg[i, j] and not pos[i, j]]
        row, lp = s[i].tolist(), _log_p(s[i].tolist(), P + N)
        if name == "kl":
            w = {j: max(float(t[i, j]), 0.0) for j in P + N}
            z = sum(w.values())
            out.append(sum((w[j] / z) * (math.log(w[j] / z) - lp[j]) for j in P + N if w[j] > 0))
        elif name == "margin_mse":
            pairs = [((row[p] - row[q]) - (float(t[i, p]) - float(t[i, q]))) ** 2 for p in P for q in N
                     if not (math.isnan(t[i, p]) or math.isnan(t[i, q]))]
            out.append(sum(pairs) / len(pairs) if pairs else 0.0)
        elif name == "jointlh_weighted":
            out.append(-sum(float(t[i, p]) * lp[p] for p in P) / sum(float(t[i, p]) for p in P))
        elif name == "summarglh_weighted":
            out.append(-math.log(sum(float(t[i, p]) * math.exp(lp[p]) for p in P)))
    return np.array(out)


@pytest.mark.parametrize("name", sorted(SOFT_OBJECTIVES))
@pytest.mark.parametrize("seed", range(5))
def test_each_soft_objective_matches_its_equation_in_float64(name, seed):
    scores, pos, neg, weights, teacher = _case(seed)
    target = teacher if name == "margin_mse" else weights
    if name == "margin_mse":
        target = target.clone()
        target[0, neg[0].nonzero()[0]] = float("nan")  # a negative without a teacher score forms no pair
    got = compute(name, scores, pos, neg, target=target).numpy()
    np.testing.assert_allclose(got, reference(name, scores, pos, neg, target), rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("name", sorted(SOFT_OBJECTIVES))
def test_gradients_match_finite_differences(name):
    scores, pos, neg, weights, teacher = _case(7, b=3, n=6)
    target = teacher if name == "margin_mse" else weights
    s = scores.clone().requires_grad_(True)
    assert torch.autograd.gradcheck(lambda x: compute(name, x, pos, neg, target=target), (s,), eps=1e-6, atol=1e-7)


def test_with_one_positive_of_weight_one_kl_and_the_weighted_likelihoods_are_infonce():
    scores, _, neg, _, _ = _case(3)
    pos = torch.zeros_like(neg)
    pos[:, 0] = True
    neg = neg & ~pos
    target = pos.to(torch.float64)
    infonce = compute("singlelh", scores, pos, neg)
    for name in ("kl", "jointlh_weighted", "summarglh_weighted"):
        torch.testing.assert_close(compute(name, scores, pos, neg, target=target), infonce, rtol=1e-12, atol=1e-12)


def test_equal_weights_give_the_paper_objectives():
    scores, pos, neg, _, _ = _case(5)
    ones = torch.ones_like(scores)
    torch.testing.assert_close(compute("jointlh_weighted", scores, pos, neg, target=ones),
                               compute("jointlh", scores, pos, neg))
    torch.testing.assert_close(compute("summarglh_weighted", scores, pos, neg, target=ones),
                               compute("summarglh", scores, pos, neg))
    n_pos = pos.sum(-1).to(torch.float64)
    torch.testing.assert_close(compute("kl", scores, pos, neg, target=pos.to(torch.float64)),
                               compute("jointlh", scores, pos, neg) - torch.log(n_pos))


def test_margin_mse_of_one_pair_is_the_squared_margin_difference():
    scores = torch.tensor([[2.0, 0.5]], dtype=torch.float64)
    pos, neg = torch.tensor([[True, False]]), torch.tensor([[False, True]])
    teacher = torch.tensor([[1.0, 0.8]], dtype=torch.float64)
    assert compute("margin_mse", scores, pos, neg, target=teacher).item() == pytest.approx((1.5 - 0.2) ** 2)


def test_soft_targets_are_a_tempered_softmax_over_the_known_candidates():
    teacher = torch.tensor([[1.0, 2.0, 3.0, 9.0]])
    known = torch.tensor([[True, True, True, False]])
    t = soft_targets(teacher, known, temperature=2.0)
    expected = torch.softmax(torch.tensor([0.5, 1.0, 1.5]), 0)
    torch.testing.assert_close(t[0, :3], expected)
    assert t[0, 3] == 0 and soft_targets(teacher, torch.zeros_like(known)).sum() == 0
    with pytest.raises(ValueError, match="temperature"):
        soft_targets(teacher, known, temperature=0)


def test_a_target_is_required_by_the_soft_objectives_and_refused_by_the_others():
    scores, pos, neg, weights, _ = _case(1)
    with pytest.raises(ValueError, match="needs a target matrix"):
        compute("kl", scores, pos, neg)
    with pytest.raises(ValueError, match="takes no target matrix"):
        compute("jointlh", scores, pos, neg, target=weights)
    with pytest.raises(ValueError, match="target shape"):
        compute("kl", scores, pos, neg, target=weights[:, :3])


def test_bf16_scores_give_a_float32_loss():
    scores, pos, neg, weights, _ = _case(2)
    loss = compute("kl", scores.to(torch.bfloat16), pos, neg, target=weights.to(torch.bfloat16))
    assert loss.dtype == torch.float32 and torch.isfinite(loss).all()
