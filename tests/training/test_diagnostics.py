"""Gradient diagnostics (paper Sec. 3.3, App. A): closed forms vs autograd, the logged numbers on a hand-made batch,
and the callback in a tiny training run."""

from __future__ import annotations

import csv
import math
import warnings
from types import SimpleNamespace

import pytest
import torch

from multipos.train import train
from multipos.training.callbacks import GradientDiagnostics
from multipos.training.diagnostics import (
    CLOSED_FORMS,
    batch_diagnostics,
    closed_form_gradient,
    objective_gradient,
    positive_gradient_stats,
    score_statistics,
)
from tests.helpers import compose_cfg, tiny_overrides

# One query, hand-made: positives scored 3, 1, 0 (columns 0-2), negatives 2 and −1 (columns 3-4), column 5 ignored
# (a false negative: in neither mask).
SCORES = torch.tensor([[3.0, 1.0, 0.0, 2.0, -1.0, 5.0]], dtype=torch.float64)
POS = torch.tensor([[True, True, True, False, False, False]])
NEG = torch.tensor([[False, False, False, True, True, False]])
S_POS, S_NEG = [3.0, 1.0, 0.0], [2.0, -1.0]


def _pool_probabilities() -> list[float]:
    z = sum(math.exp(s) for s in S_POS + S_NEG)
    return [math.exp(s) / z for s in S_POS]


def _hand_pulls(name: str) -> list[float]:
    """−∂L/∂s_p of each positive from App. A, written out with plain floats."""
    p = _pool_probabilities()
    if name == "jointlh":
        return [1 / 3 - pi for pi in p]
    if name == "summarglh":
        return [pi / sum(p) - pi for pi in p]
    pairs = sum(math.exp(n - q) for q in S_POS for n in S_NEG)
    return [sum(math.exp(n - sp) for n in S_NEG) / (1 + pairs) for sp in S_POS]


@pytest.mark.parametrize("name", sorted(CLOSED_FORMS))
def test_closed_forms_match_autograd_and_hand_values(name):
    torch.manual_seed(0)
    scores = torch.randn(5, 16, dtype=torch.float64) * 4
    pos = torch.zeros(5, 16, dtype=torch.bool)
    for i, n in enumerate((1, 2, 3, 4, 8)):
        pos[i, 2 * i: 2 * i + n] = True
    neg = ~pos
    neg[0, 15] = neg[3, 0] = False  # false negatives: ignored columns
    auto = objective_gradient(name, scores, pos, neg)
    closed = closed_form_gradient(name, scores, pos, neg)
    assert torch.allclose(auto, closed, rtol=0, atol=1e-12)
    assert torch.all(closed[~(pos | neg)] == 0)
    hand = closed_form_gradient(name, SCORES, POS, NEG)[0, :3]
    assert hand.tolist() == pytest.approx([-g for g in _hand_pulls(name)], abs=1e-12)


@pytest.mark.parametrize("name", sorted(CLOSED_FORMS))
def test_logged_shares_and_rank_match_closed_forms(name):
    values = batch_diagnostics(SCORES, POS, NEG, [name])
    pulls = _hand_pulls(name)
    total = sum(abs(g) for g in pulls)
    assert values[f"diag/{name}/grad_share_top"] == pytest.approx(pulls[0] / total, abs=1e-12)
    assert values[f"diag/{name}/grad_share_weakest"] == pytest.approx(pulls[2] / total, abs=1e-12)
    ranks = [0.0, 0.5, 1.0]  # positives 3, 1, 0 ranked top to weakest, rank / (|D+| − 1)
    assert values[f"diag/{name}/grad_rank"] == pytest.approx(sum(abs(g) * r for g, r in zip(pulls, ranks)) / total)


def test_the_three_behaviours_of_section_3_3():
    """SumMargLH weights the top positive most, LSEPair the weakest, JointLH pushes the top one down toward 1/|D+|."""
    v = batch_diagnostics(SCORES, POS, NEG, ["jointlh", "summarglh", "lsepair"])
    assert v["diag/summarglh/grad_share_top"] > 0.5 and v["diag/summarglh/grad_rank"] < 0.5
    assert v["diag/lsepair/grad_share_weakest"] > 0.5 and v["diag/lsepair/grad_rank"] > 0.5
    assert _pool_probabilities()[0] > 1 / 3 and v["diag/jointlh/grad_share_top"] < 0  # pushed down, toward 1/|D+|


