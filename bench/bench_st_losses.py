"""multipos's objectives inside sentence-transformers' trainer, against MNRL on split rows (issue 65), on NFCorpus.

Three ways to train all-MiniLM-L6-v2 on NFCorpus's graded training qrels with ``SentenceTransformerTrainer``, the same
starting model, batch size, epochs, learning rate and schedule, max lengths (32-token queries, 128-token passages) and
data (each query's first M positives and its first G − M BM25 hard negatives):

* ``mnrl``: ``MultipleNegativesRankingLoss`` (scale 1/τ) on split rows, one (query, positive, negative_1 …
  negative_{G−M}) row per positive, with ``BatchSamplers.NO_DUPLICATES`` (the usual way to train
  sentence-transformers on several positives);
* ``jointlh`` and ``lsepair``: :class:`multipos.sentence_transformers.MultiPositiveLoss` on one row per query with
  every positive in it (:class:`multipos.sentence_transformers.MultiPositiveDataCollator`, first-M positives).

Each is trained with every seed of ``--seeds`` and scored on the NFCorpus test split with multipos's evaluation
(:func:`multipos.retrieval.dense.dense_run`, :func:`multipos.evaluation.metrics.evaluate_run`: nDCG@10, Recall@100):
mean ± sd over seeds, and a paired t-test over the test queries (per-query means over seeds,
:func:`multipos.report.significance.paired_ttest`, ``scipy.stats.ttest_rel``) of jointlh and lsepair against mnrl.
Training time: seconds per epoch of ``trainer.train()``, as a ratio of mnrl's. Step time: one optimizer step of the
sentence-transformers loss (plain and cached) against multipos's own loop (``RetrieverModule.batch_loss``, the same
model, batch, objective, optimizer and clipping) on the same batch, the sides taking turns
(:func:`common.interleaved`).

    python bench/bench_st_losses.py [--seeds 42 43 44] [--epochs 3] [--max-queries N] [--out PATH] [--resume]

``--resume`` reuses the models already recorded in ``--out`` with the same settings on the same kind of machine
(its full run takes hours on 2 cores: it can be finished seed by seed, across sessions).

Defaults: the two-tower recipe's batch (32), G = 8, M = 2, lr 6.1e-5 with 10 % linear warm-up, 3 epochs, τ = 0.05,
teacher-ordered positives (conf/experiment/two_tower.yaml). A smoke run (about 2 min on the 2-core CPU):

    OMP_NUM_THREADS=1 python bench/bench_st_losses.py --seeds 42 --epochs 1 --max-queries 16 --batch 4 --group 4 \
        --max-positives 2 --ordering given --max-test-queries 5 --max-test-passages 100 --step-rounds 1 \
        --out /tmp/st_losses.jsonl

Appends one JSON line per trained model and one summary line to ``bench/results/st_losses.jsonl`` (``--out``) and
writes ``st_losses.md`` next to it. Assets: ``$MULTIPOS_ASSETS`` (default ``../shared/assets``): ``data/nfcorpus``
and ``models/all-MiniLM-L6-v2``. ``--max-test-queries`` and ``--max-test-passages`` shrink the test split for a smoke
test (its numbers then say nothing about the objectives); ``--max-queries`` trains every side on the same first N
training queries, scored on the full test split (the report says so).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shlex
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
from common import append_result, interleaved, machine_info, pick_device, sync

from multipos.hardware import native_bf16

OUT = Path(__file__).resolve().parent / "results" / "st_losses.jsonl"
SIDES = ("mnrl", "jointlh", "lsepair")
QUERY_LEN, PASSAGE_LEN, EVAL_PASSAGE_LEN = 32, 128, 256


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seeds", type=int, nargs="+", default=[42, 43, 44])
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--batch", type=int, default=32, help="queries (rows) per batch, every side")
    ap.add_argument("--group", type=int, default=8, help="G: positives + hard negatives per query")
    ap.add_argument("--max-positives", type=int, default=2, help="M: positives per query (the first M)")
    ap.add_argument("--lr", type=float, default=6.1e-5, help="peak learning rate (the two-tower recipe's)")
    ap.add_argument("--temperature", type=float, default=0.05)
    ap.add_argument("--ordering", choices=("teacher", "given"), default="teacher",
                    help="positive order: the starting model's scores (conf/data/nfcorpus.yaml) or the qrels file's")
    ap.add_argument("--max-queries", type=int, default=None, help="train every side on the first N training queries")
    ap.add_argument("--max-test-queries", type=int, default=None, help="score the first N test queries (smoke runs)")
    ap.add_argument("--max-test-passages", type=int, default=None,
                    help="search the test queries' judged passages and others up to N in all (smoke runs)")
    ap.add_argument("--step-rounds", type=int, default=6, help="timed optimizer steps per side (one more untimed)")
    ap.add_argument("--out", type=Path, default=OUT)
    ap.add_argument("--resume", action="store_true",
                    help="reuse the models already in --out with the same settings on the same CPU or GPU kind "
                         "(one line per side and seed); train only the missing ones")
    return ap.parse_args(argv)


#: The fields of a per-model line that must match for ``--resume`` to reuse it.
RESUME_KEYS = ("cpu", "gpu", "batch", "group", "max_positives", "epochs", "lr", "temperature", "ordering", "query_len",
               "passage_len", "eval_passage_len", "train_queries", "test_queries", "test_passages", "precision",
               "device")


def finished_models(out: Path, base: dict) -> dict[tuple[str, int], dict]:
    """``{(side, seed): line}`` of the per-model lines of ``out`` whose :data:`RESUME_KEYS` equal ``base``'s (the
    newest line wins); empty when ``out`` does not exist. Raises ``ValueError`` naming the line of a line that is not
    JSON."""
    found: dict[tuple[str, int], dict] = {}
    if not out.is_file():
        return found
    for number, raw in enumerate(out.read_text().splitlines(), 1):
        try:
            line = json.loads(raw)
        except json.JSONDecodeError as err:
            raise ValueError(f"{out}:{number}: not a JSON line ({err})") from err
        if line.get("bench") == "st_losses" and all(line.get(k) == base.get(k) for k in RESUME_KEYS):
            found[(line["side"], line["seed"])] = line
    return found


def assets() -> tuple[Path, Path]:
    from multipos.assets import assets_dir

    root = assets_dir()
    data, model = root / "data" / "nfcorpus", root / "models" / "all-MiniLM-L6-v2"
    if not ((data / "qrels-graded" / "train.s-3.qrel").is_file() and model.is_dir()):
        sys.exit(f"NFCorpus or all-MiniLM-L6-v2 not found under {root} (set MULTIPOS_ASSETS)")
    return data, model


def training_data(args, data: Path, model: Path):
    """(rows: one per query with at least G − M hard negatives, first M positives kept; the source's corpus and
    queries of those rows)."""
    from multipos.data.sources import BeirGradedSource
    from multipos.sentence_transformers import to_rows

    source = BeirGradedSource(str(data), "qrels-graded/train.s-3.qrel", ordering=args.ordering,
                              teacher=str(model) if args.ordering == "teacher" else None, teacher_pooling="mean",
                              teacher_normalize=True, negative_depth=100, max_queries=args.max_queries)
    corpus, queries = source.load()
    need = args.group - args.max_positives
    rows = to_rows(corpus, queries)
    keep = [i for i, r in enumerate(rows) if len(r["negatives"]) >= need]
    if args.max_queries:
        keep = keep[: args.max_queries]
    rows = rows.select(keep)
    by_id = {q.query_id: q for q in queries}
    rows = rows.map(lambda r: {"positives": r["positives"][: args.max_positives],
                               "grades": r["grades"][: args.max_positives], "negatives": r["negatives"][:need]})
    return rows, corpus, [by_id[qid] for qid in rows["query_id"]]


def split_rows(rows, k: int):
    """One (anchor, positive, negative_1 … negative_k) row per (query, positive): MNRL's input."""
    from datasets import Dataset

    cols = {"anchor": [], "positive": [], **{f"negative_{j + 1}": [] for j in range(k)}}
    for r in rows:
        for p in r["positives"]:
            cols["anchor"].append(r["query"])
            cols["positive"].append(p)
            for j in range(k):
                cols[f"negative_{j + 1}"].append(r["negatives"][j])
    return Dataset.from_dict(cols)


