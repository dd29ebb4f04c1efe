"""multipos.report.consistency: one number per cell and per reference row across results sources."""

from __future__ import annotations

import json
import shutil
import tarfile
from pathlib import Path

import pytest

from multipos.report.consistency import disagreements, main

TEMPLATE = Path(__file__).resolve().parents[2] / "experiments" / "runs" / "closed_loop-cpu" / "labels=human,seed=42"


def _run(root: Path, name: str, ndcg: float, device: str = "CPU AMD EPYC, 2 cores", bm25: float = 0.318,
         seed: int = 42) -> Path:
    d = root / name
    (d / ".hydra").mkdir(parents=True)
    shutil.copy(TEMPLATE / ".hydra" / "config.yaml", d / ".hydra" / "config.yaml")
    spec = json.loads((TEMPLATE / "spec.json").read_text())
    spec["seed"] = seed
    (d / "spec.json").write_text(json.dumps(spec))
    (d / "run_info.json").write_text(json.dumps({"status": "complete", "device": device,
                                                 "precision": {"training": "32-true", "encoding": "fp32"}}))
    (d / "metrics.json").write_text(json.dumps({"nfcorpus_test": {"ndcg@10": ndcg}}))
    (d / "references.json").write_text(json.dumps({"bm25": {"nfcorpus_test": {"ndcg@10": bm25}}}))
    return d


def test_two_runs_of_one_cell_must_agree_and_so_must_reference_rows(tmp_path):
    a, b = tmp_path / "study_a", tmp_path / "study_b"
    _run(a, "loss=jointlh,seed=42", 0.3300)
    _run(b, "loss=jointlh,seed=42", 0.3300 + 1e-6)  # equal to the shown digits: one number
    _run(b, "other_machine", 0.3350, device="CPU Intel Xeon, 2 cores")  # another setting: another cell
    _run(b, "seed=43", 0.3400, seed=43)
    assert disagreements([a, b]) == []
    _run(a, "seed=43-again", 0.3420, seed=43, bm25=0.3181)
    found = disagreements([a, b])
    assert [(d.kind, d.metric) for d in found] == [("cell", "nfcorpus_test:ndcg@10"),
                                                   ("reference", "nfcorpus_test:ndcg@10")]
    assert sorted(found[0].values) == [0.34, 0.342] and "seed=43-again" in str(found[0])
    assert sorted(found[1].values) == [0.318, 0.3181]


def test_archives_are_walked_in_a_copy_and_the_exit_status_says_whether_all_agree(tmp_path, capsys):
    sweep = tmp_path / "sweep"
    _run(sweep, "seed=42", 0.33)
    _run(sweep, "seed=42-copy", 0.31)
    archive = tmp_path / "sweep.tar.xz"
    with tarfile.open(archive, "w:xz") as tar:
        tar.add(sweep, arcname="sweep")
    before = sorted(p.name for p in sweep.rglob("*"))
    assert main([str(archive)]) == 1 and "1 disagreement" in capsys.readouterr().out
    assert sorted(p.name for p in sweep.rglob("*")) == before  # nothing written into the sources
    shutil.rmtree(sweep / "seed=42-copy")
    assert main([str(sweep)]) == 0 and "0 disagreements" in capsys.readouterr().out


def _pack(folder: Path, archive: Path) -> Path:
    with tarfile.open(archive, "w:xz") as tar:
        for top in folder.iterdir():
            tar.add(top, arcname=top.name)
    shutil.rmtree(folder)
    return archive


