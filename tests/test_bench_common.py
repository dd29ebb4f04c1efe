"""bench/common.py helpers that the GPU sessions read numbers from (the benchmarks themselves run in ``make bench``)."""

from __future__ import annotations

import torch

from tests.helpers import load_bench


def _common():
    return load_bench("bench/common.py", "bench_common")


def test_profile_steps_splits_a_step_into_operators_and_device_time():
    common = _common()
    weights = torch.randn(256, 256)
    out = common.profile_steps(lambda x: (x @ weights).relu().sum(), [torch.randn(64, 256) for _ in range(3)],
                               torch.device("cpu"))
    assert out["steps"] == 3 and out["wall_s"] > 0 and out["device_busy_s"] == 0  # no device on a CPU
    assert 0 < out["host_op_s"] <= out["wall_s"] * 1.5  # several threads may overlap, never by much
    assert "aten::mm" in out["top_host"] and out["top_device"] == {}