def st_model(path: Path, device):
    """all-MiniLM-L6-v2 as ``model=minilm`` trains it: mean pooling, L2, attention dropout 0."""
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer.modules import Normalize, Pooling, Transformer

    transformer = Transformer(str(path), config_kwargs={"attention_probs_dropout_prob": 0.0})
    transformer.max_seq_length = PASSAGE_LEN
    pooling = Pooling(transformer.get_embedding_dimension(), "mean")
    return SentenceTransformer(modules=[transformer, pooling, Normalize()], device=str(device))


def warmup(ratio: float) -> dict:
    """The warm-up share as the installed transformers takes it: ``warmup_steps`` as a float from v5 on (where
    ``warmup_ratio`` is deprecated), ``warmup_ratio`` before."""
    import transformers

    return {"warmup_steps": ratio} if int(transformers.__version__.split(".")[0]) >= 5 else {"warmup_ratio": ratio}


def record(out: Path, res: dict) -> None:
    """Append ``res`` to ``out`` as one JSON line; print it without its per-query values."""
    out.parent.mkdir(parents=True, exist_ok=True)
    with out.open("a") as f:
        f.write(json.dumps(res) + "\n")
    print(json.dumps({k: v for k, v in res.items() if not k.startswith("per_query")}))


def train(side: str, rows, split, args, seed: int, device, bf16: bool, folder: Path, model_path: Path) -> dict:
    """Train one side with one seed, save the model to ``folder`` → timing facts."""
    from sentence_transformers import SentenceTransformerTrainer, SentenceTransformerTrainingArguments
    from sentence_transformers.base.sampler import BatchSamplers
    from sentence_transformers.sentence_transformer.data_collator import SentenceTransformerDataCollator
    from sentence_transformers.sentence_transformer.losses import MultipleNegativesRankingLoss

    from multipos.sentence_transformers import MultiPositiveDataCollator, MultiPositiveLoss

    torch.manual_seed(seed)
    model = st_model(model_path, device)
    callbacks = []
    if side == "mnrl":
        dataset, sampler = split, BatchSamplers.NO_DUPLICATES
        loss = MultipleNegativesRankingLoss(model, scale=1.0 / args.temperature)
        routes = {c: "query" if c == "anchor" else "document" for c in split.column_names}
        collator = SentenceTransformerDataCollator(preprocess_fn=model.preprocess, router_mapping=routes,
                                                   max_length={"query": QUERY_LEN, "document": PASSAGE_LEN})
    else:
        dataset, sampler = rows, BatchSamplers.BATCH_SAMPLER
        loss = MultiPositiveLoss(model, objective=side, temperature=args.temperature)
        collator = MultiPositiveDataCollator(model.preprocess, max_positives=args.max_positives,
                                             group_size=args.group, positive_selection="first",
                                             negative_selection="first", query_max_length=QUERY_LEN,
                                             passage_max_length=PASSAGE_LEN, seed=seed)
        callbacks.append(collator.epoch_callback())
    targs = SentenceTransformerTrainingArguments(
        str(folder / "trainer"), per_device_train_batch_size=args.batch, num_train_epochs=args.epochs,
        learning_rate=args.lr, weight_decay=0.01, **warmup(0.1), lr_scheduler_type="linear", max_grad_norm=1.0,
        bf16=bf16, use_cpu=device.type == "cpu", batch_sampler=sampler, save_strategy="no", eval_strategy="no",
        report_to=[], logging_steps=50, disable_tqdm=True, seed=seed, dataloader_num_workers=0)
    trainer = SentenceTransformerTrainer(model=model, args=targs, train_dataset=dataset, loss=loss,
                                         data_collator=collator, callbacks=callbacks)
    sync(device)
    start = time.perf_counter()
    trainer.train()
    sync(device)
    seconds = time.perf_counter() - start
    model.save(str(folder / "model"))
    return {"train_s": round(seconds, 2), "s_per_epoch": round(seconds / args.epochs, 2),
            "steps": trainer.state.global_step, "rows": len(dataset)}