def test_score_statistics_by_hand():
    stats = score_statistics(SCORES, POS, NEG)
    within = [math.exp(s) / sum(math.exp(t) for t in S_POS) for s in S_POS]
    assert stats["pos_entropy"] == pytest.approx(-sum(q * math.log(q) for q in within))
    assert stats["pos_entropy_max"] == pytest.approx(math.log(3))
    assert stats["p_pos"] == pytest.approx(sum(_pool_probabilities()) / 3)
    assert stats["p_pos_uniform"] == pytest.approx(1 / 3)
    assert stats["margin"] == pytest.approx(sum(S_POS) / 3 - sum(S_NEG) / 2)
    assert stats["false_negative_fraction"] == pytest.approx(1 / 6)


def test_single_positive_rows_give_no_gradient_shares():
    pos = torch.tensor([[True, False, False]])
    grad = objective_gradient("lsepair", torch.tensor([[1.0, 0.0, 2.0]]), pos, ~pos)
    assert positive_gradient_stats(grad, torch.tensor([[1.0, 0.0, 2.0]]), pos) == {}
    assert "diag/lsepair/grad_share_top" not in batch_diagnostics(torch.tensor([[1.0, 0.0, 2.0]]), pos, ~pos,
                                                                  ["lsepair"])


def test_bad_input_is_rejected():
    with pytest.raises(ValueError, match="positive_mask"):
        score_statistics(SCORES, POS.int(), NEG)
    with pytest.raises(ValueError, match="no positive"):
        score_statistics(SCORES, torch.zeros_like(POS), NEG)
    with pytest.raises(ValueError, match="closed-form"):
        closed_form_gradient("recontriever", SCORES, POS, NEG)
    with pytest.raises(ValueError, match="every_n_steps"):
        GradientDiagnostics(every_n_steps=0)
    with pytest.raises(ValueError, match="one positive"):
        GradientDiagnostics(objectives=["singlelh"])
    with pytest.raises(ValueError, match="allowed"):
        GradientDiagnostics(objectives=["nope"])


def _fake(step: int, log_every: int = 1):
    logged = {}
    trainer = SimpleNamespace(global_step=step, log_every_n_steps=log_every)
    module = SimpleNamespace(loss=SimpleNamespace(name="summarglh", normalize_by_positives=False),
                             log=lambda k, v, **kw: logged.__setitem__(k, v))
    return trainer, module, logged


def test_callback_logs_every_n_steps_and_skips_bare_tensors():
    cb = GradientDiagnostics(every_n_steps=2, objectives=["lsepair"])
    trainer, module, logged = _fake(step=1)
    cb.setup(trainer, module, "fit")
    outputs = {"loss": torch.tensor(1.0), "scores": SCORES.float(), "positive_mask": POS, "negative_mask": NEG}
    cb.on_train_batch_end(trainer, module, outputs, None, 0)
    assert logged == {}  # step 1 is not a multiple of 2
    trainer.global_step = 2
    cb.on_train_batch_end(trainer, module, outputs, None, 1)
    assert {"diag/summarglh/grad_share_top", "diag/lsepair/grad_rank", "diag/margin"} <= set(logged)
    assert logged["diag/summarglh/grad_share_top"] == pytest.approx(batch_diagnostics(
        SCORES, POS, NEG, ["summarglh"])["diag/summarglh/grad_share_top"], rel=1e-6)
    logged.clear()
    trainer.global_step = 4
    with pytest.warns(UserWarning, match="Tensor"):
        cb.on_train_batch_end(trainer, module, torch.tensor(1.0), None, 2)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # warned once only
        trainer.global_step = 6
        cb.on_train_batch_end(trainer, module, torch.tensor(1.0), None, 3)
    assert logged == {}


def test_interval_is_raised_to_a_multiple_of_the_log_interval():
    cb = GradientDiagnostics(every_n_steps=4)
    trainer, module, _ = _fake(step=0, log_every=6)
    with pytest.warns(UserWarning, match="every 12 steps"):
        cb.setup(trainer, module, "fit")
    assert cb._interval == 12


def test_tiny_training_run_logs_diagnostics_to_csv(tiny_beir, tiny_bert, tmp_path):
    out = tmp_path / "run"
    cfg = compose_cfg("train", ["loss=lsepair", "callbacks=diagnostics",
                                "callbacks.gradient_diagnostics.every_n_steps=1",
                                *tiny_overrides(tiny_beir, tiny_bert, out), "eval.references=false"])
    train(cfg)
    rows = list(csv.DictReader((out / "csv" / "metrics.csv").open()))
    diag = [r for r in rows if r.get("diag/lsepair/grad_share_top")]
    assert diag, f"no diagnostics in {out / 'csv' / 'metrics.csv'}"
    for key in ("diag/jointlh/grad_rank", "diag/summarglh/grad_share_weakest", "diag/pos_entropy", "diag/p_pos_uniform",
                "diag/false_negative_fraction"):
        assert all(math.isfinite(float(r[key])) for r in diag), key
    assert all(-1.0 <= float(r["diag/lsepair/grad_share_top"]) <= 1.0 for r in diag)
