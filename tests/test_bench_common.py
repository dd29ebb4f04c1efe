"""bench/common.py helpers that the GPU sessions read numbers from (the benchmarks themselves run in ``make bench``)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]


def _common():
    spec = importlib.util.spec_from_file_location("bench_common", REPO / "bench" / "common.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def test_profile_steps_splits_a_step_into_operators_and_device_time():
    common = _common()
    weights = torch.randn(256, 256)
    out = common.profile_steps(lambda x: (x @ weights).relu().sum(), [torch.randn(64, 256) for _ in range(3)],
                               torch.device("cpu"))
    assert out["steps"] == 3 and out["wall_s"] > 0 and out["device_busy_s"] == 0  # no device on a CPU
    assert 0 < out["host_op_s"] <= out["wall_s"] * 1.5  # several threads may overlap, never by much
    assert "aten::mm" in out["top_host"] and out["top_device"] == {}
