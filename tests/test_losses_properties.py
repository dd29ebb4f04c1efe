"""Property-based tests (hypothesis) for ``multipos.losses`` over random shapes, masks and scores.

Cases: B ∈ [1, 6] queries, N ∈ [2, 24] columns, each column of each row a positive, a negative or
ignored (in neither mask), every row with at least one positive. A row may have no negative at all:
``compute`` accepts that for every objective (documented: loss 0, except JointLH, which becomes the
likelihood over D+ alone), so those rows are generated too. SingleLH / Rand1LH get one-positive masks.

Expected gradients are the paper's closed forms (App. A), written once below as small helpers with
naive ``exp`` sums, never with the implementation under test.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from multipos.losses import OBJECTIVES, SINGLE_POSITIVE, compute

NAMES = sorted(OBJECTIVES)
MULTI = [n for n in NAMES if n not in SINGLE_POSITIVE]
# Module docstring: "With |D+| = 1 every objective except the maxn variants equals InfoNCE."
MAXN = ["lsepair_maxn", "lsepair_minp_maxn"]
EQUAL_INFONCE_1POS = [n for n in NAMES if n not in MAXN]
DTYPES = [torch.float32, torch.bfloat16, torch.float64]

IGN, POS, NEG = 0, 1, 2
BIG = 1.0e4  # score range for the robustness properties
MODERATE = 20.0  # score range for the closed forms (naive exp sums stay finite in float64)

# No example database: it would write .hypothesis/ into the working tree. Budget: the whole file
# runs in well under 30 s on a loaded 2-core machine; tests parametrised over the 10 objectives draw
# fewer examples each than the single ones.
_COMMON = dict(deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
FAST = settings(max_examples=15, **_COMMON)  # per objective
MORE = settings(max_examples=60, **_COMMON)  # one test over all objectives / the closed forms

# s_n − s_p = 20.5, just above F.softplus's threshold=20, where softplus returns x and drops
# exp(−20.5) ≈ 1.2e-9 from the value and the gradient; random draws rarely land in that window.
# Column 2 is ignored.
SOFTPLUS_WINDOW = (torch.tensor([[0.0, 20.5, -3.0]], dtype=torch.float64),
                   torch.tensor([[True, False, False]]), torch.tensor([[False, True, False]]))


@st.composite
def cases(draw, *, one_positive: bool = False, max_abs: float = BIG):
    """(scores [B, N] float64, positive_mask, negative_mask); scores are float32-representable."""
    b = draw(st.integers(1, 6))
    n = draw(st.integers(2, 24))
    scores = draw(hnp.arrays(np.float64, (b, n),
                             elements=st.floats(-max_abs, max_abs, allow_nan=False, width=32)))
    roles = draw(hnp.arrays(np.int8, (b, n), elements=st.sampled_from([IGN, NEG] if one_positive else [IGN, POS, NEG])))
    anchors = draw(hnp.arrays(np.int64, (b,), elements=st.integers(0, n - 1)))
    roles[np.arange(b), anchors] = POS  # ≥ 1 positive per row (exactly 1 with one_positive)
    return torch.from_numpy(scores), torch.from_numpy(roles == POS), torch.from_numpy(roles == NEG)


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """The documented rule: the wider of float32 and the input dtype."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def tolerance(dtype: torch.dtype, scores: torch.Tensor) -> dict[str, float]:
    """Rounding tolerance for the loss computed in ``compute_dtype(dtype)``.

    Losses are differences of log-sum-exps of the scores, so their absolute rounding error scales with
    the largest |score| (catastrophic cancellation), not with the loss value.
    """
    eps = torch.finfo(compute_dtype(dtype)).eps
    return {"rtol": 64 * eps, "atol": 64 * eps * (1.0 + float(scores.detach().abs().max()))}


# --------------------------------------------------------------------------------------------
# Closed-form gradients (paper, App. A). P = softmax over the pool D = D+ ∪ D−; columns in neither
# mask get gradient 0. Naive exp sums: only for moderate scores (|s| ≤ 20).
# --------------------------------------------------------------------------------------------

