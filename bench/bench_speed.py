"""Speed benchmarks, each side by side in one process on the same batches, reported as ratios. Run with
``make bench`` (``--quick`` on a CPU, the full sizes on a GPU); one JSON line per run is appended to
``bench/results/speed.jsonl`` with machine info and date.

Ratios (> 1 = multipos faster), with the targets of issue 9:

* ``step_vs_bare`` = bare step time / multipos step time (≥ 0.95): the RetrieverModule's forward, loss,
  backward, clipping and AdamW step against the same computation written directly on ``transformers``;
* ``step_vs_st_mnrl`` = sentence-transformers MultipleNegativesRankingLoss step time / multipos step time
  (≥ 1.0), with the same attention dropout as multipos (0, ``model=minilm``); ``step_vs_st_mnrl_shipped``
  keeps the checkpoint's attention dropout 0.1 on the sentence-transformers side;
* ``lightning_vs_bare`` = bare step time / Lightning ``fit`` step time (≥ 0.9): the whole loop — data loading,
  collation (tokenisation), transfer, step, logging — against the bare step on batches already collated, timed
  right before it; the median over ``--loop-rounds`` rounds (``lightning_rounds`` lists each round's seconds). Every
  Lightning loop runs the trainer a user runs on the device (:func:`sides.lightning_loop`: ``trainer=gpu`` on CUDA,
  logging and refreshing its progress bar every 10 steps since 2026-11-26; up to H5 the loops ran
  ``conf/trainer/default.yaml``, logging every step, without a bar).
  Since 2026-11-27 the rounds run on the batches the loop over the data module trains on (``loop_batches`` of them),
  collated beforehand for the bare loop; before, on the first ``rounds`` + 1 of them, cycled.
  ``lightning_collated_vs_bare``: the Lightning loop over those collated batches (its cost apart from receiving them
  from DataLoader workers); ``lightning_descriptors_vs_bare``: the loop over the data module with its workers sending
  tensors by file descriptor (torch's default) instead of by file name (:class:`multipos.data.loader.WorkerInit`);
  ``lightning_pinned_vs_bare``: the loop over the data module with the DataLoader's pin-memory thread receiving and
  pinning each batch (``MultiPosDataModule.pin_memory``; CUDA only: elsewhere the same loop as the default);
  ``gap_s_lightning_<loop>``: the median seconds between one step's end and the next one's start in each loop
  (fetching and moving the batch, Lightning's bookkeeping). Up to H6 (2026-11-27) each round also timed the loop
  without the module's ``self.log`` calls (``lightning_unlogged_vs_bare``: 0.978 against 0.934 logged) and both
  loops synchronised only at their ends (``lightning_run_vs_bare_run``: 0.832 against 0.842 per step);
* ``profile_bare_step``: the bare step over 6 of those batches under ``torch.profiler`` (``common.profile_steps``):
  seconds a step of device kernels against the step's wall time, and the operators that take the most host and
  device time;
* ``encode_vs_st`` = sentence-transformers ``encode`` time / multipos ``encode`` time (≥ 1.2), same passages,
  batch size and truncation; each side in its own default precision (multipos: bf16 where native; ST: fp32);
  ``encode_tokenize_s`` against ``encode_s_multipos``: the tokenizer alone over the same windows, against the whole
  encode (what bounds it on a GPU); ``encode_s_new_shapes_512`` against ``encode_s_seen_shapes_512``: the same passages
  at up to 512 tokens in batches of 61, first with every batch shape new to the process, then again;
* ``objective_share@B,G`` = objective time (forward + backward of the loss on a [B, B·G] score matrix) / step
  time (≤ 1 %), for B=128, G=8 and B=512, G=16; the step is measured at those sizes on a GPU (or with
  ``--full-step``), else extrapolated from the measured step (see ``step_estimate``);
* ``ddp``: 2 processes vs 1 and peak memory with and without GradCache at B=128 × G=8 (:mod:`bench_ddp`);
* ``collate_store_vs_texts`` = seconds to collate a batch tokenising its passage texts / seconds with the passages'
  token ids from the store tokenised once (:mod:`multipos.data.passage_tokens`), one tokenizer thread as in a
  DataLoader worker, B=64 × G=8 at 128 tokens on every device (collation is CPU work); ``store_build_s``: the store's
  one batched tokenisation of the training passages.

Options: ``--threads N`` (torch CPU threads; 1 keeps the ratios stable on a CPU shared with other jobs),
``--skip steps encode share ddp collate``, ``--out FILE``, ``--workers 4,8,12`` (the Lightning loop again with each
DataLoader worker count, against a bare loop timed right before it: ``lightning_vs_bare_workers_<n>``),
``--loop-steps N`` (steps of each Lightning loop; default: rounds), ``--loop-rounds N`` (default 3). A SIGTERM
(``timeout``) still writes the line, with what was measured before it and ``stopped_in`` naming the phase it stopped
(exit status 124).

Sizes: ``--quick`` B=4, G=4, 32/64-token queries/passages, 128 passages encoded at 64 tokens; full: B=64, G=8,
32/128 tokens, 4096 passages at 256 tokens. Default: full on CUDA, quick otherwise. Device: CUDA when available;
autocast bf16 only where native (:func:`multipos.auto_precision`), else fp32.
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
from common import append_result, bench_data, interleaved, machine_info, pick_device, profile_steps, sync

OUT = Path(__file__).resolve().parent / "results" / "speed.jsonl"
SIZES = {
    "quick": dict(batch=4, group=4, query_len=32, passage_len=64, rounds=5, encode_n=128, encode_len=64),
    "full": dict(batch=64, group=8, query_len=32, passage_len=128, rounds=10, encode_n=4096, encode_len=256),
}
SHARE_SIZES = ((128, 8), (512, 16))


def step_ratios(data, device, bf16: bool, size: dict, res: dict, workers: list[int] = (), loop_steps: int | None = None,
                loop_rounds: int = 3):
    """multipos vs bare vs sentence-transformers MNRL steps, then the Lightning loop in ``loop_rounds`` rounds (each
    against a bare loop timed right before it; ``lightning_rounds``), on the same batches."""
    from sides import bare_step, data_module, lightning_loop, multipos_step, st_columns, st_model, st_step

    B, G, rounds = size["batch"], size["group"], size["rounds"]
    dm = data_module(data, B, G, size["query_len"], size["passage_len"])
    steps = loop_steps or rounds
    loop_batches = []  # what every Lightning loop over the data module trains on: its epoch 0, the same at every fit
    for batch in dm.train_dataloader():
        loop_batches.append(batch)
        if len(loop_batches) == max(rounds, steps) + 1:
            break
    loop_batches, batches = loop_batches[: steps + 1], loop_batches[: rounds + 1]
    queries = {q: text for q, text, _ in data.queries}
    sides = {"multipos": multipos_step(data, device, bf16), "bare": bare_step(data, device, bf16, G)}
    st_sides = {}
    for tag, dropout in (("st_mnrl", 0.0), ("st_mnrl_shipped", None)):
        st = st_model(data, device, size["passage_len"], dropout)
        cols = [st_columns(st, b, data.passages, queries, G) for b in batches]
        st_sides[tag] = (st_step(st, device, bf16), cols)
    # every side on batch j before any side on batch j + 1; ST sides take their own tokenisation of batch j
    index = {id(b): j for j, b in enumerate(batches)}
    for tag, (fn, cols) in st_sides.items():
        sides[tag] = lambda b, fn=fn, cols=cols: fn(cols[index[id(b)]])
    t = interleaved(sides, batches, warmup=1, device=device)
    res.update({f"step_s_{k}": round(v, 4) for k, v in t.items()})
    res["queries_per_s_multipos_step"] = round(B / t["multipos"], 2)
    res["passages_per_s_multipos_step"] = round(B * G / t["multipos"], 2)
    res["step_vs_bare"] = round(t["bare"] / t["multipos"], 3)
    res["step_vs_st_mnrl"] = round(t["st_mnrl"] / t["multipos"], 3)
    res["step_vs_st_mnrl_shipped"] = round(t["st_mnrl_shipped"] / t["multipos"], 3)
    res["dropout"] = {"multipos": "attention 0.0 (model=minilm), hidden 0.1", "bare": "attention 0.0, hidden 0.1",
                      "st_mnrl": "attention 0.0, hidden 0.1",
                      "st_mnrl_shipped": "attention 0.1, hidden 0.1 (checkpoint)"}
    del st_sides, sides

    # the Lightning loop against a bare loop timed right before it, in rounds: the bare loop's own time moved by 36 %
    # between two runs on the H200 (H5: 0.047 and 0.064 s on the same batches), so each loop is compared with its own
    # round's bare loop and the ratio is the median over rounds. Since 2026-11-27 every loop of a round runs on the
    # batches the data module's loop trains on (its epoch 0, the same at every fit: seed 0), collated beforehand for the
    # bare loop and the collated Lightning loop, so the loop over the data module differs from the collated one only in
    # receiving them from its DataLoader workers. Each Lightning loop also records the seconds between one step's end
    # and the next one's start (``gap_s_*``: fetching and moving the batch, Lightning's bookkeeping).
    bare_fn, per_round = bare_step(data, device, bf16, G), []
    res["lightning_rounds"] = per_round  # filled round by round: a stopped run still writes the finished rounds
    for _ in range(loop_rounds):
        gaps = {"collated": [], "loop": [], "descriptors": [], "pinned": []}
        bare_r = interleaved({"bare": bare_fn}, loop_batches, warmup=1, device=device)["bare"]
        collated_r = statistics.median(lightning_loop(data, loop_batches, device, steps, gaps=gaps["collated"]))
        loop_r = statistics.median(lightning_loop(data, dm, device, steps, gaps=gaps["loop"]))
        descriptors_r = statistics.median(lightning_loop(data, dm, device, steps, gaps=gaps["descriptors"],
                                                         sharing="file_descriptor"))
        pinned_r = statistics.median(lightning_loop(data, dm, device, steps, gaps=gaps["pinned"],
                                                    pin_memory=device.type == "cuda"))
        per_round.append({"bare": round(bare_r, 4), "lightning_collated": round(collated_r, 4),
                          "lightning_loop": round(loop_r, 4), "lightning_descriptors": round(descriptors_r, 4),
                          "lightning_pinned": round(pinned_r, 4),
                          **{f"gap_{k}": round(statistics.median(v), 4) for k, v in gaps.items()}})
    res["loop_batches"] = len(loop_batches)
    res["step_s_lightning_loop"] = round(statistics.median(r["lightning_loop"] for r in per_round), 4)
    res["step_s_lightning_collated"] = round(statistics.median(r["lightning_collated"] for r in per_round), 4)
    res["step_s_bare_for_loop"] = round(statistics.median(r["bare"] for r in per_round), 4)
    res["lightning_vs_bare"] = round(statistics.median(r["bare"] / r["lightning_loop"] for r in per_round), 3)
    for side in ("lightning_collated", "lightning_descriptors", "lightning_pinned"):
        res[f"{side}_vs_bare"] = round(statistics.median(r["bare"] / r[side] for r in per_round), 3)
    for side in ("collated", "loop", "descriptors", "pinned"):
        res[f"gap_s_lightning_{side}"] = round(statistics.median(r[f"gap_{side}"] for r in per_round), 4)
    res["queries_per_s_lightning_loop"] = round(B / res["step_s_lightning_loop"], 2)
    # where the bare step's time goes on this machine: the device's kernels, or the host (H6's steps took twice H5's on
    # the same kind of card, which a device-bound step would not). After the ratios: a profiler fault loses only itself
    try:
        res["profile_bare_step"] = profile_steps(bare_fn, loop_batches[:6], device)
    except Stopped:
        raise
    except Exception as exc:  # noqa: BLE001 -- recorded in the line, the rest of the bench goes on
        res["profile_bare_step"] = {"error": f"{type(exc).__name__}: {exc}"}
    res["dataloader_workers"] = dm.num_workers
    default_workers = dm.num_workers
    for n in workers:  # the same loop with n DataLoader workers, against a bare loop timed right before it
        dm.num_workers = n
        bare_n = interleaved({"bare": bare_fn}, loop_batches, warmup=1, device=device)["bare"]
        loop_n = lightning_loop(data, dm, device, loop_steps or rounds)
        res[f"step_s_lightning_loop_workers_{n}"] = round(statistics.median(loop_n), 4)
        res[f"step_s_bare_before_workers_{n}"] = round(bare_n, 4)
        res[f"lightning_vs_bare_workers_{n}"] = round(bare_n / statistics.median(loop_n), 3)
    dm.num_workers = default_workers
    return t["multipos"]


def encode_ratio(data, device, bf16: bool, size: dict, res: dict) -> None:
    """multipos ``encode`` vs sentence-transformers ``encode`` on the same passages (interleaved rounds)."""
    import numpy as np
    from sides import multipos_model, st_model

    from multipos.retrieval.encoding import encode

    texts = list(data.passages.values())[: size["encode_n"]]
    length, batch = size["encode_len"], 64
    model = multipos_model(data).to(device)
    st = st_model(data, device, length, None)
    out = {}
    sides = {"multipos": lambda x: out.__setitem__("multipos", encode(
                 model, x, "passage", max_length=length, batch_size=batch, bf16=bf16, progress=False, device=None)),
             "sentence_transformers": lambda x: out.__setitem__("st", st.encode(
                 x, batch_size=batch, show_progress_bar=False, convert_to_numpy=True))}
    t = interleaved(sides, [texts[:32], texts, texts], warmup=1, device=device)  # warm-up on 32 passages
    res["encode_passages_per_s_multipos"] = round(len(texts) / t["multipos"], 1)
    res["encode_passages_per_s_st"] = round(len(texts) / t["sentence_transformers"], 1)
    res["encode_vs_st"] = round(t["sentence_transformers"] / t["multipos"], 3)
    res["encode_precision"] = {"multipos": "bf16 autocast" if bf16 else "fp32", "st": "fp32 (its default)"}
    # what bounds encoding: the tokenizer alone over the same windows encode() tokenises (on CUDA it now runs in a
    # background thread while the GPU encodes the previous window), against the whole encode
    from multipos.retrieval.encoding import TOKENIZE_BATCHES

    window, start = batch * TOKENIZE_BATCHES, time.perf_counter()
    for first in range(0, len(texts), window):
        model.tokenize(texts[first : first + window], kind="passage", max_length=length)
    res["encode_tokenize_s"] = round(time.perf_counter() - start, 3)
    res["encode_s_multipos"] = round(t["multipos"], 3)
    # shapes met for the first time: interleaved() warms every shape before timing, but a job encoding a corpus once
    # meets each padded width once (on CUDA, cuDNN's attention builds a plan per shape: the suspected reason the main
    # job encoded TREC DL 2019 at 1,265 passages/s and TREC DL 2020 right after at 2,134/s, H5). A batch size used
    # nowhere else (61) and up to 512 tokens make every batch shape new, then the same encode again meets them all seen.
    for tag in ("new", "seen"):
        start = time.perf_counter()
        encode(model, texts, "passage", max_length=512, batch_size=61, bf16=bf16, progress=False, device=None)
        sync(device)
        res[f"encode_s_{tag}_shapes_512"] = round(time.perf_counter() - start, 3)
    a, b = out["multipos"], np.asarray(out["st"], dtype=np.float32)
    res["encode_min_cosine_multipos_vs_st"] = round(float(np.min(np.sum(a * b, 1) / (
        np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1)))), 6)


def collate_ratio(data, res: dict, rounds: int = 10) -> None:
    """The collate function with the passage token store against tokenising the passage texts, on the same groups
    (B=64 × G=8, 32/128 tokens); the batches are checked equal first."""
    from sides import data_module

    from multipos.data.collate import GroupCollator

    dm = data_module(data, 64, 8, 32, 128)
    start = time.perf_counter()
    with_store = dm.collator()
    res["store_build_s"] = round(time.perf_counter() - start, 2)
    res["store_passages"] = len(with_store.passage_tokens)
    texts = GroupCollator(dm.tokenizer, dm.corpus, dm.query_prompt, dm.passage_prompt, 32, 128)
    n = len(dm.dataset)
    batches = [[dm.dataset[((k * 64 + i) % n, 0)] for i in range(64)] for k in range(rounds)]
    a, b = with_store(batches[0]), texts(batches[0])
    assert all(torch.equal(a.passages[k], b.passages[k]) for k in b.passages), "store batches differ"
    tokenizers_parallel = os.environ.get("TOKENIZERS_PARALLELISM")
    os.environ["TOKENIZERS_PARALLELISM"] = "false"  # one thread, as in a DataLoader worker
    try:
        t = interleaved({"texts": texts, "store": with_store}, batches, warmup=1, device=torch.device("cpu"))
    finally:
        if tokenizers_parallel is None:
            os.environ.pop("TOKENIZERS_PARALLELISM")
        else:
            os.environ["TOKENIZERS_PARALLELISM"] = tokenizers_parallel
    res["collate_s_texts"], res["collate_s_store"] = round(t["texts"], 4), round(t["store"], 4)
    res["collate_store_vs_texts"] = round(t["texts"] / t["store"], 2)


def objective_share(data, device, bf16: bool, size: dict, step_s: float, full_step: bool, res: dict) -> None:
    """Objective forward + backward on [B, B·G] score matrices (every objective; G/2 positives per query) as a
    share of the step at the same B, G: measured when ``full_step``, else the measured step scaled linearly in
    tokens (B·Lq + B·G·Lp) from the benchmark's own size."""
    from multipos.losses import OBJECTIVES, SINGLE_POSITIVE, ContrastiveLoss

    for B, G in SHARE_SIZES:
        n = B * G
        scores = torch.randn(B, n, device=device, requires_grad=True)
        pos = torch.zeros(B, n, dtype=torch.bool, device=device)
        for i in range(B):
            pos[i, i * G: i * G + G // 2] = True
        one = torch.zeros_like(pos)
        one[torch.arange(B), torch.arange(B) * G] = True  # single-positive objectives: the first positive only
        times = {}
        for name in OBJECTIVES:
            loss, p = ContrastiveLoss(name), (one if name in SINGLE_POSITIVE else pos)
            times[name] = interleaved({name: lambda _, loss=loss, p=p: loss(scores, p, ~pos).backward()},
                                      [None] * 6, warmup=1, device=device)[name]
        lq, lp = size["query_len"], size["passage_len"]
        if full_step:
            step, how = _measured_step(data, device, bf16, B, G, lq, lp)
        else:
            b, g = size["batch"], size["group"]
            step = step_s * (B * lq + B * G * lp) / (b * lq + b * g * lp)
            how = (f"extrapolated: measured step at B={b}, G={g} ({step_s:.3f} s) x (B*{lq} + B*G*{lp}) / "
                   f"({b}*{lq} + {b}*{g}*{lp}) query+passage tokens")
        key = f"B{B}_G{G}"
        res[f"objective_s_{key}"] = {k: round(v, 5) for k, v in times.items()}
        if step is None:
            res[f"objective_share_{key}"] = how
            continue
        res[f"step_s_{key}"] = round(step, 3)
        res[f"step_estimate_{key}"] = how
        res[f"objective_share_{key}_lsepair"] = round(times["lsepair"] / step, 5)
        res[f"objective_share_{key}_max"] = round(max(times.values()) / step, 5)


def _measured_step(data, device, bf16, B, G, lq, lp):
    """The multipos step at B × G on full-length random token ids (3 timed steps) → (seconds, how)."""
    from sides import multipos_step

    from multipos.data.collate import Batch

    step = multipos_step(data, device, bf16)

    def tokens(n, length):
        return {"input_ids": torch.randint(100, 1000, (n, length)),
                "attention_mask": torch.ones(n, length, dtype=torch.long)}

    pos = torch.zeros(B, B * G, dtype=torch.bool)
    pos[torch.arange(B), torch.arange(B) * G] = True
    batch = Batch(tokens(B, lq), tokens(B * G, lp), pos, ~pos, [f"q{i}" for i in range(B)],
                  [f"p{j}" for j in range(B * G)])
    try:
        t = interleaved({"step": step}, [batch] * 4, warmup=1, device=device)["step"]
    except torch.OutOfMemoryError as e:
        return None, f"not measured: out of memory at B={B}, G={G}, {lp} tokens ({str(e).splitlines()[0]})"
    finally:
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return t, f"measured: multipos step at B={B}, G={G}, full-length {lq}/{lp}-token random ids"


class Stopped(Exception):
    """SIGTERM during a phase (``timeout`` in ``bench/gpu/call_main.sh`` sends it): the line is still written, with what
    was measured before it and ``stopped_in`` naming the phase."""


def _stop(signum, frame) -> None:
    raise Stopped(f"signal {signum}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action=argparse.BooleanOptionalAction, default=None,
                    help="small sizes (default: quick on a CPU, full on CUDA)")
    ap.add_argument("--full-step", action=argparse.BooleanOptionalAction, default=None,
                    help="measure the step at B=128,G=8 and B=512,G=16 (default: on CUDA only)")
    ap.add_argument("--skip", nargs="*", default=[], choices=["steps", "encode", "share", "ddp", "collate"])
    ap.add_argument("--threads", type=int, default=None,
                    help="torch CPU threads (default: torch's); 1 keeps ratios stable on a CPU shared with other jobs")
    ap.add_argument("--workers", type=lambda v: [int(x) for x in v.split(",")], default=[],
                    help="also time the Lightning loop with each of these DataLoader worker counts, e.g. 4,8,12")
    ap.add_argument("--loop-steps", type=int, default=None, help="steps of each Lightning loop (default: rounds)")
    ap.add_argument("--loop-rounds", type=int, default=3,
                    help="rounds of bare loop, Lightning loop over collated batches, "
                         "Lightning loop over the data module")
    ap.add_argument("--out", type=Path, default=OUT, help=f"results file (default {OUT.relative_to(OUT.parents[2])})")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    os.environ.setdefault("MULTIPOS_CACHE", tempfile.mkdtemp(prefix="multipos-bench-"))
    device = pick_device()
    quick = device.type != "cuda" if args.quick is None else args.quick
    full_step = device.type == "cuda" if args.full_step is None else args.full_step
    size = SIZES["quick" if quick else "full"]
    from multipos.hardware import native_bf16

    bf16 = native_bf16()
    data = bench_data()
    res = {**machine_info(), "bench": "speed", "size": "quick" if quick else "full", **size, "device": str(device),
           "precision": "bf16 autocast" if bf16 else "fp32", "model": Path(data.model).name,
           "data": "nfcorpus" if data.real else "random texts", "objective_in_steps": "singlelh",
           "targets": {"step_vs_bare": 0.95, "step_vs_st_mnrl": 1.0, "lightning_vs_bare": 0.9, "encode_vs_st": 1.2,
                       "objective_share": 0.01}}
    phases, step_s = {}, None

    def phase(name, fn, *a):
        start = time.perf_counter()
        try:
            out = fn(*a)
        except Stopped:
            res["stopped_in"] = name
            raise
        finally:
            phases[name] = round(time.perf_counter() - start, 1)
            print(f"[bench] {name}: {phases[name]} s", flush=True)
        return out

    signal.signal(signal.SIGTERM, _stop)
    stopped = False
    try:
        if "collate" not in args.skip:
            phase("collate", collate_ratio, data, res)
        if "steps" not in args.skip:
            step_s = phase("steps", step_ratios, data, device, bf16, size, res, args.workers, args.loop_steps,
                           args.loop_rounds)
        if "encode" not in args.skip:
            phase("encode", encode_ratio, data, device, bf16, size, res)
        if "share" not in args.skip and (step_s is not None or full_step):
            phase("share", objective_share, data, device, bf16, size, step_s, full_step, res)
        if "ddp" not in args.skip:
            from bench_ddp import ddp_and_grad_cache

            res["ddp"] = phase("ddp", ddp_and_grad_cache, quick)
    except Stopped:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        stopped = True
    res["phase_wall_s"] = phases
    append_result(args.out, res)
    if stopped:
        sys.exit(124)


if __name__ == "__main__":
    main()
