"""A short recipe search on your data's dev split, within a wall-time budget (Optuna TPE, successive halving).

Each trial is one query-side run of ``experiment=own_data`` (one seed, dev evaluation only) with a sampled objective,
learning rate, number of epochs and M. After each epoch the trial reports its dev value (:class:`TrialPruning`, a
Lightning callback) and Optuna's :class:`~optuna.pruners.SuccessiveHalvingPruner` (rungs at epochs 1, 3 and 9:
``min_resource=1``, ``reduction_factor=3``) stops a trial that is not in the top third of the trials that reached the
same rung, so the budget goes to the promising ones. Successive halving rather than Hyperband: a budget of 10–20 min
runs 10–30 trials, and Hyperband would split them into three brackets that each compare only their own few trials; one
bracket lets every trial compete. A pruned trial's folder holds ``pruned.json`` (epoch and dev value), its study state
is PRUNED, and it is never picked.

The study is stored in SQLite beside the trials, so a re-run continues it: finished and pruned trials are read back
(their time counts against the budget), and a trial interrupted mid-run is tried again with the same settings in its
own folder, continuing from its newest checkpoint. The search stops starting trials when the budget would be exceeded
by another trial of the median length so far (Optuna's ``timeout`` alone would start one at the last second).
"""

from __future__ import annotations

import json
import logging
import time
import warnings
from collections.abc import Callable
from pathlib import Path

import lightning as L

from multipos import atomic
from multipos.runs.folder import read_run_info, write_run_info

__all__ = ["SEARCH_SPACE", "PRUNED_FILE", "TrialPruning", "pruner", "search", "suggest"]

log = logging.getLogger(__name__)

#: The axes of the search: the paper's five objectives, the learning rate, epochs and M (the main job's recipe search
#: on NFCorpus searched these and more, conf/experiment/nfcorpus_recipe_search.yaml).
SEARCH_SPACE = {
    "loss": ("singlelh", "rand1lh", "jointlh", "summarglh", "lsepair"),
    "module.optimizer.lr": (1e-5, 3e-4),
    "trainer.max_epochs": (1, 9),
    "data.max_positives": (2, 4, 8),
}


#: The file a pruned trial's run folder holds: ``{"epoch", "value", "metric"}``.
PRUNED_FILE = "pruned.json"
#: The study's name in ``study.db``.
STUDY_NAME = "own_data"


def pruner():
    """The search's pruner: successive halving with rungs at epochs 1, 3 and 9 (``min_resource=1``,
    ``reduction_factor=3``; a trial reports once per epoch, so a step is an epoch)."""
    import optuna

    return optuna.pruners.SuccessiveHalvingPruner(min_resource=1, reduction_factor=3)


#: The trials :func:`search` is running in this process, by number: their callbacks report through the search's
#: own trial object (Optuna caches a study's running trials, so a second connection's reports would stay unseen).
_RUNNING: dict = {}


class TrialPruning(L.Callback):
    """Report the dev value (``val/<metric>``, logged by :class:`multipos.training.callbacks.RetrievalValidation`)
    to the Optuna trial after every epoch; when the pruner says the trial is behind (before its last epoch), write
    :data:`PRUNED_FILE` in ``folder`` and stop training at the end of that epoch (the run then finishes as usual, and
    :func:`search` marks the trial PRUNED and the run folder's status ``pruned``).

    Added to a trial's run by :func:`search` as ``callbacks.trial_pruning`` (a ``_target_`` entry,
    :func:`multipos.training.fit.build_callbacks`).

    Args:
        storage: the study's storage URL (``sqlite:///<folder>/study.db``).
        trial_number: the trial's number in the study.
        folder: the trial's run folder.
        metric: the dev metric the search maximises (``ndcg@10``).

    Raises:
        KeyError: at an epoch end without ``val/<metric>`` (no dev retrieval configured).
    """

    def __init__(self, storage: str, trial_number: int, folder: str, metric: str = "ndcg@10",
                 study_name: str = STUDY_NAME):
        self.storage, self.trial_number, self.folder, self.metric = storage, int(trial_number), Path(folder), metric
        self.study_name = study_name
        self._trial = None

    def _optuna_trial(self):
        if self._trial is None and self.trial_number in _RUNNING:
            self._trial = _RUNNING[self.trial_number]  # the search's own trial object (this process runs it)
        if self._trial is None:
            import optuna

            study = optuna.load_study(study_name=self.study_name, storage=self.storage, pruner=pruner())
            trial_id = next(t._trial_id for t in study.get_trials(deepcopy=False) if t.number == self.trial_number)
            self._trial = optuna.trial.Trial(study, trial_id)
        return self._trial

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        key = f"val/{self.metric}"
        if key not in trainer.callback_metrics:
            raise KeyError(f"{key} was not logged at epoch {trainer.current_epoch}: the recipe search's pruning "
                           "needs dev retrieval every epoch (callbacks.retrieval_validation)")
        value = float(trainer.callback_metrics[key])
        trial = self._optuna_trial()
        trial.report(value, step=trainer.current_epoch + 1)
        last = trainer.max_epochs is not None and trainer.current_epoch + 1 >= trainer.max_epochs
        if not last and trial.should_prune():  # at its last epoch a trial has spent its time: it competes
            atomic.write_json(self.folder / PRUNED_FILE, {"epoch": trainer.current_epoch + 1, "value": value,
                                                          "metric": self.metric})
            log.info("trial %d pruned after epoch %d (dev %s %.4f)", self.trial_number, trainer.current_epoch + 1,
                     self.metric, value)
            trainer.should_stop = True


