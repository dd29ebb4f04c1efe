"""Shared by the benchmark scripts: machine info, appending a result line, interleaved timing, the device and
its autocast, and the model and texts every benchmark runs on."""

from __future__ import annotations

import contextlib
import json
import os
import platform
import random
import statistics
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def machine_info() -> dict:
    """Date, git commit, CPU model, core count, 1-minute load average (other jobs on the machine slow every
    side alike, but it is worth knowing), torch/CUDA versions, the CPU's vector width as torch reads it
    (``"AVX2"``, ``"AVX512"``) and whether it computes bf16 natively, and the GPU name when one is used."""
    info = {"time": time.strftime("%Y-%m-%dT%H:%M:%S"), "machine": platform.machine(), "cpu": _cpu_name(),
            "cpus": os.cpu_count()}
    with contextlib.suppress(OSError):
        info["load_1min"] = round(os.getloadavg()[0], 2)
    with contextlib.suppress(OSError, subprocess.CalledProcessError):
        info["commit"] = subprocess.check_output(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"],
                                                 text=True, stderr=subprocess.DEVNULL).strip()
    try:
        import torch
    except ImportError:
        return info
    from multipos.hardware import cpu_bf16

    # the CPU name alone does not tell the kinds apart: "AMD EPYC" has come both with AVX-512 and native bf16 and
    # with AVX2 only (2026-12-07, fp32 matmul 126 against 190 GFLOP/s)
    info.update(torch=torch.__version__, threads=torch.get_num_threads(),
                cpu_capability=torch.backends.cpu.get_cpu_capability(), cpu_native_bf16=cpu_bf16())
    if torch.cuda.is_available():
        info.update(gpu=torch.cuda.get_device_name(0), cuda=torch.version.cuda)
    return info


def append_result(out: Path, res: dict) -> None:
    """Append ``res`` as one JSON line to ``out`` (creating its folder) and print it."""
    out.parent.mkdir(parents=True, exist_ok=True)
    with out.open("a") as f:
        f.write(json.dumps(res) + "\n")
    print(json.dumps(res, indent=2))


def bench_setup():
    """What every benchmark starts with → (device, bf16, data): a private embedding cache unless ``MULTIPOS_CACHE`` is
    set, :func:`pick_device`, native bf16 (:func:`multipos.hardware.native_bf16`) and :func:`bench_data`."""
    os.environ.setdefault("MULTIPOS_CACHE", tempfile.mkdtemp(prefix="multipos-bench-"))
    from multipos.hardware import native_bf16

    return pick_device(), native_bf16(), bench_data()


def pick_device():
    """CUDA when available, else the CPU (torch.device)."""
    import torch

    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def sync(device) -> None:
    """Wait for queued GPU work, so a timer around a step measures the step."""
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)


def interleaved(sides: dict, inputs: list, warmup: int = 1, device=None) -> dict[str, float]:
    """Median seconds per call of each ``sides[name](x)`` over ``inputs``, the sides taking turns on every
    input (A B C, A B C, …) so that machine noise falls on all of them alike. The first ``warmup`` inputs
    run untimed.

    On CUDA every side first runs once on every input, untimed: cuDNN's attention builds an execution plan per input
    shape, and padded batches differ in shape, so the first side to meet a shape paid for the plan and the others
    reused it (H100, 2026-11-25: multipos's step, always first, measured 0.19 s against 0.06 s for the same
    computation written bare right after it, while the Lightning loop over the same batches took 0.086 s).
    """
    times: dict[str, list[float]] = {name: [] for name in sides}
    if device is not None and device.type == "cuda":  # as sync() tells a GPU
        for x in inputs:
            for fn in sides.values():
                fn(x)
        sync(device)
    for j, x in enumerate(inputs):
        for name, fn in sides.items():
            start = time.perf_counter()
            fn(x)
            if device is not None:
                sync(device)
            if j >= warmup:
                times[name].append(time.perf_counter() - start)
    return {name: statistics.median(t) for name, t in times.items()}


def loop_time(fn, inputs: list, device=None, warmup: int = 1) -> float:
    """Mean seconds per call of ``fn(x)`` over ``inputs[warmup:]`` run back to back, the device synchronised only
    before the first timed call and after the last: what a training loop that never waits for the device achieves
    (the host queues each step while the device still runs the one before). :func:`interleaved` synchronises after
    every call instead (the step's latency)."""
    for x in inputs[:warmup]:
        fn(x)
    if device is not None:
        sync(device)
    start = time.perf_counter()
    for x in inputs[warmup:]:
        fn(x)
    if device is not None:
        sync(device)
    return (time.perf_counter() - start) / max(1, len(inputs) - warmup)


