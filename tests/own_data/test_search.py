"""The recipe search: successive halving stops trials that are behind, pruned trials are never picked, and a re-run
continues the study (finished, pruned and interrupted trials)."""

from __future__ import annotations

import json
import math
from types import SimpleNamespace

import pytest
import torch

from multipos.own_data.search import PRUNED_FILE, TrialPruning, pruning_overrides, search, suggest

optuna = pytest.importorskip("optuna")


def _dev(overrides: dict, epoch: int) -> float:
    """A made-up dev curve: rises with epochs, best for lsepair and lr near 1e-4."""
    quality = {"lsepair": 0.40, "jointlh": 0.35, "singlelh": 0.30, "summarglh": 0.25, "rand1lh": 0.10}
    lr = math.log10(overrides["module.optimizer.lr"])
    return quality[overrides["loss"]] - 0.05 * abs(lr + 4) + 0.01 * epoch


class FakeTrials:
    """``run_trial`` without training: one on_train_epoch_end of the search's callback per epoch, as Lightning would
    call it, then a finished run folder."""

    def __init__(self):
        self.calls: list[str] = []

    def __call__(self, overrides: dict, folder, extra: list[str]) -> float:
        self.calls.append(folder.name)
        folder.mkdir(parents=True, exist_ok=True)
        values = []
        callback = None
        if extra:
            args = dict(e.split("=", 1) for e in extra)
            callback = TrialPruning(storage=args["+callbacks.trial_pruning.storage"].strip("'"),
                                    trial_number=int(args["+callbacks.trial_pruning.trial_number"]),
                                    folder=args["+callbacks.trial_pruning.folder"].strip("'"))
        for epoch in range(overrides["trainer.max_epochs"]):
            values.append(_dev(overrides, epoch))
            trainer = SimpleNamespace(callback_metrics={"val/ndcg@10": torch.tensor(values[-1])},
                                      current_epoch=epoch, should_stop=False,
                                      max_epochs=overrides["trainer.max_epochs"])
            if callback is not None:
                callback.on_train_epoch_end(trainer, None)
            if trainer.should_stop:
                break
        (folder / "run_info.json").write_text(json.dumps({"status": "complete"}))
        return max(values)


def test_trials_behind_are_pruned_their_folders_say_so_and_none_is_picked(tmp_path):
    run = FakeTrials()
    recipe, value, trials = search(run, tmp_path, budget_s=1e6, max_trials=12, seed=0)
    pruned = [t for t in trials if t["state"] == "pruned"]
    complete = [t for t in trials if t["state"] == "complete"]
    assert len(trials) == 12 and pruned and complete
    for t in pruned:
        folder = tmp_path / f"trial-{t['number']:03d}"
        marker = json.loads((folder / PRUNED_FILE).read_text())
        assert marker["epoch"] == t["epochs"] < t["overrides"]["trainer.max_epochs"]
        assert json.loads((folder / "run_info.json").read_text())["status"] == "pruned"
        assert marker["epoch"] in (1, 3)  # the rungs below the last (min_resource 1, reduction factor 3)
    best = max(complete, key=lambda t: t["value"])
    assert recipe == best["overrides"] and value == best["value"]
    assert json.loads((tmp_path / "trials.json").read_text()) == trials


def test_without_pruning_every_trial_runs_to_its_last_epoch(tmp_path):
    _, _, trials = search(FakeTrials(), tmp_path, budget_s=1e6, max_trials=6, seed=0, prune=False)
    assert all(t["state"] == "complete" and t["epochs"] == t["overrides"]["trainer.max_epochs"] for t in trials)
    assert not list(tmp_path.glob(f"trial-*/{PRUNED_FILE}"))


def test_a_rerun_continues_the_study_and_retries_an_interrupted_trial_in_its_folder(tmp_path):
    first = FakeTrials()
    _, _, trials = search(first, tmp_path, budget_s=1e6, max_trials=5, seed=0)
    assert len(first.calls) == 5
    # a trial left RUNNING, as a killed process leaves it
    study = optuna.load_study(study_name="own_data", storage=f"sqlite:///{tmp_path / 'study.db'}")
    interrupted = study.ask()
    settings = suggest(interrupted)
    (tmp_path / f"trial-{interrupted.number:03d}").mkdir()
    again = FakeTrials()
    _, _, trials = search(again, tmp_path, budget_s=1e6, max_trials=8, seed=0)
    assert again.calls[0] == f"trial-{interrupted.number:03d}"  # the same folder: it resumes from its checkpoint
    assert len(again.calls) == 3  # 8 in all: the 5 read back are not run again
    retried = next(t for t in trials if t["number"] > interrupted.number and t["overrides"] == settings)
    assert retried["state"] in ("complete", "pruned")
    assert len(trials) == 8


def test_the_callback_needs_dev_retrieval_every_epoch(tmp_path):
    study = optuna.create_study(study_name="own_data", storage=f"sqlite:///{tmp_path / 'study.db'}")
    trial = study.ask()
    args = dict(e.split("=", 1) for e in pruning_overrides(f"sqlite:///{tmp_path / 'study.db'}", trial.number,
                                                             tmp_path))
    callback = TrialPruning(args["+callbacks.trial_pruning.storage"].strip("'"), trial.number, str(tmp_path))
    with pytest.raises(KeyError, match="val/ndcg@10 was not logged"):
        callback.on_train_epoch_end(SimpleNamespace(callback_metrics={}, current_epoch=0, max_epochs=3), None)
