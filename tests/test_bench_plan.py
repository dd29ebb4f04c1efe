"""bench/bench_plan.py reads the estimate the plan prints: the two must keep one format."""

from __future__ import annotations

from multipos.runs import plan, speed
from tests.helpers import load_bench


def _bench():
    return load_bench("bench/bench_plan.py", "bench_plan")


def test_the_benchmark_reads_the_minutes_the_plan_prints():
    job = speed.Job(model="m", corpora=(speed.Corpus("nfcorpus", ("a passage",) * 3000, 256),), train_queries=2500,
                    batch_size=64, query_max_length=32, epochs=9, seeds=3, dev_queries=300, test_queries=300)
    rate = speed.Speed(passages_per_s={"nfcorpus": 50.0}, step_s=0.5, queries_per_s=200.0, precision="fp32",
                       measured_at="2026-12-02 10:00", measuring_s=12.0)
    prediction = speed.predict(job, rate)
    line = f"  expected wall time: {plan.describe_estimate(prediction, rate, job, warm=False)}"
    assert _bench().predicted_minutes(f"make train: ...\n{line}\n") == round(prediction["total"] / 60)
    assert _bench().predicted_minutes("no plan here") is None


def test_the_own_data_command_writes_into_the_timed_clone_and_the_line_names_the_users_command(tmp_path):
    recorded, run = _bench().make_args("/d/nf", 10, "42,43,44", True, tmp_path / "clone" / "multirun" / "own")
    assert recorded == ["SEEDS=42,43,44", "DATA=/d/nf", "BUDGET=10", "ARGS=--no-pruning"]
    assert run == [*recorded[:3], f"ARGS=--out {tmp_path}/clone/multirun/own --no-pruning"]
    assert _bench().make_args(None, 20, "42", False, tmp_path) == (["SEEDS=42"], ["SEEDS=42"])


def test_a_recipe_search_is_read_back_and_rendered_pruned_apart(tmp_path):
    import json

    bench = _bench()
    out = tmp_path / "clone" / "multirun" / "own_data-nf-abc"
    (out / "search").mkdir(parents=True)
    trials = [{"number": 0, "overrides": {"loss": "jointlh"}, "value": 0.31, "state": "complete", "epochs": 3},
              {"number": 1, "overrides": {"loss": "lsepair"}, "value": 0.20, "state": "pruned", "epochs": 9},
              {"number": 2, "overrides": {"loss": "singlelh"}, "value": 0.33, "state": "complete", "epochs": 1}]
    (out / "search" / "trials.json").write_text(json.dumps(trials))
    (out / "recipe.json").write_text(json.dumps({"loss": "singlelh", "trainer.max_epochs": 1}))
    (out / "summary.txt").write_text("own_test         0.3500 ± 0.0010 over 3 seeds | zero-shot 0.3160\n")
    record = bench.search_record(out)
    assert (record["trials"], record["pruned"], record["best_dev"]) == (3, 1, 0.33)
    assert record["recipe"] == {"loss": "singlelh", "trainer.max_epochs": 1}
    assert bench.search_record(tmp_path / "elsewhere") == {}
    results = tmp_path / "plan_vs_actual.jsonl"
    base = {"bench": "plan_vs_actual", "cpu": "AMD EPYC", "cpus": 2, "commit": "abc", "actual_min": 13.0}
    lines = [{**base, "command": "make train SEEDS=42,43,44 DATA=/d/nf BUDGET=10", **record},
             {**base, "command": "make train SEEDS=42,43,44 DATA=/d/nf BUDGET=10 ARGS=--no-pruning", **record},
             {**base, "command": "make train SEEDS=42,43,44"}]
    results.write_text("".join(json.dumps(line) + "\n" for line in lines))
    bench.render_search(results, tmp_path / "recipe_search.md")
    rows = [r for r in (tmp_path / "recipe_search.md").read_text().splitlines() if r.startswith("| nf |")]
    assert len(rows) == 2
    assert "| on | 3 | 1 | loss=singlelh, trainer.max_epochs=1 | 0.3300 | 0.3500 ± 0.0010 |" in rows[0]
    assert "| off |" in rows[1]


def test_the_line_keeps_the_main_jobs_closing_summary():
    """Each test set's line of the summary ``make train`` ends with (multipos.report.summary), not the log lines
    that merely name the metric."""
    from multipos.report.summary import format_summary

    rows = [{"set": s, "n_seeds": 2, "seeds": {42: v, 43: v + 0.002}, "mean": v + 0.001, "sd": 0.0014,
             "zero_shot": None, "bm25": None} for s, v in (("nfcorpus_test", 0.358), ("trec_dl19", 0.61))]
    output = "\n".join(["[INFO] - trec_dl20: {\"ndcg@10\": 0.6055}", format_summary(rows), "make: leaving directory"])
    block = _bench().summary_block(output)
    assert block[0].startswith("ndcg@10, mean ± sd over seeds")
    assert block[1:] == ["nfcorpus_test    0.3590 ± 0.0014 over 2 seeds (42: 0.3580, 43: 0.3600)",
                         "trec_dl19        0.6110 ± 0.0014 over 2 seeds (42: 0.6100, 43: 0.6120)"]
    assert _bench().summary_block("no summary") == []