def test_set(args, data: Path):
    """NFCorpus test (BEIR qrels), shrunk by ``--max-test-queries`` / ``--max-test-passages`` for smoke runs."""
    from multipos.formats.beir import load_beir
    from multipos.formats.types import BeirDataset, Corpus

    test = load_beir(data, "test")
    if args.max_test_queries:
        qids = list(test.queries)[: args.max_test_queries]
        test = BeirDataset(test.corpus, {q: test.queries[q] for q in qids}, {q: test.qrels[q] for q in qids}, "test")
    if args.max_test_passages:
        judged = {p for docs in test.qrels.values() for p in docs}
        ids = [p for p in test.corpus.ids if p in judged]
        ids += [p for p in test.corpus.ids if p not in judged][: max(0, args.max_test_passages - len(ids))]
        test = BeirDataset(Corpus({p: test.corpus[p] for p in ids}), test.queries, test.qrels, "test-subset")
    return test


def evaluate(folder: Path, test, bf16: bool) -> dict:
    """nDCG@10 and Recall@100 of a saved model (multipos's DualEncoder reads the sentence-transformers folder)."""
    from multipos.evaluation.metrics import evaluate_run
    from multipos.model.encoder import DualEncoder
    from multipos.retrieval.dense import dense_run

    model = DualEncoder(str(folder), query_max_length=QUERY_LEN, passage_max_length=EVAL_PASSAGE_LEN).eval()
    run = dense_run(model, test, k=100, bf16=bf16, passage_max_length=EVAL_PASSAGE_LEN, progress=False)
    means, per_query = evaluate_run(test.qrels, run, ("ndcg@10", "recall@100"), per_query=True)
    return {"ndcg@10": round(means["ndcg@10"], 4), "recall@100": round(means["recall@100"], 4),
            "per_query_ndcg@10": {q: round(v, 6) for q, v in per_query["ndcg@10"].items()}}


