"""The best recipes of a recipe search as config files (multipos.report.recipes): ranked on the optimised dev metric,
written as configs that compose into the same training configuration as the trial they came from."""

from __future__ import annotations

from pathlib import Path

import pytest
from omegaconf import OmegaConf

from multipos.report.recipes import ranked_trials, write_recipes
from tests.helpers import CONF, compose_cfg
from tests.report.fakes import make_run

TRIAL = ["passages.candidates=corpus", "loss=jointlh", "data.max_positives=4", "training_regime=all",
         "trainer.max_epochs=9",
         "module.optimizer.lr=1e-04", "data.batch_size=64"]


def _search(root, values):
    for i, value in enumerate(values):
        overrides = [o.replace("lr=1e-04", f"lr={1e-4 * (i + 1)}") for o in TRIAL] + ["seed=42"]
        make_run(root, f"trial{i}", "jointlh", metrics={"nfcorpus_dev": {"ndcg@10": value}},
                 extra_config="optimized_metric: nfcorpus_dev/ndcg@10\n", overrides=overrides)
    make_run(root, "killed", "jointlh", metrics={"nfcorpus_dev": {"ndcg@10": 0.99}}, run_info={"status": "running"},
             extra_config="optimized_metric: nfcorpus_dev/ndcg@10\n", overrides=TRIAL)
    return root


def test_trials_rank_on_the_optimised_metric_and_skip_unfinished_runs(tmp_path):
    trials = ranked_trials(_search(tmp_path / "sweep", [0.31, 0.35, 0.33]))
    assert [(round(v, 2), d.name) for v, d, _ in trials] == [(0.35, "trial1"), (0.33, "trial2"), (0.31, "trial0")]
    assert "seed" not in trials[0][2] and trials[0][2]["regime"] == "all"  # renamed group


def test_written_recipes_compose_into_the_trials_configuration(tmp_path):
    sweep = _search(tmp_path / "sweep", [0.31, 0.35, 0.33])
    paths = write_recipes(sweep, 2, tmp_path / "recipe", CONF)
    assert [p.name for p in paths] == ["top1.yaml", "top2.yaml"]
    text = paths[0].read_text()
    assert text.startswith("# @package _global_") and "dev value 0.3500" in text and "override /loss: jointlh" in text
    # placed as conf/recipe/<name>.yaml, the recipe composes to the trial's settings
    target = Path(CONF) / "recipe" / "top_test.yaml"
    target.write_text(text)
    try:
        cfg = compose_cfg("train", ["experiment=recipe_confirmation", "recipe=top_test", "paths.output_dir=o"])
    finally:
        target.unlink()
    trial = compose_cfg("train", ["experiment=nfcorpus_recipe_search", *[o.replace("training_regime=", "regime=")
                                  .replace("lr=1e-04", "lr=0.0002") for o in TRIAL], "paths.output_dir=o"])
    for key in ("loss.name", "stages.main.regime", "data.max_positives", "data.batch_size", "trainer.max_epochs",
                "module.optimizer.lr", "passages.candidates", "data.group_size", "trainer.precision"):
        assert OmegaConf.select(cfg, key) == OmegaConf.select(trial, key), key


def test_too_few_trials_is_an_error_naming_the_sweep(tmp_path):
    sweep = _search(tmp_path / "sweep", [0.31])
    with pytest.raises(ValueError, match="1 finished trials hold the metric, fewer than --top 3"):
        write_recipes(sweep, 3, tmp_path / "recipe", CONF)
