"""A short recipe search on your data's dev split, within a wall-time budget (Optuna TPE).

Each trial is one query-side run of ``experiment=own_data`` (one seed, dev evaluation only) with a sampled objective,
learning rate, number of epochs and M; the study is stored in SQLite beside the trials, so a re-run continues it and
reads finished trials back instead of training them again. The search stops starting trials when the budget would be
exceeded by another trial of the median length so far (Optuna's ``timeout`` alone would start one at the last second).
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from pathlib import Path

__all__ = ["SEARCH_SPACE", "search", "suggest"]

log = logging.getLogger(__name__)

#: The axes of the search: the paper's five objectives, the learning rate, epochs and M (the main job's recipe search
#: on NFCorpus searched these and more, conf/experiment/nfcorpus_recipe_search.yaml).
SEARCH_SPACE = {
    "loss": ("singlelh", "rand1lh", "jointlh", "summarglh", "lsepair"),
    "module.optimizer.lr": (1e-5, 3e-4),
    "trainer.max_epochs": (1, 9),
    "data.max_positives": (2, 4, 8),
}


def suggest(trial, max_epochs: int | None = None) -> dict:
    """Overrides for one trial, drawn from :data:`SEARCH_SPACE` (epochs capped by ``max_epochs``)."""
    lo, hi = SEARCH_SPACE["trainer.max_epochs"]
    return {
        "loss": trial.suggest_categorical("loss", list(SEARCH_SPACE["loss"])),
        "module.optimizer.lr": trial.suggest_float("module.optimizer.lr", *SEARCH_SPACE["module.optimizer.lr"],
                                                   log=True),
        "trainer.max_epochs": trial.suggest_int("trainer.max_epochs", lo, min(hi, max_epochs or hi)),
        "data.max_positives": trial.suggest_categorical("data.max_positives", list(SEARCH_SPACE["data.max_positives"])),
    }


def search(run_trial: Callable[[dict, Path], float], folder: Path, budget_s: float, max_trials: int = 50,
           max_epochs: int | None = None, seed: int = 42) -> tuple[dict, float, list[dict]]:
    """Search recipes until ``budget_s`` seconds are spent or ``max_trials`` trials have run (both counted over
    every invocation: a re-run after an interruption only finishes what is left).

    Args:
        run_trial: trains one trial ``(overrides, run folder) -> dev value`` (higher is better).
        folder: where the trials' run folders (``trial-<n>``) and the study (``study.db``) live.
        budget_s: wall-time budget in seconds for this invocation.

    Returns:
        (best overrides, best dev value, every trial as ``{"number", "overrides", "value", "seconds"}``).

    Raises:
        RuntimeError: no trial finished within the budget.
    """
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    folder.mkdir(parents=True, exist_ok=True)
    study = optuna.create_study(study_name="own_data", direction="maximize", load_if_exists=True,
                                storage=f"sqlite:///{folder / 'study.db'}")
    finished = [t for t in study.trials if t.value is not None]
    spent_before = sum(t.user_attrs.get("seconds", 0.0) for t in finished)  # a re-run continues the same budget
    budget_s -= spent_before
    max_trials -= len(finished)
    study.sampler = optuna.samplers.TPESampler(seed=seed + len(finished))  # a continuation draws new points
    start, durations = time.time(), []

    def objective(trial):
        overrides = suggest(trial, max_epochs)
        t = time.time()
        value = run_trial(overrides, folder / f"trial-{trial.number:03d}")
        durations.append(time.time() - t)
        trial.set_user_attr("seconds", durations[-1])
        log.info("trial %d: %s -> dev %.4f (%.0f s)", trial.number, overrides, value, durations[-1])
        return value

    def within_budget(study, trial):
        spent = time.time() - start
        typical = sorted(durations)[len(durations) // 2] if durations else 0.0
        if spent + typical > budget_s:
            study.stop()

    if max_trials > 0 and budget_s > 0:
        study.optimize(objective, n_trials=max_trials, timeout=budget_s, callbacks=[within_budget])
    trials = [{"number": t.number, "overrides": {k: v for k, v in t.params.items()}, "value": t.value,
               "seconds": t.user_attrs.get("seconds")} for t in study.trials if t.value is not None]
    if not trials:
        raise RuntimeError(f"the recipe search finished no trial within {budget_s:.0f} s: raise --budget-min")
    best = max(trials, key=lambda t: t["value"])
    (folder / "trials.json").write_text(json.dumps(trials, indent=1) + "\n", encoding="utf-8")
    return best["overrides"], best["value"], trials