def test_resolve_keeps_the_newest_run_of_a_cell_and_the_majority_reference_row(tmp_path, capsys):
    old, new = tmp_path / "old", tmp_path / "new"
    _run(old / "study_a", "seed=42", 0.3300)
    _run(old / "study_a", "seed=43", 0.3400, seed=43, bm25=0.3181)
    _run(new / "study_b", "seed=42", 0.3310)
    _run(new / "study_b", "seed=44", 0.3500, seed=44)
    for name in ("seed=42", "seed=43"):
        (old / "study_a" / name / "per_query.nfcorpus_test.json").write_text('{"q": 0.1}')
    (new / "study_b" / "seed=42" / "per_query.nfcorpus_test.json").write_text('{"q": 0.2}')
    sources = [_pack(old, tmp_path / "sweeps-2026-11-25.tar.xz"), _pack(new, tmp_path / "sweeps-2026-11-26.tar.xz")]
    assert len(disagreements(sources)) == 2
    assert main(["--resolve", *map(str, sources)]) == 0
    assert "changed: sweeps-2026-11-25.tar.xz/study_a" in capsys.readouterr().out
    assert disagreements(sources) == []
    with tarfile.open(sources[0]) as tar:
        info = json.load(tar.extractfile("study_a/seed=42/run_info.json"))
        assert info["copied_from"] == ["sweeps-2026-11-26.tar.xz/study_b/seed=42"]
        assert json.load(tar.extractfile("study_a/seed=42/metrics.json"))["nfcorpus_test"]["ndcg@10"] == 0.3310
        assert json.load(tar.extractfile("study_a/seed=42/per_query.nfcorpus_test.json")) == {"q": 0.2}
        refs = json.load(tar.extractfile("study_a/seed=43/references.json"))
        assert refs["bm25"]["nfcorpus_test"]["ndcg@10"] == 0.318  # three folders hold 0.318, one 0.3181


def test_hard_linked_copies_in_an_archive_are_read_and_kept(tmp_path):
    sweep = tmp_path / "src" / "study"
    _run(sweep, "seed=42", 0.33)
    twin = sweep / "seed=42-reused"
    shutil.copytree(sweep / "seed=42", twin)
    (twin / "metrics.json").unlink()
    (twin / "metrics.json").hardlink_to(sweep / "seed=42" / "metrics.json")  # how a reused run's copy is stored
    (tmp_path / "src" / "study" / "seed=43").mkdir()
    archive = _pack(tmp_path / "src", tmp_path / "a-2026-11-25.tar.xz")
    with tarfile.open(archive) as tar:
        assert any(m.islnk() for m in tar.getmembers())
    newer = tmp_path / "new"
    _run(newer / "study", "seed=42", 0.34)
    other = _pack(newer, tmp_path / "b-2026-11-26.tar.xz")
    assert main(["--resolve", str(archive), str(other)]) == 0
    with tarfile.open(archive) as tar:
        for name in ("study/seed=42", "study/seed=42-reused"):
            assert json.load(tar.extractfile(f"{name}/metrics.json"))["nfcorpus_test"]["ndcg@10"] == 0.34


def test_the_committed_run_folders_have_one_number_per_cell():
    from multipos.report.consistency import default_sources

    runs = [s for s in default_sources() if s.name == "runs"]
    assert runs and disagreements(runs) == []


def test_resolve_rewrites_archive_folders_in_place_and_dates_them_by_name(tmp_path, capsys):
    from multipos.report.consistency import _age, default_sources

    old, new = tmp_path / "experiments/sweeps/a-2026-11-25", tmp_path / "experiments/sweeps/b-2026-11-26"
    _run(old / "study_a", "seed=42", 0.3300)
    _run(new / "study_b", "seed=42", 0.3310)
    (tmp_path / "experiments/runs").mkdir()
    (tmp_path / "experiments/sweeps/gpu-h100").mkdir()
    assert [_age(s) for s in default_sources(tmp_path)] == ["9999", "2026-11-25", "2026-11-26", "0000"]
    assert main(["--resolve", str(old), str(new)]) == 0
    assert "changed: a-2026-11-25/study_a" in capsys.readouterr().out
    info = json.loads((old / "study_a/seed=42/run_info.json").read_text())
    assert info["copied_from"] == ["b-2026-11-26/study_b/seed=42"]
    assert json.loads((old / "study_a/seed=42/metrics.json").read_text())["nfcorpus_test"]["ndcg@10"] == 0.3310


@pytest.mark.slow
def test_every_committed_results_source_has_one_number_per_cell():
    """experiments/runs/ and every archive folder (minutes on 2 cores): `--resolve` made them agree on 2026-12-02."""
    assert [str(d) for d in disagreements()] == []