def step_times(args, rows, corpus, queries, device, bf16: bool, model_path: Path) -> dict:
    """Seconds per optimizer step (forward, loss, backward, clipping, AdamW) on one batch of ``--batch`` queries:
    the sentence-transformers loss (plain, cached with mini-batches of 32) and multipos's RetrieverModule."""
    from multipos.data.collate import GroupCollator
    from multipos.data.groups import GroupBuilder
    from multipos.losses import ContrastiveLoss
    from multipos.model.encoder import DualEncoder
    from multipos.retrieval.encoding import autocast_context
    from multipos.sentence_transformers import CachedMultiPositiveLoss, MultiPositiveDataCollator, MultiPositiveLoss
    from multipos.training.module import RetrieverModule

    n = min(args.batch, len(rows))
    builder = GroupBuilder(args.group, args.max_positives, "first", None, "first", seed=0)
    groups = [builder.build(q, q.positives("all"), 0) for q in queries[:n]]
    de = DualEncoder(str(model_path), pooling="mean", normalize=True, temperature=args.temperature,
                     query_max_length=QUERY_LEN, passage_max_length=PASSAGE_LEN, attention_dropout=0.0).to(device)
    module = RetrieverModule(de, ContrastiveLoss("jointlh")).train()  # constant lr
    mp_batch = GroupCollator(de.tokenizer, corpus, query_max_length=QUERY_LEN, passage_max_length=PASSAGE_LEN)(groups)
    mp_batch = mp_batch.to(device)
    mp_opt = module.configure_optimizers()
    mp_params = [p for p in module.parameters() if p.requires_grad]

    st = st_model(model_path, device).train()
    collator = MultiPositiveDataCollator(st.preprocess, max_positives=args.max_positives, group_size=args.group,
                                         positive_selection="first", negative_selection="first",
                                         query_max_length=QUERY_LEN, passage_max_length=PASSAGE_LEN)
    batch = collator([rows[i] for i in range(n)])
    texts = [corpus[p].full_text() for g in groups for p in g.passage_ids]
    features = {k: v.to(device) if torch.is_tensor(v) else v for k, v in batch.items()}
    same_batch = batch["passages_input_ids"].shape[0] == len(texts)
    st_opt = torch.optim.AdamW(st.parameters(), lr=2e-5, weight_decay=0.01)
    plain = MultiPositiveLoss(st, "jointlh", temperature=args.temperature)
    cached = CachedMultiPositiveLoss(st, "jointlh", temperature=args.temperature, mini_batch_size=32)

    def finish(loss, params, opt):
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()

    def st_step(loss_fn):
        def step(_):
            inputs = [{k[len(p):]: v for k, v in features.items() if k.startswith(p)} for p in ("query_", "passages_")]
            with autocast_context(device, bf16):
                loss = loss_fn(inputs, features["label"])
            finish(loss, list(st.parameters()), st_opt)
        return step

    def mp_step(_):
        with autocast_context(device, bf16):
            q, p = de.encode_queries(mp_batch.query), de.encode_passages(mp_batch.passages)
            loss = module.batch_loss(q, p, mp_batch)[0]
        finish(loss, mp_params, mp_opt)

    sides = {"multipos": mp_step, "st": st_step(plain), "st_cached": st_step(cached)}
    times = interleaved(sides, list(range(args.step_rounds + 1)), warmup=1, device=device)
    return {"step_batch": n, "step_passages": len(texts), "step_same_passages": same_batch,
            **{f"step_s_{k}": round(v, 4) for k, v in times.items()},
            "st_vs_multipos_step": round(times["st"] / times["multipos"], 3),
            "st_cached_vs_multipos_step": round(times["st_cached"] / times["multipos"], 3)}


