"""parallel_jobs=2: a sweep runs several cells at once (Hydra's joblib launcher), each with one torch thread, into
the same cell folders a one-at-a-time sweep uses; ``threads`` changes no run's identity."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

from multipos.hardware import cores_per_job, set_torch_threads
from multipos.runs.spec import run_key
from tests.helpers import REPO, compose_cfg, tiny_overrides


def test_set_torch_threads_sets_and_describes_and_refuses_nonsense():
    before = torch.get_num_threads()
    try:
        assert set_torch_threads(None) == "" and torch.get_num_threads() == before
        assert set_torch_threads(1) == ", 1 torch thread" and torch.get_num_threads() == 1
        for bad in (0, -2, 1.5):
            with pytest.raises(ValueError, match="threads: a positive whole number"):
                set_torch_threads(bad)
    finally:
        torch.set_num_threads(before)


def test_parallel_runs_share_the_cores(monkeypatch):
    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    assert cores_per_job(2) == 1 and cores_per_job(3) == 1
    monkeypatch.setattr(os, "cpu_count", lambda: 16)
    assert cores_per_job(2) == 8 and cores_per_job(1) == 16
    for bad in (0, 1.5):
        with pytest.raises(ValueError, match="cores_per_job"):
            cores_per_job(bad)


def test_threads_and_launcher_leave_the_config_hash_alone(tiny_beir, tiny_bert, tmp_path):
    plain = compose_cfg("train", tiny_overrides(tiny_beir, tiny_bert, tmp_path), return_hydra_config=True)
    assert plain.threads is None and plain.hydra.launcher.n_jobs == 1  # one job at a time: torch's own threads
    parallel = compose_cfg("train", [*tiny_overrides(tiny_beir, tiny_bert, tmp_path), "parallel_jobs=2"],
                           return_hydra_config=True)
    assert parallel.threads == max(1, (os.cpu_count() or 1) // 2) and parallel.hydra.launcher.n_jobs == 2
    assert "JoblibLauncher" in parallel.hydra.launcher._target_
    same = compose_cfg("train", [*tiny_overrides(tiny_beir, tiny_bert, tmp_path), "parallel_jobs=2"])
    assert run_key(plain) == run_key(same)  # a study started one run at a time continues in parallel
    three = compose_cfg("train", [*tiny_overrides(tiny_beir, tiny_bert, tmp_path),
                                  "parallel_jobs=3", "prepare_only=true"], return_hydra_config=True)
    assert three.hydra.launcher.n_jobs == 3 and three.threads == max(1, (os.cpu_count() or 1) // 3)
    three = compose_cfg("train", [*tiny_overrides(tiny_beir, tiny_bert, tmp_path),
                                  "parallel_jobs=3", "prepare_only=true"])
    assert run_key(three) == run_key(plain)  # make train: prepared alone, then continued three at a time
    freed = compose_cfg("train", [*tiny_overrides(tiny_beir, tiny_bert, tmp_path), "return_freed_memory=true"])
    assert freed.return_freed_memory is True and run_key(freed) == run_key(plain)  # a memory setting


# In a fresh process: free a 16 MiB block (glibc then raises its mmap threshold to 16 MiB), allocate 1 MiB, and print
# how many bytes the allocator holds in mmapped blocks (mallinfo2().hblkhd) beyond what it held before.
_MMAPPED_AFTER_A_BIG_FREE = """
import ctypes, sys
from multipos.hardware import return_freed_memory
print(return_freed_memory(sys.argv[1] == "on"))
libc = ctypes.CDLL("libc.so.6")
class Info(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in
                ("arena ordblks smblks hblks hblkhd usmblks fsmblks uordblks fordblks keepcost".split())]
libc.mallinfo2.restype = Info
libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
libc.free.argtypes = [ctypes.c_void_p]
libc.free(libc.malloc(16 << 20))
before = libc.mallinfo2().hblkhd
block = libc.malloc(1 << 20)
print(libc.mallinfo2().hblkhd - before)
libc.free(block)
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt / mallinfo2")
def test_return_freed_memory_serves_large_blocks_by_mmap_after_a_big_free():
    """Without the setting glibc keeps a 1 MiB block in the heap once a 16 MiB block was freed (its dynamic mmap
    threshold rose to 16 MiB), so freed activations stay resident; with it the block is mmapped (and unmapped when
    freed). Each case in a fresh process, which the setting changes for good."""
    def mmapped(mode: str) -> tuple[str, int]:
        out = subprocess.run([sys.executable, "-c", _MMAPPED_AFTER_A_BIG_FREE, mode], capture_output=True, text=True,
                             check=True, env={**os.environ, "PYTHONPATH": str(REPO / "src")}).stdout.split()
        return out[0], int(out[1])

    if subprocess.run([sys.executable, "-c", "import ctypes; ctypes.CDLL('libc.so.6').mallinfo2"]).returncode:
        pytest.skip("no glibc with mallinfo2 (2.33+)")
    assert mmapped("off") == ("False", 0)
    applied, grown = mmapped("on")
    assert applied == "True" and grown >= 1 << 20


def test_return_freed_memory_refuses_a_non_bool():
    from multipos.hardware import return_freed_memory

    assert return_freed_memory(False) is False
    for bad in (1, "yes", None):
        with pytest.raises(ValueError, match="return_freed_memory: true or false"):
            return_freed_memory(bad)


def test_a_parallel_sweep_trains_both_cells_sharing_the_cores(tiny_beir, tiny_bert, tmp_path):
    sweep = tmp_path / "sweep"
    overrides = [o for o in tiny_overrides(tiny_beir, tiny_bert, tmp_path) if not o.startswith("paths.output_dir=")]
    env = {**os.environ, "MULTIPOS_CACHE": str(tmp_path / "cache"), "HF_HUB_OFFLINE": "1"}
    p = subprocess.run([sys.executable, "train.py", "-m", *overrides, "eval.references=false", "parallel_jobs=2",
                        "data.num_workers=1",  # DataLoader workers inside a joblib worker start by pickling (loky)
                        f"hydra.sweep.dir={sweep}", "seed=1,2"], cwd=REPO, env=env, capture_output=True, text=True,
                       timeout=600)
    assert p.returncode == 0, (p.stdout + p.stderr)[-3000:]
    assert "Joblib.Parallel(n_jobs=2" in p.stdout + p.stderr
    cells = sorted(f.parent for f in sweep.rglob("run_info.json"))
    names = [str(c.relative_to(sweep)) for c in cells]
    assert len(cells) == 2 and all("/" not in n and len(n) <= 200 for n in names), names  # one short folder each
    seeds = sorted(next(line for line in (c / ".hydra" / "overrides.yaml").read_text().splitlines() if "seed=" in line)
                   for c in cells)
    assert seeds == ["- seed=1", "- seed=2"]  # the full overrides are in the folder
    assert not any("launcher" in n or "threads" in n for n in names)  # they name no cell
    for cell in cells:
        info = json.loads((cell / "run_info.json").read_text())
        each = max(1, (os.cpu_count() or 1) // 2)  # cores_per_job: 1 on the 2-core CPU
        assert info["status"] == "complete" and info["device"].endswith(f", {each} torch thread"
                                                                         + ("s" if each > 1 else ""))
        assert json.loads((cell / "metrics.json").read_text())["tiny_test"]["ndcg@10"] >= 0