def _exp_on(s: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return torch.where(mask, torch.exp(s), torch.zeros_like(s))


def grad_jointlh(s: torch.Tensor, pm: torch.Tensor, nm: torch.Tensor) -> torch.Tensor:
    """JointLH, paper App. A: ∂L/∂s_p = P(p) − 1/|D+| for p ∈ D+;  ∂L/∂s_n = P(n) for n ∈ D−."""
    e = _exp_on(s, pm | nm)
    prob = e / e.sum(-1, keepdim=True)
    return prob - pm.to(s.dtype) / pm.sum(-1, keepdim=True).to(s.dtype)


def grad_summarglh(s: torch.Tensor, pm: torch.Tensor, nm: torch.Tensor) -> torch.Tensor:
    """SumMargLH, paper App. A: ∂L/∂s_p = P(p) − Q(p), Q(p) = exp(s_p) / Σ_{p'∈D+} exp(s_p');
    ∂L/∂s_n = P(n)."""
    e = _exp_on(s, pm | nm)
    prob = e / e.sum(-1, keepdim=True)
    ep = _exp_on(s, pm)
    return prob - ep / ep.sum(-1, keepdim=True)


def grad_lsepair(s: torch.Tensor, pm: torch.Tensor, nm: torch.Tensor) -> torch.Tensor:
    """LSEPair, paper App. A: with S = Σ_{p,n} exp(s_n − s_p) and L = log(1 + S):
    ∂L/∂s_p = −exp(−s_p) Σ_n exp(s_n) / (1 + S);  ∂L/∂s_n = exp(s_n) Σ_p exp(−s_p) / (1 + S)."""
    e_neg = _exp_on(s, nm)  # exp(s_n)
    e_pos_inv = _exp_on(-s, pm)  # exp(−s_p)
    sum_neg = e_neg.sum(-1, keepdim=True)
    sum_pos_inv = e_pos_inv.sum(-1, keepdim=True)
    one_plus_s = 1.0 + sum_neg * sum_pos_inv
    return (-e_pos_inv * sum_neg + e_neg * sum_pos_inv) / one_plus_s


CLOSED_FORMS = {"jointlh": grad_jointlh, "summarglh": grad_summarglh, "lsepair": grad_lsepair}


# --------------------------------------------------------------------------------------------
# Robustness: finite values and gradients for |s| ≤ 1e4 in every dtype.
# --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", NAMES)
@FAST
@given(data=st.data())
def test_finite_values_and_gradients(name, data):
    scores, pm, nm = data.draw(cases(one_positive=name in SINGLE_POSITIVE))
    for dtype in DTYPES:
        leaf = scores.to(dtype).requires_grad_(True)
        out = compute(name, leaf, pm, nm)
        assert out.shape == (scores.shape[0],)
        assert out.dtype == compute_dtype(dtype)
        assert torch.isfinite(out).all(), (dtype, out)
        assert bool((out >= -tolerance(dtype, scores)["atol"]).all()), (dtype, out)  # every loss is ≥ 0
        out.sum().backward()
        assert leaf.grad.dtype == dtype
        assert torch.isfinite(leaf.grad.float()).all(), (dtype, leaf.grad)
        assert bool((leaf.grad[~(pm | nm)] == 0).all()), (dtype, leaf.grad)  # ignored columns


# --------------------------------------------------------------------------------------------
# Permutation invariance: columns permuted together with both masks.
# --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", NAMES)
@FAST
@given(data=st.data())
def test_column_permutation_invariance(name, data):
    scores, pm, nm = data.draw(cases(one_positive=name in SINGLE_POSITIVE))
    perm = torch.tensor(data.draw(st.permutations(range(scores.shape[1]))))
    for dtype in DTYPES:
        s = scores.to(dtype)
        base = compute(name, s, pm, nm)
        permuted = compute(name, s[:, perm], pm[:, perm], nm[:, perm])
        torch.testing.assert_close(permuted, base, **tolerance(dtype, s.double()))


# --------------------------------------------------------------------------------------------
# |D+| = 1: the objectives reduce to InfoNCE, except the maxN variants (module docstring).
# --------------------------------------------------------------------------------------------

def _infonce_reference(s: torch.Tensor, pm: torch.Tensor, nm: torch.Tensor) -> torch.Tensor:
    """−log P(p | q) for the single positive p: log Σ_{d∈D} exp(s_d) − s_p, in float64."""
    pool = s.masked_fill(~(pm | nm), float("-inf"))
    return torch.logsumexp(pool, -1) - s[pm]


@MORE
@given(case=cases(one_positive=True))
@example(case=SOFTPLUS_WINDOW)
def test_one_positive_every_objective_is_infonce(case):
    scores, pm, nm = case
    expected64 = _infonce_reference(scores, pm, nm)
    for dtype in (torch.float32, torch.float64):
        s = scores.to(dtype)
        tol = tolerance(dtype, scores)
        for name in EQUAL_INFONCE_1POS:
            got = compute(name, s, pm, nm)
            torch.testing.assert_close(got.double(), expected64, **tol, msg=lambda m: f"{name} {dtype}: {m}")


@MORE
@given(case=cases(one_positive=True))
def test_one_positive_maxn_variants_keep_only_the_hardest_negative(case):
    """maxN with one positive: log(1 + exp(max_n s_n − s_p)) (0 without negatives) — the hardest-pair
    loss, never above InfoNCE, and equal to it only when there is at most one negative."""
    scores, pm, nm = case
    s_p = scores[pm]
    max_n = scores.masked_fill(~nm, float("-inf")).amax(-1)
    expected = torch.logaddexp(max_n - s_p, torch.zeros_like(s_p))  # −inf → 0
    infonce = _infonce_reference(scores, pm, nm)
    for dtype in (torch.float32, torch.float64):
        tol = tolerance(dtype, scores)
        s = scores.to(dtype)
        for name in MAXN:
            got = compute(name, s, pm, nm).double()
            torch.testing.assert_close(got, expected, **tol)
            assert bool((got <= infonce + tol["atol"] + tol["rtol"] * infonce.abs()).all())
            single_neg = nm.sum(-1) <= 1
            torch.testing.assert_close(got[single_neg], infonce[single_neg], **tol)


# --------------------------------------------------------------------------------------------
# Rows without negatives: the documented behaviour.
# --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", NAMES)
@FAST
@given(data=st.data())
def test_rows_without_negatives(name, data):
    """Loss 0 for every objective except JointLH, which is −1/|D+| Σ_p log softmax_{D+}(s)_p."""
    scores, pm, nm = data.draw(cases(one_positive=name in SINGLE_POSITIVE))
    none = torch.zeros_like(nm)
    got = compute(name, scores, pm, none)
    tol = tolerance(torch.float64, scores)
    if name == "jointlh":
        log_z = torch.logsumexp(scores.masked_fill(~pm, float("-inf")), -1, keepdim=True)
        expected = ((log_z - scores) * pm).sum(-1) / pm.sum(-1)
    else:
        expected = torch.zeros(scores.shape[0], dtype=torch.float64)
    torch.testing.assert_close(got, expected, **tol)


# --------------------------------------------------------------------------------------------
# Autograd = closed forms of App. A, float64, to 1e-9.
# --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", sorted(CLOSED_FORMS))
@MORE
@given(case=cases(max_abs=MODERATE))
@example(case=SOFTPLUS_WINDOW)
def test_gradient_matches_appendix_a_closed_form(name, case):
    scores, pm, nm = case
    leaf = scores.clone().requires_grad_(True)
    compute(name, leaf, pm, nm).sum().backward()
    expected = CLOSED_FORMS[name](scores, pm, nm)
    assert bool((expected[~(pm | nm)] == 0).all())
    torch.testing.assert_close(leaf.grad, expected, rtol=0.0, atol=1e-9)


# --------------------------------------------------------------------------------------------
# Dtype rule: computed and returned in the wider of float32 and the input dtype.
# --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", NAMES)
@FAST
@given(data=st.data())
def test_dtype_rule(name, data):
    scores, pm, nm = data.draw(cases(one_positive=name in SINGLE_POSITIVE))
    out64 = compute(name, scores, pm, nm)
    assert out64.dtype == torch.float64
    out32 = compute(name, scores.float(), pm, nm)
    assert out32.dtype == torch.float32
    # the float64 loss is the float32 one up to float32 rounding (the scores are fp32-representable)
    torch.testing.assert_close(out64, out32.double(), **tolerance(torch.float32, scores))
    for low in (torch.bfloat16, torch.float16):
        s = scores.to(low)
        out = compute(name, s, pm, nm)
        assert out.dtype == torch.float32
        # computed in float32 on the rounded scores, exactly
        torch.testing.assert_close(out, compute(name, s.float(), pm, nm), rtol=0.0, atol=0.0)


def test_float64_keeps_precision_float32_would_lose():
    """Scores 1 and 1 + 1e-9 coincide in float32; in float64 the InfoNCE loss log(1 + e^{1e-9})
    = log 2 + 5e-10 is resolved."""
    s = torch.tensor([[1.0, 1.0 + 1e-9]], dtype=torch.float64)
    pm = torch.tensor([[True, False]])
    expected = np.logaddexp(0.0, 1e-9)
    for name in EQUAL_INFONCE_1POS:
        got = compute(name, s, pm)
        assert got.dtype == torch.float64
        assert abs(got.item() - expected) < 1e-15, name
    assert compute("jointlh", s.float(), pm).item() == pytest.approx(np.log(2.0), abs=1e-7)