def summarize(runs: list[dict], seeds: list[int]) -> dict:
    """Per side: nDCG@10 / Recall@100 mean and sd over seeds, time per epoch and its ratio to mnrl; per multipos side:
    the paired t-test over test queries of its per-query nDCG@10 (means over seeds) against mnrl's."""
    from multipos.report.significance import paired_ttest

    out: dict = {}
    per_query: dict[str, dict[str, float]] = {}
    for side in SIDES:
        mine = [r for r in runs if r["side"] == side]
        ndcg = [r["ndcg@10"] for r in mine]
        qids = mine[0]["per_query_ndcg@10"].keys()
        per_query[side] = {q: math.fsum(r["per_query_ndcg@10"][q] for r in mine) / len(mine) for q in qids}
        out[side] = {"ndcg@10": round(statistics.fmean(ndcg), 4),
                     "ndcg@10_sd": round(statistics.stdev(ndcg), 4) if len(ndcg) > 1 else 0.0,
                     "recall@100": round(statistics.fmean(r["recall@100"] for r in mine), 4),
                     "s_per_epoch": round(statistics.fmean(r["s_per_epoch"] for r in mine), 2),
                     "steps": mine[0]["steps"], "rows": mine[0]["rows"]}
    for side in SIDES:
        out[side]["epoch_time_vs_mnrl"] = round(out[side]["s_per_epoch"] / out["mnrl"]["s_per_epoch"], 3)
        if side != "mnrl":
            t, p = paired_ttest(per_query[side], per_query["mnrl"])
            diff = math.fsum(per_query[side][q] - per_query["mnrl"][q] for q in per_query[side]) / len(per_query[side])
            out[side].update({"vs_mnrl_diff": round(diff, 4), "vs_mnrl_t": round(t, 3), "vs_mnrl_p": float(f"{p:.3g}")})
    return {"seeds": seeds, "test_queries": len(per_query["mnrl"]), "sides": out}


def describe_machine(info: dict) -> str:
    """One line: the device (GPU or CPU model and cores), torch, threads, load."""
    device = info.get("gpu") or f"{info.get('cpu')} ({info.get('cpus')} cores)"
    return (f"{device}, torch {info.get('torch')}, {info.get('threads')} threads, load {info.get('load_1min')}, "
            f"commit {info.get('commit', '?')}, {info.get('time')}")


def render(path: Path, summary: dict, settings: dict, steps: dict, command: str, machine: str, smoke: bool,
           subset: bool = False) -> None:
    """Write the Markdown report of one run of this script (``subset``: trained on the first ``--max-queries``)."""
    s = summary["sides"]
    lines = ["# multipos objectives in SentenceTransformerTrainer vs MNRL on split rows (NFCorpus)", "",
             f"Written by `bench/bench_st_losses.py`. Command: `{command}`", "", f"Machine: {machine}", "",
             f"Seeds: {', '.join(map(str, summary['seeds']))}. Settings: "
             f"{', '.join(f'{k} {v}' for k, v in settings.items())}.", ""]
    if smoke:
        lines += ["**Smoke setting** (fewer test queries or passages): the numbers show that the script "
                  "runs, not how the objectives compare.", ""]
    elif subset:
        lines += [f"**Training subset**: every side trains on the same first {settings['train_queries']} training "
                  "queries (`--max-queries`), on the full test split: a comparison at a small training budget, not "
                  "at the two-tower recipe's.", ""]
    lines += [f"Test nDCG@10 on {summary['test_queries']} NFCorpus test queries (mean ± sd over seeds); p: two-sided "
              "paired t-test over the test queries of per-query means over seeds, against mnrl "
              "(`scipy.stats.ttest_rel`). Time: seconds per epoch of `trainer.train()`.", "",
              "| side | nDCG@10 | Δ vs mnrl | p | Recall@100 | rows | steps | s / epoch | epoch time vs mnrl |",
              "|---|---|---|---|---|---|---|---|---|"]
    names = {"mnrl": "(a) MNRL, split rows, NO_DUPLICATES", "jointlh": "(b) JointLH, one row per query",
             "lsepair": "(c) LSEPair, one row per query"}
    for side in SIDES:
        r = s[side]
        diff = f"{r['vs_mnrl_diff']:+.4f}" if "vs_mnrl_diff" in r else "—"
        p = f"{r['vs_mnrl_p']:.3g}" if "vs_mnrl_p" in r else "—"
        lines.append(f"| {names[side]} | {r['ndcg@10']:.4f} ± {r['ndcg@10_sd']:.4f} | {diff} | {p} | "
                     f"{r['recall@100']:.4f} | {r['rows']} | {r['steps']} | {r['s_per_epoch']:.2f} | "
                     f"{r['epoch_time_vs_mnrl']:.3f} |")
    lines += ["", f"One optimizer step on one batch of {steps['step_batch']} queries ({steps['step_passages']} "
              f"passages, JointLH; median of the rounds, the sides taking turns):", "",
              "| side | s / step | vs multipos |", "|---|---|---|",
              f"| multipos `RetrieverModule` | {steps['step_s_multipos']:.4f} | 1.000 |",
              f"| `MultiPositiveLoss` | {steps['step_s_st']:.4f} | {steps['st_vs_multipos_step']:.3f} |",
              f"| `CachedMultiPositiveLoss` (mini-batch 32) | {steps['step_s_st_cached']:.4f} | "
              f"{steps['st_cached_vs_multipos_step']:.3f} |", ""]
    path.write_text("\n".join(lines))


