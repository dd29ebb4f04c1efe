"""This machine's speed, measured in a few timed batches, and the wall time of a job predicted from it.

The plans printed before ``make train`` (:mod:`multipos.runs.plan`) and ``make train DATA=...``
(:mod:`multipos.own_data`) estimate their wall time from a measurement made here and now, as ``shared/bare_step.py``
does, rather than from a constant per machine kind: :func:`measure` encodes a small random sample of each corpus the
job encodes (its texts, its lengths, its batch size and precision) and times a few query-side training steps of the
job's encoder (queries of the job's batch size and length, forward, backward and an AdamW step); :func:`predict`
scales those rates by the job's counts (passages per corpus, training queries, epochs, seeds). A measurement is kept in
``<cache>/speed/`` under the machine, the model, the lengths and the precision, so a second plan does not measure
again. ``bench/bench_plan.py`` records predicted against actual.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import random
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from multipos import atomic
from multipos.assets import cache_dir

__all__ = ["Corpus", "Job", "Speed", "corpus_rate", "measure", "runs_at_once", "predict", "job_from_config"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Corpus:
    """One corpus the job encodes once (it is cached afterwards): ``name``, its passages' ``texts`` (all of them:
    the count is what is predicted, a sample is what is timed) and the ``max_length`` in tokens they are encoded at."""

    name: str
    texts: tuple[str, ...]
    max_length: int


@dataclass(frozen=True)
class Job:
    """What a job does, in counts: the corpora it encodes, its training queries, batch size, query length in tokens,
    epochs and seeds, the queries it encodes to evaluate (dev each epoch, the test sets once a seed), and its encoding
    batch size and optimizer (fused AdamW or not); ``queries``: training query texts (the timed steps draw from them);
    ``side_by_side``: seeds trained at once, one torch thread each (``parallel_jobs``; 1: one after another);
    ``pack_sequences``: the training batches' packed row length on a CPU (config ``pack_sequences``; 0: padded).
    """

    model: str
    corpora: tuple[Corpus, ...]
    train_queries: int
    batch_size: int
    query_max_length: int
    epochs: int
    seeds: int
    dev_queries: int = 0
    test_queries: int = 0
    encode_batch_size: int = 64
    fused_adamw: bool = False
    queries: tuple[str, ...] = ()
    side_by_side: int = 1
    pack_sequences: int = 0


@dataclass
class Speed:
    """Rates measured on this machine: passages a second per corpus name, seconds of one training step on every
    thread (``step_s``) and on one (``step_1thread_s``, None on a GPU), queries a second when encoding, the precision
    (``bf16`` | ``fp32``), when and in how many seconds it was measured, and the cores (CPU threads) it had."""

    passages_per_s: dict[str, float]
    step_s: float
    queries_per_s: float
    precision: str
    measured_at: str
    measuring_s: float
    step_1thread_s: float | None = None
    cores: int = 1
    cached: bool = field(default=False, compare=False)


#: Part of a measurement's cache key: raise it when what a measurement holds or how it is made changes.
SPEED_FORMAT = "2"  # 2: corpus rates per token position of length-sorted batches (corpus_rate), a one-thread step


def _key(job: Job, bf16: bool) -> str:
    import torch

    from multipos.training.distributed import device_description

    parts = [SPEED_FORMAT, device_description(), str(torch.get_num_threads()), torch.__version__,
             job.model, str(job.batch_size), str(job.query_max_length), str(job.encode_batch_size),
             str(job.pack_sequences),
             "bf16" if bf16 else "fp32", *(f"{c.name}:{c.max_length}:{len(c.texts)}" for c in job.corpora)]
    return hashlib.sha1("\n".join(parts).encode()).hexdigest()[:16]


def _padded_tokens(lengths: list[int], batch_size: int) -> int:
    """Token positions the encoder computes for texts of ``lengths`` tokens encoded longest first in batches of
    ``batch_size``, each padded to its longest (as :func:`multipos.retrieval.encoding.encode` batches them)."""
    ordered = sorted(lengths, reverse=True)
    return sum(len(ordered[i:i + batch_size]) * ordered[i] for i in range(0, len(ordered), batch_size))


def corpus_rate(model, corpus: Corpus, timed: list[str], seconds: float, batch_size: int) -> float:
    """Passages a second for the whole of ``corpus`` from ``seconds`` spent encoding its random sample ``timed``.

    A random sample batches texts of every length together and pads far more than the length-sorted corpus does
    (TREC DL 2020 at 256 tokens, fp32, 2 cores: 51 passages/s timed on 128 random passages, 113/s over the corpus;
    2026-12-03). So the time goes per computed token position: ``seconds`` over the sample's padded positions
    (:func:`_padded_tokens`, from its tokenised lengths), times the corpus's padded positions, whose lengths are
    estimated from characters at the sample's characters per token, plus the special tokens (and prompt) of every
    text, each capped at ``corpus.max_length``."""
    lengths = [int(n) for n in model.tokenize(timed, max_length=corpus.max_length)["attention_mask"].sum(1)]
    per_position = seconds / max(1, _padded_tokens(lengths, batch_size))
    fixed = int(model.tokenize([""], max_length=corpus.max_length)["attention_mask"].sum())  # special tokens, prompt
    whole = [(len(t), n - fixed) for t, n in zip(timed, lengths) if n < corpus.max_length] \
        or [(len(t), n - fixed) for t, n in zip(timed, lengths)]
    chars_per_token = max(1e-6, sum(c for c, _ in whole) / max(1, sum(n for _, n in whole)))
    estimated = [min(corpus.max_length, fixed + round(len(t) / chars_per_token)) for t in corpus.texts]
    return len(corpus.texts) / max(1e-9, per_position * _padded_tokens(estimated, batch_size))


def measure(job: Job, bf16: bool, sample: int = 128, steps: int = 3, use_cache: bool = True) -> Speed:
    """Time encoding ``sample`` random passages of each corpus (after one warm-up batch) and ``steps`` training
    steps (after one warm-up step) with the job's encoder, on the CPU (or the GPU when there is one), ``bf16``
    autocast or fp32. A corpus's rate is the sample's time per computed token position scaled to the corpus's
    length-sorted batches (:func:`corpus_rate`).

    Returns the :class:`Speed` (from ``<cache>/speed/<key>.json`` when this machine measured the same job settings
    before and ``use_cache``). Takes about 10 s (bf16) to 25 s (fp32) on the 2-core machine for the main job.

    Raises whatever loading ``job.model`` raises (:func:`multipos.assets.resolve_model`).
    """
    import torch

    from multipos.model.encoder import DualEncoder
    from multipos.retrieval.encoding import encode

    path = cache_dir() / "speed" / f"{_key(job, bf16)}.json"
    if use_cache and path.is_file():
        try:
            return Speed(**{**json.loads(path.read_text(encoding="utf-8")), "cached": True})
        except (ValueError, TypeError):
            log.warning("%s: not a speed measurement, measuring again", path)
    start = time.perf_counter()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    # packed as the job trains (a CPU training batch without padding: NFCorpus's queries pad to about 3x their tokens)
    model = DualEncoder(job.model, query_max_length=job.query_max_length, pack_sequences=job.pack_sequences).to(device)
    model.eval()
    rng = random.Random(0)
    rates = {}
    for corpus in job.corpora:
        texts = list(corpus.texts)
        picked = rng.sample(texts, min(len(texts), sample + job.encode_batch_size))
        warm, timed = picked[:job.encode_batch_size], picked[job.encode_batch_size:] or picked
        kw = dict(kind="passage", max_length=corpus.max_length, batch_size=job.encode_batch_size, bf16=bf16,
                  progress=False, device=None)
        encode(model, warm, **kw)
        t = time.perf_counter()
        encode(model, timed, **kw)
        rates[corpus.name] = corpus_rate(model, corpus, timed, time.perf_counter() - t, job.encode_batch_size)
    pool = job.queries or (job.corpora[0].texts if job.corpora else ("a query",))
    queries = [rng.choice(pool) for _ in range(job.batch_size)]
    t = time.perf_counter()
    encode(model, queries, kind="query", batch_size=job.encode_batch_size, bf16=bf16, progress=False, device=None)
    queries_per_s = len(queries) / (time.perf_counter() - t)
    model.train()
    optimizer = torch.optim.AdamW([p for p in model.query_encoder.parameters() if p.requires_grad], lr=1e-5,
                                  fused=job.fused_adamw)
    tokens = model.tokenize(queries, kind="query", max_length=job.query_max_length)
    tokens = {k: v.to(device) for k, v in tokens.items()}

    def median_step() -> float:
        times = []
        for _ in range(steps + 1):
            t = time.perf_counter()
            with torch.autocast(device, dtype=torch.bfloat16, enabled=bf16):
                loss = model.encode_queries(tokens).float().square().mean()
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            if device == "cuda":
                torch.cuda.synchronize()
            times.append(time.perf_counter() - t)
        return sorted(times[1:])[len(times[1:]) // 2]

    cores = torch.get_num_threads()
    step_s = median_step()
    one_thread = None
    if device == "cpu":  # what each of several runs trained side by side gets (one torch thread each)
        torch.set_num_threads(1)
        try:
            one_thread = median_step()
        finally:
            torch.set_num_threads(cores)
    speed = Speed(passages_per_s=rates, step_s=step_s, queries_per_s=queries_per_s,
                  precision="bf16" if bf16 else "fp32", measured_at=time.strftime("%Y-%m-%d %H:%M"),
                  measuring_s=time.perf_counter() - start, step_1thread_s=one_thread, cores=cores)
    atomic.write_json(path, {k: v for k, v in asdict(speed).items() if k != "cached"})
    return speed


def runs_at_once(job: Job, speed: Speed) -> int:
    """Seeds the estimate trains at once: ``job.side_by_side`` (at most the seeds) where ``speed`` has a one-thread
    step to time them with, else 1 (one after another)."""
    return min(job.side_by_side, job.seeds) if speed.step_1thread_s else 1


def predict(job: Job, speed: Speed, cached_corpora: frozenset[str] = frozenset()) -> dict[str, float]:
    """The job's wall time in seconds from ``speed``: ``{"encode", "train", "evaluate", "total"}``.

    ``encode``: every corpus not in ``cached_corpora`` once (passages / measured rate); ``train``: epochs ×
    ⌈training queries / batch size⌉ steps a seed at the measured step time, the seeds one after another; with
    ``job.side_by_side`` = k > 1 and a one-thread step measured, ⌈seeds / k⌉ rounds of k runs at the one-thread step
    time, slowed by k / cores when they outnumber the cores; ``evaluate``: the dev queries each epoch and the test
    queries once a seed, at the measured query rate. Start-up (loading models, BM25, scoring) is not in it.
    """
    encode_s = sum(len(c.texts) / speed.passages_per_s[c.name] for c in job.corpora if c.name not in cached_corpora)
    per_seed = job.epochs * max(1, math.ceil(job.train_queries / job.batch_size))
    k = runs_at_once(job, speed)
    if k > 1:
        train_s = math.ceil(job.seeds / k) * per_seed * speed.step_1thread_s * max(1.0, k / max(1, speed.cores))
    else:
        train_s = job.seeds * per_seed * speed.step_s
    evaluate_s = job.seeds * (job.epochs * job.dev_queries + job.test_queries) / speed.queries_per_s
    return {"encode": encode_s, "train": train_s, "evaluate": evaluate_s, "total": encode_s + train_s + evaluate_s}


def _positive_queries(qrels: Path) -> set[str]:
    """Queries with a grade above 0 in a BEIR (``qid docid grade``) or TREC (``qid 0 docid grade``) qrels file."""
    qids = set()
    for line in qrels.read_text(encoding="utf-8").splitlines():
        cols = line.split()
        if len(cols) >= 3 and cols[-1].lstrip("-").isdigit() and int(cols[-1]) > 0:
            qids.add(cols[0])
    return qids


def _queries(folder: Path, split: str) -> int:
    path = folder / "qrels" / f"{split}.tsv"
    return len({line.split()[0] for line in path.read_text(encoding="utf-8").splitlines()[1:] if line.strip()}) \
        if path.is_file() else 0


def job_from_config(cfg, seeds: int, epochs: int | None = None) -> Job:
    """The :class:`Job` a composed training config (:func:`multipos.config_resolvers.compose_train`) runs with
    ``seeds`` seeds: the evaluation corpora at ``eval.passage_max_length`` (the frozen index is the in-domain one),
    the training corpus at the teacher's length when the data are ordered by a teacher (once with an evaluation
    corpus of that folder and length: one cache entry), the training queries
    with a positive in ``data.source.qrels_file``, ``epochs`` (default ``trainer.max_epochs``).

    Raises :class:`multipos.assets.AssetNotFoundError` when a dataset cannot be found."""
    from multipos.assets import resolve_dataset
    from multipos.data.preparation import TEACHER_PASSAGE_MAX_LENGTH
    from multipos.formats.beir import read_corpus, read_queries

    corpora, seen = [], set()

    def add(path: str, length: int, name: str) -> None:
        folder = resolve_dataset(path)
        if (folder, length) in seen:
            return
        seen.add((folder, length))
        corpora.append(Corpus(name, tuple(read_corpus(folder / "corpus.jsonl").texts()), int(length)))

    eval_sets = {**({"validation": cfg.eval.validation} if cfg.eval.get("validation") else {}),
                 **dict(cfg.eval.get("test_sets") or {})}
    for name, node in eval_sets.items():
        add(node.path, cfg.eval.passage_max_length, node.get("name", name))
    source = cfg.data.source
    train_folder = resolve_dataset(source.path)
    if source.get("ordering") == "teacher":  # at the teacher's length: one encoding with an evaluation corpus there
        add(source.path, TEACHER_PASSAGE_MAX_LENGTH, f"{Path(str(source.path)).name} (teacher order)")
    dev = _queries(resolve_dataset(cfg.eval.validation.path), cfg.eval.validation.split) \
        if cfg.eval.get("validation") else 0
    test = sum(_queries(resolve_dataset(node.path), node.split) for node in (cfg.eval.get("test_sets") or {}).values())
    qids = _positive_queries(train_folder / source.qrels_file)
    texts = read_queries(train_folder / "queries.jsonl")
    count = min(len(qids), int(source.max_queries)) if source.get("max_queries") else len(qids)
    return Job(model=str(cfg.model.name_or_path), corpora=tuple(corpora), train_queries=count,
               queries=tuple(texts[q] for q in sorted(qids) if q in texts),
               batch_size=int(cfg.data.batch_size), query_max_length=int(cfg.data.query_max_length),
               epochs=int(epochs or cfg.trainer.max_epochs), seeds=seeds, dev_queries=dev, test_queries=test,
               encode_batch_size=int(cfg.eval.get("batch_size") or 64),
               fused_adamw=bool(cfg.module.optimizer.get("fused", False)),
               pack_sequences=int(cfg.get("pack_sequences") or 0))
