"""Training stages: a run is an ordered list of stages, each a regime, an objective and a number of epochs.

``conf/regime/<name>.yaml`` holds the plan, which is where a run's regime is set: one stage of that regime
(``regime=homogeneous|heterogeneous|gold|all``), or ``regime=curriculum`` for the paper's curriculum (Sec. 5
"Curriculum"). Each stage names:

* ``regime`` — which positives the data side uses (:data:`multipos.data.groups.REGIMES`);
* ``objective`` — the contrastive objective (:data:`multipos.losses.OBJECTIVES`);
* ``epochs`` — passes over the stage's training queries (0 skips the stage);
* ``single_positive`` — ``auto`` (the objective's rule: SingleLH trains on the first positive, Rand1LH on one
  drawn per epoch, the rest on up to M), or explicitly ``first`` | ``random`` | ``none``. The stage, not the
  objective object, tells the data side what to select;
* ``optimizer`` — ``fresh`` (new AdamW state, as a separate fine-tuning run) or ``carry`` (keep the moments
  of the previous stage); ignored for the first stage;
* ``lr_schedule`` — ``restart`` (warm-up and decay over this stage's steps) or ``continue`` (one schedule over
  all stages that continue each other, picking up where the previous stage stopped);
* ``lr`` — peak learning rate of the stage (``null`` = ``module.optimizer.lr``);
* ``keep`` — which weights the next stage starts from and the run keeps: ``best`` (best dev checkpoint of
  the stage, when a validation set is configured) or ``last`` (the stage then runs no dev retrieval: there
  is nothing to select, which saves one corpus encoding per epoch).

The paper's curriculum is two stages: silver positives with the chosen objective, then gold positives with
SingleLH for one epoch, with a fresh optimizer and a restarted schedule.
"""

from __future__ import annotations

import logging
from dataclasses import asdict, dataclass
from typing import Any, Mapping

from multipos.data.groups import REGIMES
from multipos.losses import SINGLE_POSITIVE, check_name

log = logging.getLogger(__name__)

SINGLE_POSITIVE_CHOICES = ("auto", "first", "random", "none")
OPTIMIZER_CHOICES = ("fresh", "carry")
SCHEDULE_CHOICES = ("restart", "continue")
KEEP_CHOICES = ("best", "last")
#: The value a stage field takes when it is left out or null ({field: default}; :func:`make_stage`).
DEFAULTS = {"optimizer": "fresh", "lr_schedule": "restart", "lr": None, "keep": "best"}
FIELDS = ("regime", "objective", "epochs", "single_positive", "optimizer", "lr_schedule", "lr", "keep")


@dataclass(frozen=True)
class Stage:
    """One training stage, validated (see the module docstring for each field)."""

    name: str
    regime: str
    objective: str
    epochs: int
    single_positive: str | None = None  # resolved: None (multi-positive), "first" or "random"
    optimizer: str = DEFAULTS["optimizer"]
    lr_schedule: str = DEFAULTS["lr_schedule"]
    lr: float | None = DEFAULTS["lr"]
    keep: str = DEFAULTS["keep"]

    def describe(self) -> dict:
        """Plain dict of the stage (logged and written to ``run_info.json``)."""
        return asdict(self)


def _choice(stage: str, field: str, value: Any, allowed: tuple[str, ...]) -> str:
    if value not in allowed:
        raise ValueError(f"stages.{stage}.{field}={value!r} is not allowed; choose one of: {', '.join(allowed)}")
    return value


def make_stage(name: str, spec: Mapping[str, Any]) -> Stage:
    """Validate one ``stages.<name>`` config node into a :class:`Stage`.

    Raises:
        ValueError: an unknown field, regime, objective or choice (the message names ``stages.<name>.<field>``
            and lists the allowed values), or negative epochs.
    """
    unknown = set(spec) - set(FIELDS)
    if unknown:
        raise ValueError(f"stages.{name}: unknown fields {sorted(unknown)}; allowed: {', '.join(FIELDS)}")
    for required in ("regime", "objective", "epochs"):
        if spec.get(required) is None:
            raise ValueError(f"stages.{name}.{required} is required")
    regime = _choice(name, "regime", spec["regime"], REGIMES)
    try:
        objective = check_name(str(spec["objective"]))
    except ValueError as e:
        raise ValueError(f"stages.{name}.objective: {e}") from None
    epochs = int(spec["epochs"])
    if epochs < 0:
        raise ValueError(f"stages.{name}.epochs must be >= 0, got {epochs}")
    single = _choice(name, "single_positive", spec.get("single_positive") or "auto", SINGLE_POSITIVE_CHOICES)
    if single == "auto":
        single = SINGLE_POSITIVE.get(objective)
    elif single == "none":
        if objective in SINGLE_POSITIVE:
            raise ValueError(f"stages.{name}: objective {objective!r} trains on one positive per query; "
                             "single_positive=none is not possible (use auto, first or random)")
        single = None
    lr = spec.get("lr")
    if lr is not None and float(lr) <= 0:
        raise ValueError(f"stages.{name}.lr must be > 0, got {lr}")
    return Stage(
        name=name, regime=regime, objective=objective, epochs=epochs, single_positive=single,
        optimizer=_choice(name, "optimizer", spec.get("optimizer") or DEFAULTS["optimizer"], OPTIMIZER_CHOICES),
        lr_schedule=_choice(name, "lr_schedule", spec.get("lr_schedule") or DEFAULTS["lr_schedule"], SCHEDULE_CHOICES),
        lr=None if lr is None else float(lr),
        keep=_choice(name, "keep", spec.get("keep") or DEFAULTS["keep"], KEEP_CHOICES),
    )


def plan(stages: Mapping[str, Mapping[str, Any]]) -> list[Stage]:
    """The ordered, validated stage list of a ``stages`` config node ({name: spec}, in file order).

    Raises ValueError for an empty plan or an invalid stage (see :func:`make_stage`), or when every stage
    has 0 epochs (evaluating trained weights is ``evaluate.py``'s job).
    """
    if not stages:
        raise ValueError("stages: the plan is empty; choose one with regime=<name> (conf/regime)")
    out = [make_stage(str(name), dict(spec)) for name, spec in stages.items()]
    if not any(s.epochs for s in out):
        raise ValueError("stages: every stage has 0 epochs, nothing to train (to evaluate trained weights: "
                         "python evaluate.py init_from=<model folder> eval=<set>)")
    return out


def schedule_spans(stages: list[Stage], steps_per_stage: list[int]) -> list[tuple[int, int]]:
    """Per stage, (offset, total) of its learning-rate schedule in optimizer steps.

    A ``restart`` stage has its own schedule (offset 0, total = its steps); a ``continue`` stage extends
    the schedule of the stage before it: every stage in a chain of ``continue`` stages shares one total
    (the chain's steps) and starts at the steps already taken in the chain.
    """
    if len(stages) != len(steps_per_stage):
        raise ValueError("one step count per stage is needed")
    spans: list[tuple[int, int]] = []
    chain: list[int] = []  # indices of the current chain
    for i, stage in enumerate(stages):
        if i == 0 or stage.lr_schedule == "restart":
            chain = [i]
        else:
            chain.append(i)
        spans.append((0, 0))
        total = sum(steps_per_stage[j] for j in chain)
        offset = 0
        for j in chain:
            spans[j] = (offset, total)
            offset += steps_per_stage[j]
    return spans
