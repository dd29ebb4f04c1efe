"""bench/gpu/ingest.py: a GPU call's tarballs into the repository's results files, sweeps and sweep archive."""

from __future__ import annotations

import io
import json
import shutil
import tarfile
from pathlib import Path

import pytest

from tests.helpers import load_bench


@pytest.fixture(scope="module")
def ingest_module():
    return load_bench("bench/gpu/ingest.py", "gpu_ingest")


def _tarball(path: Path, files: dict[str, str]) -> None:
    with tarfile.open(path, "w:gz") as tar:
        for name, text in files.items():
            data = text.encode()
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))


SPEED = {"bench": "speed", "time": "2026-11-27T10:00:00", "gpu": "NVIDIA H200", "commit": "abc1234",
         "lightning_vs_bare": 0.93, "lightning_unlogged_vs_bare": 0.97}
FIT = {"bench": "fit_vs_st_train", "time": "2026-11-27T10:02:00", "gpu": "NVIDIA H200", "commit": "abc1234",
       "fit_vs_st_train": 1.6}
PAPER = {"bench": "paper_scale", "time": "2026-11-26T23:59:00", "gpu": "NVIDIA H100 80GB HBM3"}
#: A finished run folder (text copy) to stand for a GPU run: what the archive's export reads.
TEMPLATE = Path(__file__).resolve().parents[1] / "experiments/runs/closed_loop-cpu/labels=human,seed=42"


def _finished_run(folder: Path) -> Path:
    shutil.copytree(TEMPLATE, folder)
    return folder


def test_lines_go_to_their_files_once_and_sweeps_into_multirun_and_the_archive(ingest_module, tmp_path):
    repo, calls = tmp_path / "repo", tmp_path / "out"
    (repo / "bench/results/gpu").mkdir(parents=True)
    run_a = _finished_run(repo / "multirun/table2_homogeneous-cpu-gpu/run-a")
    (run_a / "model").mkdir()  # a trained model: never archived
    (run_a / "model/model.safetensors").write_text("weights")
    (run_a / "train.log").write_text("a log: never archived")
    (repo / "multirun/table2_homogeneous-cpu-gpu/run-unfinished").mkdir()  # no run_info.json: left out
    # in the archive only (not in multirun/): kept
    _finished_run(repo / "experiments/sweeps/gpu-h100/table9_recontriever-cpu-gpu/run-c")
    held = repo / "bench/results/gpu/2026-11-27-h200-fit_vs_st.jsonl"
    held.write_text(json.dumps(FIT) + "\n")  # already taken in by an earlier ingest
    calls.mkdir()
    _tarball(calls / "main.tar.gz", {
        "main/speed.jsonl": json.dumps(SPEED) + "\n" + json.dumps(FIT) + "\n",
        "main/times.txt": "bench_speed rc=0 140 s\n",
        "multirun/default-cpu-gpu/seed42/run_info.json": '{"status": "finished"}'})
    _tarball(calls / "suite.tar.gz", {"suite/speed.jsonl": json.dumps(PAPER) + "\n",
                                      "suite/suite.log": "FAILED tests/test_x.py::test_y\n1 failed, 9 passed\n"})
    _tarball(calls / "studies.tar.gz", {"studies/times.txt": "table3 300 s\n",
                                        "multirun/table3_ood-cpu-gpu/run-b/run_info.json": '{"status": "running"}'})
    _finished_run(repo / "multirun/table3_ood-cpu-gpu/run-d")  # finished in an earlier call

    out = ingest_module.ingest(calls, repo)

    speed = repo / "bench/results/gpu/2026-11-27-h200-speed.jsonl"
    assert [json.loads(x) for x in speed.read_text().splitlines()] == [SPEED]
    assert held.read_text().splitlines() == [json.dumps(FIT)]  # not appended twice
    paper = repo / "bench/results/gpu/2026-11-26-h100-paper_scale.jsonl"
    assert [json.loads(x) for x in paper.read_text().splitlines()] == [PAPER]
    assert sorted(str(t) for t, _ in out["lines"]) == ["bench/results/gpu/2026-11-26-h100-paper_scale.jsonl",
                                                       "bench/results/gpu/2026-11-27-h200-speed.jsonl"]
    assert (repo / "multirun/default-cpu-gpu/seed42/run_info.json").is_file()
    assert (repo / "multirun/table3_ood-cpu-gpu/run-b/run_info.json").is_file()
    # not the main job's sweep; the old archive's sweep kept; only finished runs, without weights or logs
    assert out["archive"] == ["table2_homogeneous-cpu-gpu", "table3_ood-cpu-gpu", "table9_recontriever-cpu-gpu"]
    archive = repo / "experiments/sweeps/gpu-h100"
    files = sorted(str(p.relative_to(archive)) for p in archive.rglob("*") if p.is_file())
    assert {f.split("/")[1] for f in files} == {"run-a", "run-c", "run-d"}
    assert not [f for f in files if "/model" in f or f.endswith(".log")]
    assert "table2_homogeneous-cpu-gpu/run-a/per_query.nfcorpus_test.json" in files
    assert (repo / "multirun/table9_recontriever-cpu-gpu/run-c/metrics.json").is_file()  # next call skips it

    again = ingest_module.ingest(calls, repo)  # idempotent: nothing appended the second time
    assert again["lines"] == []
    assert [json.loads(x) for x in speed.read_text().splitlines()] == [SPEED]