@dataclass
class BenchData:
    """What the speed benchmarks run on: a checkpoint folder, passage texts by id, and training queries
    (id, text, one positive passage id); ``real`` says whether it is all-MiniLM-L6-v2 + NFCorpus."""

    model: str
    passages: dict[str, str]
    queries: list[tuple[str, str, str]]
    real: bool


def _tiny(folder: Path, n_passages: int = 2000, n_queries: int = 400) -> BenchData:
    """A 2-layer 64-dim random BERT and random-word texts (used when the assets are absent)."""
    import torch
    from transformers import BertConfig, BertModel, BertTokenizerFast

    rng = random.Random(0)
    words = [f"w{i}" for i in range(500)]
    (folder / "vocab.txt").write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *words]) + "\n")
    BertTokenizerFast(str(folder / "vocab.txt")).save_pretrained(folder)
    torch.manual_seed(0)
    BertModel(BertConfig(vocab_size=505, hidden_size=64, num_hidden_layers=2, num_attention_heads=2,
                         intermediate_size=128, max_position_embeddings=512)).save_pretrained(folder)
    passages = {f"p{i}": " ".join(rng.choices(words, k=rng.randint(40, 300))) for i in range(n_passages)}
    queries = [(f"q{i}", " ".join(rng.choices(words, k=8)), f"p{rng.randrange(n_passages)}") for i in range(n_queries)]
    return BenchData(str(folder), passages, queries, real=False)


def bench_data() -> BenchData:
    """all-MiniLM-L6-v2 and NFCorpus (train queries with their first judged passage) from ``$MULTIPOS_ASSETS``
    (default ``../shared/assets``), or a tiny random model and texts when they are missing."""
    from multipos.assets import assets_dir
    from multipos.formats.beir import read_corpus, read_queries
    from multipos.formats.trec import read_qrels

    root = assets_dir()
    model, data = root / "models" / "all-MiniLM-L6-v2", root / "data" / "nfcorpus"
    if not (model.is_dir() and (data / "corpus.jsonl").is_file()):
        print(f"assets not found under {root}: benchmarking a tiny random BERT on random texts")
        return _tiny(Path(tempfile.mkdtemp(prefix="multipos-bench-model-")))
    corpus = read_corpus(data / "corpus.jsonl")
    texts = read_queries(data / "queries.jsonl")
    qrels = read_qrels(data / "qrels" / "train.tsv")
    queries = [(q, texts[q], next(iter(docs))) for q, docs in qrels.items() if docs and texts.get(q)]
    return BenchData(str(model), {p: corpus[p].full_text() for p in corpus.ids}, queries, real=True)


def profile_steps(fn, inputs: list, device) -> dict:
    """``fn(x)`` over ``inputs`` (after one untimed call on ``inputs[0]``) under ``torch.profiler``, the device
    synchronised after each call → where a step's time goes:

    * ``wall_s``: seconds a step (profiler overhead included);
    * ``device_busy_s``: seconds a step of kernels on the device (the sum of every event's self device time; one
      stream, so they do not overlap): ``wall_s`` well above it means the device waits for the host;
    * ``host_op_s``: seconds a step the host spends inside PyTorch operators (the sum of every event's self CPU time,
      all threads); the rest of ``wall_s`` is Python between the operators and waiting for the device;
    * ``top_host`` / ``top_device``: the 8 operators with the most self CPU / self device time, milliseconds a step.

    On a CPU ``device_busy_s`` is 0 and only the host columns mean anything."""
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    fn(inputs[0])
    sync(device)
    start = time.perf_counter()
    with profile(activities=activities) as prof:
        for x in inputs:
            fn(x)
            sync(device)
    wall = (time.perf_counter() - start) / len(inputs)
    events = prof.key_averages()
    dev = lambda e: getattr(e, "self_device_time_total", getattr(e, "self_cuda_time_total", 0)) or 0  # noqa: E731
    per_step_ms = lambda us: round(us / 1000 / len(inputs), 3)  # noqa: E731
    return {"steps": len(inputs), "wall_s": round(wall, 4),
            "device_busy_s": round(sum(dev(e) for e in events) / 1e6 / len(inputs), 4),
            "host_op_s": round(sum(e.self_cpu_time_total for e in events) / 1e6 / len(inputs), 4),
            "top_host": {e.key: per_step_ms(e.self_cpu_time_total)
                         for e in sorted(events, key=lambda e: -e.self_cpu_time_total)[:8]},
            "top_device": {e.key: per_step_ms(dev(e)) for e in sorted(events, key=lambda e: -dev(e))[:8] if dev(e)}}