def main(argv=None) -> None:
    args = parse_args(argv)
    command = "python bench/bench_st_losses.py " + shlex.join(sys.argv[1:] if argv is None else argv)
    os.environ.setdefault("MULTIPOS_CACHE", tempfile.mkdtemp(prefix="multipos-bench-"))  # as common.bench_setup
    device, bf16 = pick_device(), native_bf16()
    tempfile.tempdir = tempfile.mkdtemp(prefix="multipos-bench-st-")
    data, model_path = assets()
    phases, clock = {}, time.perf_counter()
    rows, corpus, queries = training_data(args, data, model_path)
    split = split_rows(rows, args.group - args.max_positives)
    test = test_set(args, data)
    phases["data_s"] = round(time.perf_counter() - clock, 1)
    settings = {"batch": args.batch, "group": args.group, "max_positives": args.max_positives, "epochs": args.epochs,
                "lr": args.lr, "temperature": args.temperature, "ordering": args.ordering, "query_len": QUERY_LEN,
                "passage_len": PASSAGE_LEN, "eval_passage_len": EVAL_PASSAGE_LEN, "train_queries": len(rows),
                "test_queries": len(test.queries), "test_passages": len(test.corpus),
                "precision": "bf16 autocast" if bf16 else "fp32", "device": str(device)}
    smoke = bool(args.max_test_queries or args.max_test_passages)  # the test split shrunk: numbers say nothing
    info = machine_info()
    base = {**info, "bench": "st_losses", "command": command, **settings}
    runs = []
    done = finished_models(args.out, base) if args.resume else {}
    for seed in args.seeds:
        for side in SIDES:
            if (side, seed) in done:
                print(f"{side} seed {seed}: reused from {args.out} ({done[side, seed]['time']})")
                runs.append(done[side, seed])
                continue
            folder = Path(tempfile.mkdtemp(prefix=f"{side}-{seed}-"))
            res = {"side": side, "seed": seed, **train(side, rows, split, args, seed, device, bf16, folder,
                                                       model_path)}
            clock = time.perf_counter()
            res.update(evaluate(folder / "model", test, bf16))
            res["eval_s"] = round(time.perf_counter() - clock, 1)
            runs.append(res)
            record(args.out, {**base, **res})
    clock = time.perf_counter()
    steps = step_times(args, rows, corpus, queries, device, bf16, model_path)
    phases["step_times_s"] = round(time.perf_counter() - clock, 1)
    summary = summarize(runs, args.seeds)
    append_result(args.out, {**base, "bench": "st_losses_summary", "smoke": smoke,
                             "training_subset": bool(args.max_queries), "phases": phases, **summary, **steps})
    render(args.out.with_suffix(".md"), summary, settings, steps, command, describe_machine(info), smoke,
           subset=bool(args.max_queries))
    print(f"wrote {args.out} and {args.out.with_suffix('.md')}")


if __name__ == "__main__":
    main()
