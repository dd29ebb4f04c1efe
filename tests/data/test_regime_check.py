"""A regime that can keep no positive of the data stops before anything runs, naming the fix (issue: commands that
kept no query and said so only after loading the data)."""

from __future__ import annotations

import pytest

from multipos.data.sources import check_regime_keeps_positives
from multipos.formats.types import regimes_without_positives
from tests.helpers import compose_cfg


def test_regimes_without_positives_knows_each_regimes_tiers():
    assert regimes_without_positives(["homogeneous"], gold=5, silver=0) == ["homogeneous"]
    assert regimes_without_positives(["heterogeneous", "gold"], gold=0, silver=None) == ["heterogeneous", "gold"]
    assert regimes_without_positives(["all"], gold=0, silver=3) == []
    assert regimes_without_positives(["homogeneous", "gold"], gold=None, silver=None) == []


def test_tevatron_data_without_gold_under_a_gold_regime_is_refused():
    # the base regime, heterogeneous, needs a gold positive
    cfg = compose_cfg("train", ["experiment=base", "data=msmarco_homo"])
    with pytest.raises(ValueError, match=r"data=msmarco_homo: regime heterogeneous keeps no training query.*"
                                         r"regime=homogeneous"):
        check_regime_keeps_positives(cfg.data.source, cfg.stages, where="data=msmarco_homo")
    for ok in (["data=msmarco_homo", "regime=homogeneous"], ["data=msmarco_hetero"], ["data=nfcorpus"]):
        cfg = compose_cfg("train", ["experiment=base", *ok])
        check_regime_keeps_positives(cfg.data.source, cfg.stages)


def test_beir_qrels_with_one_tier_under_homogeneous_are_refused():
    cfg = compose_cfg("train", ["experiment=own_data", "data_path=/data/prepared", "data.source.gold_grade=1",
                                "data.source.silver_grade=1", "regime=homogeneous"])
    with pytest.raises(ValueError, match=r"regime homogeneous keeps no training query: every positive .* is gold"):
        check_regime_keeps_positives(cfg.data.source, cfg.stages)


def test_the_training_job_refuses_it_before_writing_anything(tmp_path):
    from multipos.train import TrainingJob

    cfg = compose_cfg("train", ["experiment=base", "data=msmarco_homo", f"paths.output_dir={tmp_path / 'run'}"])
    with pytest.raises(ValueError, match="regime=homogeneous"):
        TrainingJob.setup(cfg)
    assert not (tmp_path / "run").exists()


def test_own_data_stops_before_its_search_when_the_regime_keeps_nothing():
    from multipos.own_data.__main__ import _regime_problem

    overrides = ["data_path=/data/prepared", "data.source.gold_grade=1", "data.source.silver_grade=1"]
    assert _regime_problem(overrides, gold=120, silver=0) is None  # the default regime, all
    problem = _regime_problem([*overrides, "regime=homogeneous"], gold=120, silver=0)
    assert "regime homogeneous keeps no training positive" in problem and "120 gold and 0 silver" in problem
    assert "--gold-grades" in problem and "--gold-positives" in problem
