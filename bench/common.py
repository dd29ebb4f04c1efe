"""Shared by the benchmark scripts: the machine-info header of a result line and appending it to a JSONL file."""

from __future__ import annotations

import json
import os
import platform
import time
from pathlib import Path


def machine_info() -> dict:
    """Timestamp, CPU architecture and core count: the first fields of every result line."""
    return {"time": time.strftime("%Y-%m-%dT%H:%M:%S"), "machine": platform.machine(), "cpus": os.cpu_count()}


def append_result(out: Path, res: dict) -> None:
    """Append ``res`` as one JSON line to ``out`` (creating its folder) and print it."""
    out.parent.mkdir(parents=True, exist_ok=True)
    with out.open("a") as f:
        f.write(json.dumps(res) + "\n")
    print(json.dumps(res, indent=2))
