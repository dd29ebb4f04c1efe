"""DDP on 2 CPU processes: throughput vs 1 process, and peak memory with and without GradCache at B=128 × G=8.

>>> ddp_and_grad_cache(quick=True)   # called by bench_speed.py; {"status": "not available: ..."} until the
...                                  # trainer=ddp config and module.grad_cache_chunk_size exist
"""

from __future__ import annotations

import inspect
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def missing() -> list[str]:
    """What the measurement needs and this checkout lacks: the ``trainer=ddp`` config and GradCache in the module."""
    out = []
    if not (REPO / "conf" / "trainer" / "ddp.yaml").is_file():
        out.append("conf/trainer/ddp.yaml (trainer=ddp)")
    from multipos.module import RetrieverModule

    if "grad_cache_chunk_size" not in inspect.signature(RetrieverModule).parameters:
        out.append("RetrieverModule(grad_cache_chunk_size=...) (module.grad_cache_chunk_size)")
    return out


# ---------------------------------------------------------------- DDP / GradCache benchmark (issue 9)
def ddp_and_grad_cache(quick: bool) -> dict:
    """Throughput of 2 CPU processes vs 1, and peak memory with and without GradCache at B=128 × G=8.

    Returns ``{"status": "not available: ..."}`` (no numbers) while :func:`missing` names anything."""
    lacking = missing()
    if lacking:
        return {"status": "not available: this checkout has no " + " and no ".join(lacking)}
    return {"status": "not available: the measurement is not wired up yet"}
