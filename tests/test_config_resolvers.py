"""multipos.config_resolvers: the Optuna study of a recipe search continues with new points (``optuna_seed``)."""

from __future__ import annotations

import optuna
import pytest

from multipos.config_resolvers import optuna_seed, optuna_storage
from tests.helpers import compose_cfg

optuna.logging.set_verbosity(optuna.logging.WARNING)


def _objective(trial: optuna.Trial) -> float:
    return trial.suggest_float("lr", 1e-5, 1e-4, log=True) + len(trial.suggest_categorical("loss", ["a", "bb", "ccc"]))


def _continue(folder, name: str, n_trials: int, seed) -> list[dict]:
    """One invocation of a search: the stored study (created if new), a sampler seeded as the configs seed it."""
    storage = optuna_storage(str(folder))
    sampler = optuna.samplers.TPESampler(seed=seed(folder, name) if callable(seed) else seed)
    study = optuna.create_study(study_name=name, storage=storage, sampler=sampler, direction="maximize",
                                load_if_exists=True)
    before = len(study.trials)
    study.optimize(_objective, n_trials=n_trials)
    return [t.params for t in study.trials[before:]]


def test_a_new_study_takes_the_base_seed_and_nothing_is_written(tmp_path):
    assert optuna_seed(42, str(tmp_path / "sweep"), "search") == 42
    assert not (tmp_path / "sweep").exists()


def test_the_seed_counts_the_stored_trials_of_that_study_only(tmp_path):
    _continue(tmp_path, "search", 3, 42)
    _continue(tmp_path, "another", 2, 42)
    study = optuna.load_study(study_name="search", storage=optuna_storage(str(tmp_path)))
    study.tell(study.ask(), state=optuna.trial.TrialState.FAIL)  # a failed trial counts too
    assert optuna_seed(42, str(tmp_path), "search") == 46
    assert optuna_seed(7, str(tmp_path), "another") == 9


def test_a_continued_study_tries_new_points_where_a_fixed_seed_repeats_the_first_ones(tmp_path):
    fixed = [_continue(tmp_path / "fixed", "search", 3, 42) for _ in range(2)]
    assert fixed[1] == fixed[0]  # the defect: every invocation proposes the same first points again
    counted = [_continue(tmp_path / "counted", "search", 3, lambda f, n: optuna_seed(42, str(f), n)) for _ in range(2)]
    assert counted[0] == fixed[0]  # a new study: the same points as before the change
    assert not [p for p in counted[1] if p in counted[0]]


@pytest.mark.parametrize("experiment", ["nfcorpus_recipe_search", "two_tower_recipe_search"])
def test_each_recipe_search_seeds_its_sampler_by_its_stored_trials(experiment, tmp_path):
    def seed() -> tuple[int, str]:
        cfg = compose_cfg("train", [f"experiment={experiment}", f"hydra.sweep.dir={tmp_path}"],
                          return_hydra_config=True)
        return cfg.hydra.sweeper.sampler.seed, cfg.hydra.sweeper.study_name

    first, name = seed()
    assert first == 42
    _continue(tmp_path, name, 2, 42)
    assert seed() == (44, name)


def test_sweep_cells_are_named_by_values_never_by_paths():
    from multipos.config_resolvers import run_subdir

    name = "data.source.path=/data/a/b/my_beir,loss=lsepair,seed=42"
    assert run_subdir(name) == "data.source.path=my_beir,loss=lsepair,seed=42"
    assert run_subdir("eval.paths=[x,y],loss=jointlh") == "eval.paths=[x,y],loss=jointlh"  # a list value stays whole
    study = ("data.batch_size=64,data.max_positives=4,loss=jointlh,module.optimizer.lr=0.00019921329109073735,"
             "passages.candidates=corpus,regime=all,trainer.max_epochs=9")
    assert run_subdir(study) == study  # a study's cell names are unchanged
    assert run_subdir("") == ""


def test_a_sweep_over_a_path_writes_a_short_folder():
    from omegaconf import OmegaConf, open_dict

    cfg = compose_cfg("train", ["experiment=own_data", "data_path=/data/x/y/mine", "seed=42"], return_hydra_config=True)
    OmegaConf.set_readonly(cfg.hydra, False)
    with open_dict(cfg):
        cfg.hydra.job.override_dirname = "data_path=/data/x/y/mine,seed=42"
    assert cfg.hydra.sweep.subdir == "data_path=mine,seed=42"


def test_long_values_and_names_become_hashes():
    from multipos.config_resolvers import run_subdir

    name = run_subdir("eval.validation={_target_:x,path:'/tmp/a/b',split:dev,metrics:[ndcg@10]},seed=1")
    assert name.startswith("eval.validation=#") and name.endswith(",seed=1")
    assert len(name) == len("eval.validation=") + 9 + len(",seed=1")
    long = ",".join(f"k{i}=v{i}" for i in range(60))
    assert len(run_subdir(long)) == 199 and run_subdir(long) != run_subdir(long + ",k99=1")


def test_multipos_bf16_decides_the_automatic_precision(monkeypatch):
    from multipos.hardware import auto_precision, native_bf16

    monkeypatch.setenv("MULTIPOS_BF16", "0")
    assert auto_precision() == "32-true" and native_bf16() is False
    monkeypatch.setenv("MULTIPOS_BF16", "1")
    assert auto_precision() == "bf16-mixed"
    monkeypatch.setenv("MULTIPOS_BF16", "yes")
    with pytest.raises(ValueError, match="MULTIPOS_BF16"):
        auto_precision()
