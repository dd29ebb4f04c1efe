"""Tests for ``multipos.losses``: every objective against hand-written formulas, equivalences,
mask semantics, numerics, gradients and errors.

Expected values are computed from the formulas in the ``multipos.losses`` docstrings with
``math.exp`` / ``math.log`` (never with the implementation under test).
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from multipos import losses
from multipos.losses import ContrastiveLoss, compute

ALL = ["singlelh", "rand1lh", "jointlh", "summarglh", "lsepair", "lsepair_maxp", "lsepair_minp",
       "lsepair_maxn", "lsepair_minp_maxn", "recontriever"]
MULTI = [n for n in ALL if n not in ("singlelh", "rand1lh")]
# Objectives documented to reduce to InfoNCE with exactly one positive.
EQUAL_INFONCE_1POS = ["singlelh", "rand1lh", "jointlh", "summarglh", "lsepair", "lsepair_maxp",
                      "lsepair_minp", "recontriever"]


# --------------------------------------------------------------------------------------------
# Pure-python reference, written from the docstring formulas.
# --------------------------------------------------------------------------------------------

def ref(name: str, s: list[float], pos: list[int], neg: list[int]) -> float:
    """Loss of one query: ``s`` scores, ``pos`` indices of D+, ``neg`` indices of D− (disjoint)."""
    e = math.exp
    pool = pos + neg
    z = sum(e(s[j]) for j in pool)
    if name in ("singlelh", "rand1lh", "jointlh"):
        return -sum(math.log(e(s[p]) / z) for p in pos) / len(pos)
    if name == "summarglh":
        return -math.log(sum(e(s[p]) / z for p in pos))
    if name == "lsepair":
        return math.log(1 + sum(e(s[n] - s[p]) for p in pos for n in neg))
    if name == "lsepair_maxp":
        mp = max(s[p] for p in pos)
        return math.log(1 + sum(e(s[n] - mp) for n in neg))
    if name == "lsepair_minp":
        mp = min(s[p] for p in pos)
        return math.log(1 + sum(e(s[n] - mp) for n in neg))
    if name == "lsepair_maxn":
        if not neg:
            return 0.0
        mn = max(s[n] for n in neg)
        return math.log(1 + sum(e(mn - s[p]) for p in pos))
    if name == "lsepair_minp_maxn":
        if not neg:
            return 0.0
        return math.log(1 + e(max(s[n] for n in neg) - min(s[p] for p in pos)))
    if name == "recontriever":
        zp = sum(e(s[p]) for p in pos)
        zn = sum(e(s[n]) for n in neg)
        return -sum((e(s[p]) / zp) * math.log(e(s[p]) / (e(s[p]) + zn)) for p in pos)
    raise AssertionError(name)


def masks(n: int, rows: list[tuple[list[int], list[int]]]) -> tuple[torch.Tensor, torch.Tensor]:
    pm = torch.zeros(len(rows), n, dtype=torch.bool)
    nm = torch.zeros(len(rows), n, dtype=torch.bool)
    for i, (pos, neg) in enumerate(rows):
        pm[i, pos] = True
        nm[i, neg] = True
    return pm, nm


# Row 0: 2 positives, 2 negatives, columns 4 and 5 in neither mask (ignored).
# Row 1: 3 positives, 3 negatives (every column used).
# Row 2: 3 positives, 2 negatives, column 1 ignored.
SCORES = [
    [2.0, 1.0, 0.5, -1.0, 3.0, 0.0],
    [0.3, -0.2, 1.1, 0.7, -0.5, 0.0],
    [-0.4, 2.5, 1.5, 0.2, 0.9, -1.3],
]
ROWS = [([0, 1], [2, 3]), ([0, 1, 2], [3, 4, 5]), ([0, 2, 3], [4, 5])]


def test_reference_by_hand_for_one_row():
    """Spell out row 0 once, term by term, so the reference itself is checked against the docstring."""
    e, log = math.exp, math.log
    s0, s1, n0, n1 = 2.0, 1.0, 0.5, -1.0
    z = e(s0) + e(s1) + e(n0) + e(n1)
    hand = {
        "jointlh": -(log(e(s0) / z) + log(e(s1) / z)) / 2,
        "summarglh": -log((e(s0) + e(s1)) / z),
        "lsepair": log(1 + e(n0 - s0) + e(n1 - s0) + e(n0 - s1) + e(n1 - s1)),
        "lsepair_maxp": log(1 + e(n0 - s0) + e(n1 - s0)),
        "lsepair_minp": log(1 + e(n0 - s1) + e(n1 - s1)),
        "lsepair_maxn": log(1 + e(n0 - s0) + e(n0 - s1)),
        "lsepair_minp_maxn": log(1 + e(n0 - s1)),
        "recontriever": -(e(s0) / (e(s0) + e(s1)) * log(e(s0) / (e(s0) + e(n0) + e(n1)))
                          + e(s1) / (e(s0) + e(s1)) * log(e(s1) / (e(s1) + e(n0) + e(n1)))),
    }
    s = torch.tensor([SCORES[0]])
    pm, nm = masks(6, [ROWS[0]])
    for name, expected in hand.items():
        assert ref(name, SCORES[0], *ROWS[0]) == pytest.approx(expected, rel=1e-12)
        assert compute(name, s, pm, nm).item() == pytest.approx(expected, rel=1e-5, abs=1e-6), name


@pytest.mark.parametrize("name", MULTI)
def test_multi_positive_hand_computed(name):
    s = torch.tensor(SCORES)
    pm, nm = masks(6, ROWS)
    out = compute(name, s, pm, nm)
    assert out.shape == (3,)
    assert out.dtype == torch.float32
    expected = [ref(name, SCORES[i], *ROWS[i]) for i in range(3)]
    assert out.tolist() == pytest.approx(expected, rel=1e-5, abs=1e-6)
    assert all(v > 0 for v in out.tolist())


@pytest.mark.parametrize("name", ["singlelh", "rand1lh"])
def test_single_positive_objectives_are_infonce(name):
    """singlelh / rand1lh: −log P(d+ | q) for the one positive in the mask."""
    e, log = math.exp, math.log
    s = torch.tensor([[2.0, 1.0, 0.5, -1.0, 3.0]])
    # the other positive (column 1) ignored, column 4 ignored: pool = {0, 2, 3}
    pm, nm = masks(5, [([0], [2, 3])])
    assert compute(name, s, pm, nm).item() == pytest.approx(-log(e(2.0) / (e(2.0) + e(0.5) + e(-1.0))), rel=1e-6)
    # default negatives: every other column is a negative (rand1lh picked column 1 this epoch)
    pm = torch.tensor([[False, True, False, False, False]])
    z = e(2.0) + e(1.0) + e(0.5) + e(-1.0) + e(3.0)
    assert compute(name, s, pm).item() == pytest.approx(-log(e(1.0) / z), rel=1e-6)


@pytest.mark.parametrize("name", ALL)
def test_ignored_column_does_not_change_loss(name):
    s = torch.tensor(SCORES)
    pm, nm = masks(6, ROWS)
    if name in ("singlelh", "rand1lh"):
        pm, nm = masks(6, [([0], [2, 3]), ([1], [3, 4, 5]), ([2], [4, 5])])
    base = compute(name, s, pm, nm)
    for value in (-50.0, 0.0, 50.0, 1e4):
        t = s.clone()
        t[0, 4] = value  # row 0: column 4 is in neither mask
        t[0, 5] = -value
        t[2, 1] = value  # row 2: column 1 is in neither mask
        torch.testing.assert_close(compute(name, t, pm, nm), base)
    # ... while changing a used column does change it
    t = s.clone()
    t[0, 2] += 1.0
    assert not torch.allclose(compute(name, t, pm, nm)[0], base[0])


@pytest.mark.parametrize("name", ALL)
def test_ignored_column_has_zero_gradient(name):
    s = torch.tensor(SCORES, requires_grad=True)
    pm, nm = masks(6, ROWS)
    if name in ("singlelh", "rand1lh"):
        pm, nm = masks(6, [([0], [2, 3]), ([1], [3, 4, 5]), ([2], [4, 5])])
    compute(name, s, pm, nm).sum().backward()
    assert s.grad[0, 4] == 0 and s.grad[0, 5] == 0 and s.grad[2, 1] == 0
    assert s.grad.abs().sum() > 0


# --------------------------------------------------------------------------------------------
# One positive per row: the multi-positive objectives reduce to InfoNCE.
# --------------------------------------------------------------------------------------------

def _random_one_positive(seed: int, b: int = 5, n: int = 9):
    g = torch.Generator().manual_seed(seed)
    scores = torch.randn(b, n, generator=g) * 3
    target = torch.randint(0, n, (b,), generator=g)
    pm = F.one_hot(target, n).bool()
    # some columns ignored (neither mask), at least one negative per row
    nm = (torch.rand(b, n, generator=g) < 0.7) & ~pm
    nm[torch.arange(b), (target + 1) % n] = True
    return scores, pm, nm, target


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("name", EQUAL_INFONCE_1POS)
def test_one_positive_equals_cross_entropy(name, seed):
    scores, pm, nm, target = _random_one_positive(seed)
    pool_scores = scores.masked_fill(~(pm | nm), float("-inf"))
    expected = F.cross_entropy(pool_scores, target, reduction="none")
    torch.testing.assert_close(compute(name, scores, pm, nm), expected, rtol=1e-5, atol=1e-5)
    # and with the default negative mask (every other column)
    expected = F.cross_entropy(scores, target, reduction="none")
    torch.testing.assert_close(compute(name, scores, pm), expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("seed", [0, 1])
def test_one_positive_maxn_variants_bounded_by_infonce(seed):
    """With one positive, maxN keeps only the hardest negative: log(1+exp(max_n − s_p)) ≤ InfoNCE."""
    scores, pm, nm, target = _random_one_positive(seed)
    infonce = compute("singlelh", scores, pm, nm)
    maxn = compute("lsepair_maxn", scores, pm, nm)
    hardest = compute("lsepair_minp_maxn", scores, pm, nm)
    torch.testing.assert_close(maxn, hardest)
    assert bool((maxn <= infonce + 1e-6).all())
    s_p = scores.gather(1, target[:, None]).squeeze(1)
    max_n = scores.masked_fill(~nm, float("-inf")).amax(-1)
    torch.testing.assert_close(maxn, F.softplus(max_n - s_p))


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_lsepair_variant_ordering(seed):
    """Σ_{p,n} ≥ Σ_n at min_p ≥ Σ_n at max_p, and Σ_{p,n} ≥ Σ_p at max_n ≥ the single hardest pair."""
    g = torch.Generator().manual_seed(seed)
    scores = torch.randn(6, 10, generator=g) * 2
    pm = torch.rand(6, 10, generator=g) < 0.4
    pm[:, 0] = True
    nm = ~pm
    nm[:, -1] = True
    pm[:, -1] = False
    v = {n: compute(n, scores, pm, nm) for n in MULTI}
    eps = 1e-6
    assert bool((v["lsepair"] + eps >= v["lsepair_minp"]).all())
    assert bool((v["lsepair_minp"] + eps >= v["lsepair_maxp"]).all())
    assert bool((v["lsepair"] + eps >= v["lsepair_maxn"]).all())
    assert bool((v["lsepair_maxn"] + eps >= v["lsepair_minp_maxn"]).all())
    assert bool((v["lsepair_minp"] + eps >= v["lsepair_minp_maxn"]).all())


# --------------------------------------------------------------------------------------------
# Mask semantics and normalisation.
# --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", ALL)
def test_negative_mask_defaults_to_complement(name):
    g = torch.Generator().manual_seed(3)
    scores = torch.randn(4, 7, generator=g)
    pm = torch.zeros(4, 7, dtype=torch.bool)
    pm[:, 0] = True
    if name not in ("singlelh", "rand1lh"):
        pm[1, 3] = pm[2, 5] = pm[2, 6] = True
    torch.testing.assert_close(compute(name, scores, pm), compute(name, scores, pm, ~pm))
    # a positive also flagged negative counts as positive only
    torch.testing.assert_close(compute(name, scores, pm, torch.ones_like(pm)), compute(name, scores, pm, ~pm))


@pytest.mark.parametrize("name", MULTI)
def test_normalize_by_positives(name):
    s = torch.tensor(SCORES)
    pm, nm = masks(6, ROWS)
    plain = compute(name, s, pm, nm)
    normed = compute(name, s, pm, nm, normalize_by_positives=True)
    n_pos = torch.tensor([2.0, 3.0, 3.0])
    if name == "jointlh":  # already an average over positives: documented no-op
        torch.testing.assert_close(normed, plain)
    else:
        torch.testing.assert_close(normed, plain / n_pos)
        expected = [ref(name, SCORES[i], *ROWS[i]) / len(ROWS[i][0]) for i in range(3)]
        assert normed.tolist() == pytest.approx(expected, rel=1e-5, abs=1e-6)


@pytest.mark.parametrize("name", ALL)
def test_normalize_by_positives_is_identity_with_one_positive(name):
    scores, pm, nm, _ = _random_one_positive(4)
    torch.testing.assert_close(compute(name, scores, pm, nm, normalize_by_positives=True),
                               compute(name, scores, pm, nm))


@pytest.mark.parametrize("name", MULTI)
def test_rows_are_independent(name):
    s = torch.tensor(SCORES)
    pm, nm = masks(6, ROWS)
    batch = compute(name, s, pm, nm)
    for i in range(3):
        torch.testing.assert_close(compute(name, s[i:i + 1], pm[i:i + 1], nm[i:i + 1]), batch[i:i + 1])


# --------------------------------------------------------------------------------------------
# Numerics.
# --------------------------------------------------------------------------------------------

def _extreme():
    big = 1e4
    scores = torch.tensor([
        [-big, -big, big, big, 0.0],   # positives far below negatives: huge loss
        [big, big, -big, -big, 0.0],   # positives far above negatives: ~zero loss
        [big, -big, big, -big, 0.0],   # mixed
        [1.0, 2.0, -big, big, 3.0],    # no negatives at all (row 3)
    ])
    pm, nm = masks(5, [([0, 1], [2, 3, 4]), ([0, 1], [2, 3, 4]), ([0, 1], [2, 3]), ([0, 1], [])])
    return scores, pm, nm


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
@pytest.mark.parametrize("name", ALL)
def test_extreme_inputs_finite_values_and_gradients(name, dtype):
    scores, pm, nm = _extreme()
    if name in ("singlelh", "rand1lh"):
        pm[:, 1] = False
    leaf = scores.to(dtype).requires_grad_(True)
    out = compute(name, leaf, pm, nm)
    assert out.dtype == (torch.float64 if dtype == torch.float64 else torch.float32)  # wider of fp32 and input
    assert out.shape == (4,)
    assert torch.isfinite(out).all(), out
    assert bool((out >= -1e-4).all()), out
    out.sum().backward()
    assert leaf.grad is not None and leaf.grad.dtype == dtype
    assert torch.isfinite(leaf.grad.float()).all(), leaf.grad
    # positives far above every negative → loss ~ 0 for the pairwise / marginal objectives
    if name not in ("jointlh",):
        assert out[1].item() == pytest.approx(0.0, abs=1e-3)
    # positives far below the negatives → loss of order 2e4
    assert out[0].item() > 1e4


@pytest.mark.parametrize("name", MULTI)
def test_row_without_negatives(name):
    """No negatives: every pairwise/marginal objective is 0; JointLH is the softmax over D+ only."""
    scores = torch.tensor([[1.0, 2.0, 5.0], [0.0, 0.0, 0.0]], requires_grad=True)
    pm = torch.tensor([[True, True, False], [True, True, True]])
    nm = torch.zeros_like(pm)
    out = compute(name, scores, pm, nm)
    assert torch.isfinite(out).all()
    expected = [ref(name, scores[0].tolist(), [0, 1], []), ref(name, [0.0] * 3, [0, 1, 2], [])]
    if name == "jointlh":
        e = math.exp
        assert expected[0] == pytest.approx(-(math.log(e(1) / (e(1) + e(2))) + math.log(e(2) / (e(1) + e(2)))) / 2)
        assert expected[1] == pytest.approx(math.log(3))
    else:
        assert expected == pytest.approx([0.0, 0.0], abs=1e-12)
    assert out.tolist() == pytest.approx(expected, abs=1e-6)
    out.sum().backward()
    assert torch.isfinite(scores.grad).all()
    assert scores.grad[0, 2] == 0


@pytest.mark.parametrize("name", ALL)
def test_bf16_matches_fp32_of_rounded_scores(name):
    g = torch.Generator().manual_seed(5)
    scores = (torch.randn(4, 8, generator=g) * 4).bfloat16()
    pm = torch.zeros(4, 8, dtype=torch.bool)
    pm[:, 0] = True
    if name not in ("singlelh", "rand1lh"):
        pm[:, 3] = True
    out = compute(name, scores, pm)
    assert out.dtype == torch.float32
    torch.testing.assert_close(out, compute(name, scores.float(), pm))


# --------------------------------------------------------------------------------------------
# Gradients.
# --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", ["lsepair", "lsepair_maxp", "lsepair_minp", "lsepair_maxn",
                                  "lsepair_minp_maxn", "summarglh", "recontriever"])
def test_raising_a_positive_lowers_loss_and_raising_a_negative_raises_it(name):
    s = torch.tensor(SCORES)
    pm, nm = masks(6, ROWS)
    base = compute(name, s, pm, nm)
    s_req = s.clone().requires_grad_(True)
    compute(name, s_req, pm, nm).sum().backward()
    grad = s_req.grad
    assert bool((grad[pm] <= 0).all()), grad
    assert bool((grad[nm] >= 0).all()), grad
    assert bool((grad[~(pm | nm)] == 0).all())
    if name == "lsepair":
        assert bool((grad[pm] < 0).all()) and bool((grad[nm] > 0).all())
        for i, (pos, neg) in enumerate(ROWS):
            for p in pos:
                t = s.clone()
                t[i, p] += 0.5
                assert compute(name, t, pm, nm)[i] < base[i]
            for n in neg:
                t = s.clone()
                t[i, n] += 0.5
                assert compute(name, t, pm, nm)[i] > base[i]


def test_lsepair_gradient_matches_formula():
    """d/ds_p log(1+S) = −Σ_n exp(s_n−s_p)/(1+S); d/ds_n = Σ_p exp(s_n−s_p)/(1+S)."""
    s = torch.tensor([SCORES[1]], requires_grad=True)
    pos, neg = ROWS[1]
    pm, nm = masks(6, [ROWS[1]])
    compute("lsepair", s, pm, nm).sum().backward()
    v = SCORES[1]
    big_s = sum(math.exp(v[n] - v[p]) for p in pos for n in neg)
    for p in pos:
        assert s.grad[0, p].item() == pytest.approx(-sum(math.exp(v[n] - v[p]) for n in neg) / (1 + big_s), rel=1e-5)
    for n in neg:
        assert s.grad[0, n].item() == pytest.approx(sum(math.exp(v[n] - v[p]) for p in pos) / (1 + big_s), rel=1e-5)


def _recontriever_manual(s: torch.Tensor, pos: list[int], neg: list[int], detach: bool) -> torch.Tensor:
    sp = s[pos]
    w = torch.softmax(sp.detach() if detach else sp, dim=0)
    lse_n = torch.logsumexp(s[neg], dim=0)
    log_p = sp - torch.logaddexp(sp, lse_n)
    return -(w * log_p).sum()


def test_recontriever_weights_are_detached():
    v = SCORES[1]
    pos, neg = ROWS[1]
    pm, nm = masks(6, [ROWS[1]])

    s = torch.tensor([v], requires_grad=True)
    compute("recontriever", s, pm, nm).sum().backward()
    got = s.grad[0]

    s_man = torch.tensor(v, dtype=torch.float64, requires_grad=True)
    _recontriever_manual(s_man, pos, neg, detach=True).backward()
    torch.testing.assert_close(got.double(), s_man.grad, rtol=1e-5, atol=1e-6)

    s_nd = torch.tensor(v, dtype=torch.float64, requires_grad=True)
    _recontriever_manual(s_nd, pos, neg, detach=False).backward()
    assert not torch.allclose(got.double(), s_nd.grad, atol=1e-3)

    # closed form with constant weights: d/ds_p = −w_p (1 − P_p),  P_p = e^{s_p} / (e^{s_p} + Σ_n e^{s_n})
    zp = sum(math.exp(v[p]) for p in pos)
    zn = sum(math.exp(v[n]) for n in neg)
    for p in pos:
        w = math.exp(v[p]) / zp
        prob = math.exp(v[p]) / (math.exp(v[p]) + zn)
        assert got[p].item() == pytest.approx(-w * (1 - prob), rel=1e-5)
    for n in neg:
        expected = sum(math.exp(v[p]) / zp * math.exp(v[n]) / (math.exp(v[p]) + zn) for p in pos)
        assert got[n].item() == pytest.approx(expected, rel=1e-5)
    # values agree too
    assert compute("recontriever", s.detach(), pm, nm).item() == pytest.approx(
        _recontriever_manual(torch.tensor(v, dtype=torch.float64), pos, neg, True).item(), rel=1e-6)


def test_jointlh_gradient_formula():
    """d/ds_j of −1/|D+| Σ_p log P(p) is P(j) − [j ∈ D+]/|D+| over the pool, 0 outside it."""
    s = torch.tensor([SCORES[0]], requires_grad=True)
    pm, nm = masks(6, [ROWS[0]])
    compute("jointlh", s, pm, nm).sum().backward()
    v = SCORES[0]
    pool = ROWS[0][0] + ROWS[0][1]
    z = sum(math.exp(v[j]) for j in pool)
    for j in range(6):
        expected = (math.exp(v[j]) / z - (0.5 if j in ROWS[0][0] else 0.0)) if j in pool else 0.0
        assert s.grad[0, j].item() == pytest.approx(expected, abs=1e-6)


# --------------------------------------------------------------------------------------------
# Errors.
# --------------------------------------------------------------------------------------------

def test_unknown_name_lists_allowed_names():
    s = torch.zeros(1, 3)
    pm = torch.tensor([[True, False, False]])
    with pytest.raises(ValueError) as exc:
        compute("infonce_typo", s, pm)
    msg = str(exc.value)
    assert "infonce_typo" in msg
    for name in ALL:
        assert name in msg
    with pytest.raises(ValueError, match="lsepair"):
        ContrastiveLoss("nope")
    with pytest.raises(ValueError):
        losses.check_name("LSEPair")  # names are case-sensitive
    assert losses.check_name("lsepair") == "lsepair"
    assert set(losses.OBJECTIVES) == set(ALL)


@pytest.mark.parametrize("name", ALL)
def test_row_without_positive_raises(name):
    s = torch.zeros(3, 4)
    pm = torch.tensor([[True, False, False, False], [False] * 4, [False, True, False, False]])
    with pytest.raises(ValueError, match=r"\[1\]"):
        compute(name, s, pm)
    with pytest.raises(ValueError):
        compute(name, s, pm, ~pm)


@pytest.mark.parametrize("name", ["jointlh", "lsepair"])
def test_shape_mismatch_raises(name):
    s = torch.zeros(2, 4)
    good = torch.tensor([[True, False, False, False]] * 2)
    with pytest.raises(ValueError, match="positive_mask"):
        compute(name, s, torch.ones(2, 5, dtype=torch.bool))
    with pytest.raises(ValueError, match="positive_mask"):
        compute(name, s, torch.ones(3, 4, dtype=torch.bool))
    with pytest.raises(ValueError, match="negative_mask"):
        compute(name, s, good, torch.zeros(2, 3, dtype=torch.bool))
    with pytest.raises(ValueError, match="scores"):
        compute(name, torch.zeros(4), good[0])
    with pytest.raises(ValueError, match="scores"):
        compute(name, torch.zeros(1, 2, 4), good[None])


@pytest.mark.parametrize("dtype", [torch.long, torch.uint8, torch.float32])
def test_non_bool_masks_raise_value_error(dtype):
    s = torch.zeros(2, 4)
    good = torch.tensor([[True, False, False, False], [False, True, False, False]])
    with pytest.raises(ValueError, match="negative_mask"):
        compute("jointlh", s, good, (~good).to(dtype))
    with pytest.raises(ValueError, match="positive_mask"):
        compute("jointlh", s, good.to(dtype), ~good)


@pytest.mark.parametrize("dtype", [torch.long, torch.uint8, torch.float32])
def test_non_bool_positive_mask_with_default_negatives_raises_value_error(dtype):
    """Documented: non-boolean masks raise ValueError — also when negative_mask is left to default."""
    s = torch.zeros(2, 4)
    good = torch.tensor([[True, False, False, False], [False, True, False, False]])
    with pytest.raises(ValueError, match="positive_mask"):
        compute("jointlh", s, good.to(dtype))


# --------------------------------------------------------------------------------------------
# ContrastiveLoss module.
# --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", MULTI)
def test_contrastive_loss_is_mean_of_compute(name):
    s = torch.tensor(SCORES, requires_grad=True)
    pm, nm = masks(6, ROWS)
    module = ContrastiveLoss(name)
    out = module(s, pm, nm)
    assert out.dim() == 0 and out.dtype == torch.float32
    expected = sum(ref(name, SCORES[i], *ROWS[i]) for i in range(3)) / 3
    assert out.item() == pytest.approx(expected, rel=1e-5)
    torch.testing.assert_close(out, compute(name, s, pm, nm).mean())
    out.backward()
    assert torch.isfinite(s.grad).all()
    normed = ContrastiveLoss(name, normalize_by_positives=True)(s, pm, nm)
    torch.testing.assert_close(normed, compute(name, s, pm, nm, normalize_by_positives=True).mean())


def test_single_positive_rule_lives_in_the_module_table():
    """Which positive SingleLH / Rand1LH keep is read from ``SINGLE_POSITIVE`` (by the training-stage
    plan), not asked of the loss module."""
    assert losses.SINGLE_POSITIVE == {"singlelh": "first", "rand1lh": "random"}
    assert set(losses.SINGLE_POSITIVE) <= set(losses.OBJECTIVES)
    assert not hasattr(ContrastiveLoss("singlelh"), "single_positive")
    assert ContrastiveLoss("lsepair").name == "lsepair"


@pytest.mark.parametrize("name", ["singlelh", "rand1lh"])
def test_single_positive_objectives_reject_several_positives(name):
    pm = torch.tensor([[True, True, False, False]])
    with pytest.raises(ValueError, match="one positive"):
        compute(name, torch.zeros(1, 4), pm)
