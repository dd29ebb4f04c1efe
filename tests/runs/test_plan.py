"""multipos.runs.plan: what make train prints before it starts."""

from __future__ import annotations

from multipos.runs.plan import MEASURED_MINUTES, estimate_minutes, main


def test_the_estimate_is_the_measured_time_for_three_cold_seeds_and_less_when_warm_or_fewer():
    for kind, minutes in MEASURED_MINUTES.items():
        assert estimate_minutes(kind, warm=False, seeds=3) == minutes
        assert estimate_minutes(kind, warm=True, seeds=3) < minutes
        assert estimate_minutes(kind, warm=False, seeds=1) < minutes
    assert estimate_minutes("cpu-fp32", False) > estimate_minutes("cpu-bf16", False) > estimate_minutes("gpu", False)


def test_the_plan_names_the_job_the_seeds_and_the_expected_time(capsys):
    assert main(["--seeds", "42"]) == 0
    out = capsys.readouterr().out
    assert "query-side fine-tuning of all-MiniLM-L6-v2 on NFCorpus" in out and "1 seed(s)" in out
    assert "expected wall time" in out and " min" in out
