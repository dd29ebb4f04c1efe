"""multipos.runs.plan: what make train prints before it starts, with an estimate measured on this machine."""

from __future__ import annotations

import pytest

from multipos.runs import plan, speed


def test_the_plan_names_the_job_the_seeds_and_an_estimate_from_this_machines_speed(assets, monkeypatch, capsys,
                                                                                     tmp_path):
    monkeypatch.setenv("MULTIPOS_CACHE", str(tmp_path))  # no embeddings cached: every corpus is encoded
    measured = []

    def fake_measure(job, bf16):
        measured.append(job)
        return speed.Speed(passages_per_s={c.name: 50.0 for c in job.corpora}, step_s=0.5, queries_per_s=200.0,
                           precision="bf16" if bf16 else "fp32", measured_at="2026-12-02 10:00", measuring_s=12.0)

    monkeypatch.setattr(speed, "measure", fake_measure)
    assert plan.main(["--seeds", "42"]) == 0
    out = capsys.readouterr().out
    assert "query-side fine-tuning of all-MiniLM-L6-v2 on NFCorpus" in out and "1 seed(s)" in out
    job = measured[0]
    expected = speed.predict(job, fake_measure(job, False))
    assert f"expected wall time: about {expected['total'] / 60:.0f} min" in out
    assert "from this machine's speed (measured now in 12 s" in out and "training step of 64 queries 0.50 s" in out
    assert {c.name for c in job.corpora} >= {"trec_dl19", "trec_dl20"} and job.epochs == 9 and job.seeds == 1


def test_with_embeddings_cached_the_estimate_leaves_encoding_out(assets, monkeypatch, capsys, tmp_path):
    monkeypatch.setenv("MULTIPOS_CACHE", str(tmp_path))
    (tmp_path / "embeddings").mkdir()
    (tmp_path / "embeddings" / "some-index").write_text("x")
    jobs = []

    def fake_measure(job, bf16):
        jobs.append(job)
        return speed.Speed(passages_per_s={c.name: 50.0 for c in job.corpora}, step_s=0.5, queries_per_s=200.0,
                           precision="fp32", measured_at="2026-12-02 10:00", measuring_s=12.0)

    monkeypatch.setattr(speed, "measure", fake_measure)
    assert plan.main(["--seeds", "42"]) == 0
    out = capsys.readouterr().out
    cached = frozenset(c.name for c in jobs[0].corpora)
    expected = speed.predict(jobs[0], fake_measure(jobs[0], False), cached)
    assert expected["encode"] == 0
    assert f"expected wall time: about {expected['total'] / 60:.0f} min" in out and "none encoded" in out


def test_no_measure_prints_the_plan_alone(assets, monkeypatch, capsys):
    monkeypatch.setattr(speed, "measure", lambda *a, **k: pytest.fail("measured"))
    assert plan.main(["--no-measure"]) == 0
    assert "expected wall time" not in capsys.readouterr().out


def test_seeds_trained_side_by_side_are_planned_so(assets, monkeypatch, capsys, tmp_path):
    monkeypatch.setenv("MULTIPOS_CACHE", str(tmp_path))
    jobs = []

    def fake_measure(job, bf16):
        jobs.append(job)
        return speed.Speed(passages_per_s={c.name: 50.0 for c in job.corpora}, step_s=0.5, queries_per_s=200.0,
                           precision="fp32", measured_at="2026-12-02 10:00", measuring_s=12.0, step_1thread_s=0.6,
                           cores=2)

    monkeypatch.setattr(speed, "measure", fake_measure)
    assert plan.main(["--seeds", "42,43,44", "--parallel-jobs", "3"]) == 0
    out = capsys.readouterr().out
    assert jobs[0].side_by_side == 3 and "3 seed(s) side by side" in out
    expected = speed.predict(jobs[0], fake_measure(jobs[0], False))
    assert f"expected wall time: about {expected['total'] / 60:.0f} min" in out
