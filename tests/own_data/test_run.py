"""python -m multipos.own_data run: prepare, a budgeted recipe search on dev, seeds of the best recipe, a summary."""

from __future__ import annotations

import json

from multipos.own_data.__main__ import main
from tests.helpers import trainer_overrides


def test_own_data_in_one_command_searches_trains_seeds_and_summarises(tiny_beir, tiny_bert, tmp_path, monkeypatch,
                                                                    capsys):
    monkeypatch.setenv("MULTIPOS_CACHE", str(tmp_path / "cache"))
    out = tmp_path / "run"
    args = ["run", str(tiny_beir), "--model", str(tiny_bert), "--budget-min", "5", "--max-trials", "2",
            "--seeds", "42,43", "--out", str(out), *trainer_overrides(), "trainer.enable_progress_bar=false",
            "eval.bf16=false", "eval.k=20", "data.batch_size=2"]
    assert main(args) == 0
    printed = capsys.readouterr().out
    assert "plan: query-side fine-tuning" in printed and "expected wall time: about" in printed
    assert "5 min of recipe search" in printed and "from this machine's speed (measured now" in printed
    trials = json.loads((out / "search" / "trials.json").read_text())
    assert len(trials) == 2 and all(0 <= t["value"] <= 1 for t in trials)
    recipe = json.loads((out / "recipe.json").read_text())
    complete = [t for t in trials if t["state"] == "complete"]
    assert recipe == max(complete, key=lambda t: t["value"])["overrides"]
    for t in trials:  # the second trial is pruned after epoch 1 when it is behind the first there
        pruned = (out / "search" / f"trial-{t['number']:03d}" / "pruned.json").is_file()
        assert pruned == (t["state"] == "pruned")
    for seed in (42, 43):
        run = out / "final" / f"seed={seed}"
        assert json.loads((run / "run_info.json").read_text())["status"] == "complete"
        metrics = json.loads((run / "metrics.json").read_text())
        assert set(metrics) == {"own_dev", "own_test"}  # the kept checkpoint's dev value, the test set; no average
    summary = (out / "summary.txt").read_text()
    assert "own_test" in summary and "zero-shot" in summary and "BM25" in summary
    assert "over 2 seeds (42: " in summary  # the seeds of the recipe form one configuration
    # A re-run reads every trial and seed back: nothing is trained again.
    stamps = {p: p.stat().st_mtime_ns for p in out.rglob("metrics.json")}
    assert main(args) == 0
    assert {p: p.stat().st_mtime_ns for p in out.rglob("metrics.json")} == stamps
