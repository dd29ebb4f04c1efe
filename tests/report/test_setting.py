"""One table compares runs of one setting: device kind and precision (multipos.report.setting)."""

from __future__ import annotations

import pytest

from multipos.report import render_sweep
from multipos.report.noise import noise_points
from multipos.report.setting import MixedSettingsError, check_one_setting, run_setting
from tests.report.fakes import SEEDS, SET, make_run, qmap, seeded_values
from tests.report.test_render import report_yaml

EPYC = {"status": "complete", "wall_s": 60.0, "device": "CPU AMD EPYC, 2 cores, 1 torch thread",
        "precision": {"training": "32-true", "encoding": "fp32"}}
XEON = {**EPYC, "device": "CPU Intel(R) Xeon(R) Processor, 2 cores"}


def test_a_runs_setting_is_its_device_kind_and_precisions(tmp_path):
    assert run_setting(EPYC) == ("CPU AMD EPYC, 2 cores", "32-true", "fp32")  # threads are no part of the kind
    old = tmp_path / "old"
    old.mkdir()
    (old / "train.log").write_text("[..][multipos.retrieval.encoding][INFO] - embedding cache hit (nfcorpus_dev): "
                                   "/w/.cache/embeddings/0704dd04868439df-a20320b697d3e108-256-bf16.npy\n")
    assert run_setting({"device": "CPU AMD EPYC, 2 cores"}, old) == ("CPU AMD EPYC, 2 cores", "not recorded", "bf16")
    assert run_setting({}) == ("not recorded", "not recorded", "not recorded")
    exported = tmp_path / "exported"  # experiments/runs/: spec.json, no train.log
    exported.mkdir()
    (exported / "spec.json").write_text('{"evaluation": {"bf16": false, "k": 1000}}')
    assert run_setting({"device": "CPU AMD EPYC, 2 cores"}, exported)[2] == "fp32"


def test_runs_of_two_settings_are_refused_naming_both_or_noted_when_allowed():
    runs = [("a,seed=42", EPYC, None), ("a,seed=43", {**EPYC, "device": "CPU AMD EPYC, 2 cores"}, None)]
    assert check_one_setting(runs, "study") is None
    mixed = [*runs, ("b,seed=42", XEON, None), ("c,seed=42", {**EPYC, "precision": {"encoding": "bf16"}}, None)]
    with pytest.raises(MixedSettingsError) as err:
        check_one_setting(mixed, "`table2`")
    text = str(err.value)
    assert "3 settings" in text and "Intel(R) Xeon(R)" in text and "e.g. b,seed=42" in text and "encoding bf16" in text
    assert "--allow-mixed-settings" in text
    note = check_one_setting(mixed, "`table2`", allow_mixed=True)
    assert note.startswith("Mixed settings") and "AMD EPYC" in note


def _sweep(tmp_path, second_device):
    root = tmp_path / "table2_homogeneous-cpu"
    for i, (obj, per_seed) in enumerate(seeded_values().items()):
        for seed, v in zip(SEEDS, per_seed):
            info = XEON if (second_device and i == 1) else EPYC
            make_run(root, f"loss={obj},seed={seed}", obj, {SET: {"ndcg@10": qmap(v), "mrr@10": qmap(v / 2)}},
                     seed=seed, extra_config=report_yaml(), run_info=info)
    return root


def test_render_refuses_a_table_across_machines_and_says_so_when_told_to_mix(tmp_path):
    render_sweep(_sweep(tmp_path / "one", False), tmp_path / "out1")  # one setting: rendered
    mixed = _sweep(tmp_path / "two", True)
    with pytest.raises(MixedSettingsError, match=r"loss=rand1lh,seed=\d.*Xeon|Xeon.*loss=rand1lh"):
        render_sweep(mixed, tmp_path / "out2")
    assert not (tmp_path / "out2").exists()
    md = render_sweep(mixed, tmp_path / "out2", allow_mixed_settings=True)
    assert "Mixed settings" in md and "Intel(R) Xeon(R)" in md


def test_label_noise_slopes_refuse_points_from_two_machines(tmp_path):
    clean, noisy = tmp_path / "table2", tmp_path / "noise"
    noise = ["data.source.label_noise.rate=0.5", "data.source.label_noise.kind=bm25"]
    for folder, info, extra in ((clean, XEON, []), (noisy, EPYC, noise)):
        for seed, v in zip(SEEDS, (0.33, 0.34)):
            make_run(folder, f"loss=singlelh,seed={seed}", "singlelh", {SET: {"ndcg@10": qmap([v, v])}}, seed=seed,
                     run_info=info, overrides=["loss=singlelh", *extra])
    with pytest.raises(MixedSettingsError, match="the label-noise points"):
        noise_points([noisy, clean], SET, "ndcg@10")
    assert noise_points([noisy, clean], SET, "ndcg@10", allow_mixed_settings=True)