def pruning_overrides(storage: str, trial_number: int, folder: Path) -> list[str]:
    """The ``train.py`` overrides that add :class:`TrialPruning` to a trial's run."""
    node = "+callbacks.trial_pruning"
    return [f"{node}._target_=multipos.own_data.search.TrialPruning", f"{node}.storage='{storage}'",
            f"{node}.trial_number={trial_number}", f"{node}.folder='{folder}'"]


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


def search(run_trial: Callable[[dict, Path, list[str]], float], folder: Path, budget_s: float, max_trials: int = 50,
           max_epochs: int | None = None, seed: int = 42, prune: bool = True) -> tuple[dict, float, list[dict]]:
    """Search recipes until ``budget_s`` seconds are spent or ``max_trials`` trials have run (both counted over
    every invocation, pruned trials included: a re-run after an interruption only finishes what is left).

    Args:
        run_trial: trains one trial ``(overrides, run folder, extra train.py overrides) -> dev value`` (higher is
            better); the extra overrides add :class:`TrialPruning` (empty when ``prune`` is false).
        folder: where the trials' run folders (``trial-<n>``) and the study (``study.db``) live.
        budget_s: wall-time budget in seconds, over every invocation.
        prune: stop trials that are behind after an epoch (:func:`pruner`); false trains every trial to its end.

    Returns:
        (best overrides, best dev value, every finished or pruned trial as ``{"number", "overrides", "value",
        "seconds", "state", "epochs"}``; ``value`` of a pruned trial is its last reported dev value).

    Raises:
        RuntimeError: no trial finished within the budget.
    """
    import optuna
    from optuna.trial import TrialState

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    folder.mkdir(parents=True, exist_ok=True)
    storage = f"sqlite:///{folder / 'study.db'}"
    study = optuna.create_study(study_name=STUDY_NAME, direction="maximize", load_if_exists=True, storage=storage,
                                pruner=pruner() if prune else optuna.pruners.NopPruner())
    retry = {}  # settings of an interrupted trial -> its folder (continued from its newest checkpoint)
    for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        study.tell(t.number, state=TrialState.FAIL)
        retry[json.dumps(t.params, sort_keys=True)] = folder / f"trial-{t.number:03d}"
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            study.enqueue_trial(t.params)
    done = [t for t in study.trials if t.state in (TrialState.COMPLETE, TrialState.PRUNED)]
    budget_s -= sum(t.user_attrs.get("seconds", 0.0) for t in done)  # a re-run continues the same budget
    max_trials -= len(done)
    study.sampler = optuna.samplers.TPESampler(seed=seed + len(done))  # a continuation draws new points
    start, durations = time.time(), []

    def objective(trial):
        overrides = suggest(trial, max_epochs)
        run_dir = retry.pop(json.dumps(trial.params, sort_keys=True), folder / f"trial-{trial.number:03d}")
        trial.set_user_attr("folder", run_dir.name)
        extra = pruning_overrides(storage, trial.number, run_dir) if prune else []
        t = time.time()
        _RUNNING[trial.number] = trial
        try:
            value = run_trial(overrides, run_dir, extra)
        finally:
            _RUNNING.pop(trial.number, None)
        durations.append(time.time() - t)
        trial.set_user_attr("seconds", durations[-1])
        pruned = run_dir / PRUNED_FILE
        if pruned.is_file():
            info = json.loads(pruned.read_text(encoding="utf-8"))
            run_info = read_run_info(run_dir)
            if run_info.get("status") == "complete":  # not a finished run: nothing reuses or reports it
                write_run_info(run_dir, {**run_info, "status": "pruned", "pruned_after_epoch": info["epoch"]})
            trial.set_user_attr("epochs", info["epoch"])
            log.info("trial %d: %s -> pruned after epoch %d, dev %.4f (%.0f s)", trial.number, overrides,
                     info["epoch"], info["value"], durations[-1])
            raise optuna.TrialPruned(f"behind after epoch {info['epoch']} (dev {info['value']:.4f})")
        trial.set_user_attr("epochs", overrides["trainer.max_epochs"])
        log.info("trial %d: %s -> dev %.4f (%.0f s)", trial.number, overrides, value, durations[-1])
        return value

    def within_budget(study, trial):
        spent = time.time() - start
        typical = sorted(durations)[len(durations) // 2] if durations else 0.0
        if spent + typical > budget_s:
            study.stop()

    if max_trials > 0 and budget_s > 0:
        study.optimize(objective, n_trials=max_trials, timeout=budget_s, callbacks=[within_budget])
    trials = []
    for t in study.trials:
        if t.state not in (TrialState.COMPLETE, TrialState.PRUNED):
            continue
        value = t.value if t.state == TrialState.COMPLETE else t.intermediate_values[t.last_step]
        trials.append({"number": t.number, "overrides": dict(t.params), "value": value,
                       "seconds": t.user_attrs.get("seconds"), "state": t.state.name.lower(),
                       "epochs": t.user_attrs.get("epochs")})
    complete = [t for t in trials if t["state"] == "complete"]
    if not complete:
        raise RuntimeError(f"the recipe search finished no trial within {budget_s:.0f} s: raise --budget-min")
    best = max(complete, key=lambda t: t["value"])
    atomic.write_text(folder / "trials.json", json.dumps(trials, indent=1) + "\n")
    return best["overrides"], best["value"], trials