def test_a_dry_run_changes_nothing(ingest_module, tmp_path):
    repo, calls = tmp_path / "repo", tmp_path / "out"
    repo.mkdir()
    calls.mkdir()
    _tarball(calls / "studies.tar.gz", {"studies/speed.jsonl": json.dumps(SPEED) + "\n",
                                        "multirun/table3_ood-cpu-gpu/run-b/run_info.json": "{}"})
    out = ingest_module.ingest(calls, repo, dry_run=True)
    assert len(out["lines"]) == 1 and out["sweeps"] == ["table3_ood-cpu-gpu"] and out["archive"] is None
    assert list(repo.iterdir()) == []


def test_bad_input_names_the_folder_or_the_file_and_line(ingest_module, tmp_path):
    with pytest.raises(SystemExit, match=f"{tmp_path}: none of suite.tar.gz"):
        ingest_module.ingest(tmp_path, tmp_path)
    _tarball(tmp_path / "main.tar.gz", {"main/speed.jsonl": json.dumps(SPEED) + "\n" + json.dumps({"bench": "speed"})})
    with pytest.raises(SystemExit, match=r"main/speed.jsonl:2: a benchmark line without time, gpu"):
        ingest_module.ingest(tmp_path, tmp_path / "repo")
    assert not (tmp_path / "repo").exists()  # the first, good line was not written either


def test_the_batch_receive_bench_goes_with_the_speed_lines(ingest_module):
    line = json.dumps({"time": "2026-11-28T10:00:00", "gpu": "NVIDIA H200", "bench": "batch_receive"})
    assert ingest_module.route(line, "x:1") == Path("bench/results/gpu/2026-11-28-h200-speed.jsonl")


def test_gpu_tag(ingest_module):
    assert ingest_module.gpu_tag("NVIDIA H100 80GB HBM3") == "h100"
    assert ingest_module.gpu_tag("NVIDIA H200") == "h200"
    assert ingest_module.gpu_tag("NVIDIA A100-SXM4-80GB") == "a100"
    assert ingest_module.gpu_tag("Tesla T4") == "gpu"


def test_a_suite_stopped_before_its_summary_still_names_its_failures(ingest_module):
    """H6 (2026-11-27): the suite was cut at its time limit before pytest's summary, so its log showed an ``F`` and no
    test name; with ``-v`` each test's outcome is a line of its own as it ends."""
    log = ["bringing up nodes...",
           "[gw1] [  5%] PASSED tests/test_a.py::test_one ",
           "[gw0] [ 10%] FAILED tests/test_cuda.py::test_two[two_tower] ",
           "[gw2] [ 15%] SKIPPED tests/test_b.py::test_three ",
           "[gw3] [ 20%] ERROR tests/test_c.py::test_four ",
           "[gw1] [ 25%] PASSED tests/test_a.py::test_one ",  # a test named again (the -rA summary) counts once
           "FAILED tests/test_cuda.py::test_two[two_tower] - AssertionError: assert [(3, ['x.py:1'])] == []"]
    assert ingest_module.suite_outcomes(log) == {"PASSED": ["tests/test_a.py::test_one"],
                                                 "FAILED": ["tests/test_cuda.py::test_two[two_tower]"],
                                                 "SKIPPED": ["tests/test_b.py::test_three"],
                                                 "ERROR": ["tests/test_c.py::test_four"]}
    assert ingest_module.suite_outcomes(["....F.... [ 59%]"]) == {}
    # H7: a test's captured output, printed indented in the failures section, is not an outcome
    assert ingest_module.suite_outcomes(["  not passed: tests/test_x.py::test_y",
                                         "  FAILED tests/test_x.py::test_y"]) == {}
