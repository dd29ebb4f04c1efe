"""Stage plans (multipos.training.stages) and their learning-rate schedules across stages (multipos.training.module)."""

from __future__ import annotations

import pytest
import torch

from multipos.training.module import RetrieverModule, StageSettings, linear_warmup_decay
from multipos.training.stages import make_stage, plan, schedule_spans
from tests.helpers import compose_cfg


def test_single_positive_comes_from_the_stage_plan():
    assert make_stage("a", dict(regime="gold", objective="singlelh", epochs=1)).single_positive == "first"
    assert make_stage("a", dict(regime="gold", objective="rand1lh", epochs=1)).single_positive == "random"
    assert make_stage("a", dict(regime="gold", objective="lsepair", epochs=1)).single_positive is None
    # explicit: a multi-positive objective on one drawn positive
    assert make_stage("a", dict(regime="gold", objective="jointlh", epochs=1,
                                single_positive="random")).single_positive == "random"


@pytest.mark.parametrize("spec,match", [
    (dict(regime="silver", objective="lsepair", epochs=1), r"stages\.s\.regime.*homogeneous"),
    (dict(regime="gold", objective="lsepairr", epochs=1), r"stages\.s\.objective.*lsepair"),
    (dict(regime="gold", objective="lsepair", epochs=-1), r"stages\.s\.epochs"),
    (dict(regime="gold", objective="lsepair", epochs=1, optimizer="reset"), r"stages\.s\.optimizer.*fresh, carry"),
    (dict(regime="gold", objective="lsepair", epochs=1, lr_schedule="keep"), r"lr_schedule.*restart, continue"),
    (dict(regime="gold", objective="singlelh", epochs=1, single_positive="none"), "one positive"),
    (dict(regime="gold", objective="lsepair", epochs=1, colour="red"), r"unknown fields \['colour'\]"),
    (dict(regime="gold", epochs=1), r"stages\.s\.objective is required"),
])
def test_invalid_stages_name_the_field(spec, match):
    with pytest.raises(ValueError, match=match):
        make_stage("s", spec)


def test_empty_or_zero_epoch_plans_are_rejected():
    with pytest.raises(ValueError, match="empty"):
        plan({})
    with pytest.raises(ValueError, match="0 epochs"):
        plan({"a": dict(regime="gold", objective="lsepair", epochs=0)})


def test_curriculum_config_is_two_stages_with_configurable_second_objective():
    cfg = compose_cfg("train", ["experiment=base", "regime=curriculum", "loss=jointlh",
                                "stages.gold.objective=summarglh",
                                "stages.gold.epochs=2", "trainer.max_epochs=3"])
    silver, gold = plan(cfg.stages)
    assert (silver.regime, silver.objective, silver.epochs) == ("homogeneous", "jointlh", 3)
    assert (gold.regime, gold.objective, gold.epochs, gold.optimizer, gold.lr_schedule) == (
        "gold", "summarglh", 2, "fresh", "restart")
    default = plan(compose_cfg("train", ["experiment=base", "regime=curriculum"]).stages)
    assert default[1].objective == "singlelh"  # the paper's stage 2


def test_schedule_spans_restart_and_continue():
    stages = [make_stage("a", dict(regime="homogeneous", objective="lsepair", epochs=1)),
              make_stage("b", dict(regime="gold", objective="singlelh", epochs=1)),
              make_stage("c", dict(regime="gold", objective="singlelh", epochs=1, lr_schedule="continue"))]
    assert schedule_spans(stages, [10, 4, 6]) == [(0, 10), (0, 10), (4, 10)]


def _lrs(module: RetrieverModule, steps: int, fit_steps: int) -> list[float]:
    class _T:  # the attribute RetrieverModule reads from its trainer
        estimated_stepping_batches = fit_steps

    module._trainer = _T()  # noqa: SLF001 - a bare stand-in, no Lightning loop needed
    conf = module.configure_optimizers()
    opt, sched = conf["optimizer"], conf["lr_scheduler"]["scheduler"]
    out = []
    for _ in range(steps):
        out.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    return out


def _module(**stage) -> RetrieverModule:
    """A module over a bare linear layer, built as training builds it (:meth:`RetrieverModule.from_config`) with the
    stage's settings ``stage`` (:class:`multipos.training.module.StageSettings` fields)."""
    from functools import partial

    model = torch.nn.Linear(2, 2)
    return RetrieverModule.from_config(model, None, optimizer=partial(torch.optim.AdamW, lr=1.0),
                                       scheduler=linear_warmup_decay, warmup_ratio=0.0, stage=StageSettings(**stage))


def test_continued_schedule_picks_up_where_the_previous_stage_stopped():
    whole = _lrs(_module(), 10, 10)
    first = _lrs(_module(schedule_offset=0, schedule_total=10), 4, 4)
    second = _lrs(_module(schedule_offset=4, schedule_total=10), 6, 6)
    assert first + second == pytest.approx(whole)
    restarted = _lrs(_module(), 6, 6)
    assert restarted[0] == pytest.approx(1.0) and second[0] == pytest.approx(0.6)


def test_stage_lr_and_carried_optimizer_state():
    m = _module(lr=0.5)
    assert _lrs(m, 1, 1)[0] == pytest.approx(0.5)  # the stage's peak lr replaces the optimizer config's
    src = torch.optim.AdamW(m.parameter_groups(), lr=1.0)
    m.model(torch.ones(1, 2)).sum().backward()
    src.step()
    carried = _module(optimizer_state=src.state_dict(), lr=0.25)
    carried._trainer = type("T", (), {"estimated_stepping_batches": 1})()  # noqa: SLF001
    new_opt = carried.configure_optimizers()["optimizer"]
    state = next(iter(new_opt.state.values()))
    assert int(state["step"]) == 1  # AdamW moments carried over
    assert new_opt.param_groups[0]["lr"] == pytest.approx(0.25)  # not the previous stage's last lr
