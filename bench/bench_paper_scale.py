"""Paper-scale arithmetic, measured: bert-base two-tower steps and query-side training against an MS MARCO-sized index.

Two measurements, each on the device the script finds (meant for a GPU: ``make bench`` does not run it; docs/gpu.md):

* ``two_tower``: a randomly initialised BERT-base (the paper's encoder shape, 110M parameters, CLS pooling, dot
  product; weights cannot travel to an offline machine, and timing does not depend on them) trained with
  SingleLH at B=64 × G=8, 16-token queries and 128-token passages, bf16 autocast where native: the multipos step
  (:class:`multipos.training.module.RetrieverModule`) and sentence-transformers' MultipleNegativesRankingLoss step on
  the
  same texts, taking turns on every batch. Reports queries/s and the hours one epoch of 400,000 MS MARCO training
  queries would take at that rate (step only: data loading runs in DataLoader workers on a GPU).
* ``query_side_corpus``: query-side training with every corpus passage a candidate
  (``passages.candidates=corpus``, :func:`multipos.training.corpus_candidates.corpus_scores`) against a synthetic
  8,841,823 × 768 bf16 index (MS MARCO's passage count and BERT-base's width, random unit vectors: 13.6 GB),
  BERT-base query encoder, B=128 queries of 32 tokens, JointLH with 4 positives: step time and peak GPU memory,
  ``passages.chunk_size=auto`` (one chunk where the corpus fits in half the free memory). Against its own limits,
  measured in the same run, taking turns with the step: ``read`` (a bare bf16 [B, H] × [H, N] matmul over the
  index, one read of it) and ``matmul`` (a bare bf16 [4096, H] × [H, 16384] matmul, the device's matrix
  throughput). The step's FLOP count is the corpus scores and the exact query gradient (2 × 2·B·N·H) plus the query
  encoder's forward and backward (6 × its non-embedding weights × B × 32 tokens); its limit is the larger of the read
  time and FLOPs / throughput, and ``step_vs_limit`` is the figure (docs/gpu.md). The chunked path's loss and
  gradients equal the unchunked ones (``tests/training/test_corpus_candidates.py``, float64, 1e-6). The same step
  with ``product="split"`` (the index never cast: :func:`multipos.training.corpus_candidates.split_product`) takes
  turns with it: ``split_step_s``, ``split_vs_limit``, ``split_vs_cast`` (#68; its accuracy: ``tests/test_cuda.py``).

    python bench/bench_paper_scale.py [--passages 8841823] [--rounds 6] [--skip two_tower query_side]

Appends one JSON line to ``bench/results/speed.jsonl``.
"""

from __future__ import annotations

import argparse
import random
import tempfile
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from common import append_result, bench_setup, interleaved, machine_info, sync

OUT = Path(__file__).resolve().parent / "results" / "speed.jsonl"
MSMARCO_PASSAGES = 8_841_823
MSMARCO_TRAIN_QUERIES = 400_000


def bert_base(tokenizer_from: str, folder: str) -> str:
    """Write a randomly initialised BERT-base (``BertConfig()`` defaults) and ``tokenizer_from``'s tokenizer
    (all-MiniLM-L6-v2 uses bert-base-uncased's 30,522-token vocabulary) into ``folder`` → ``folder``."""
    from transformers import AutoTokenizer, BertConfig, BertModel

    torch.manual_seed(0)
    BertModel(BertConfig()).save_pretrained(folder)
    AutoTokenizer.from_pretrained(tokenizer_from).save_pretrained(folder)
    return folder


def two_tower(data, folder: str, device, bf16: bool, rounds: int, res: dict, B: int = 64) -> None:
    from sides import _finish, data_module, st_columns, st_model, st_step

    from multipos.losses import ContrastiveLoss
    from multipos.model.encoder import DualEncoder
    from multipos.retrieval.encoding import autocast_context
    from multipos.training.module import RetrieverModule

    G = 8
    dm = data_module(data, B, G, 16, 128)
    batches = []
    for batch in dm.train_dataloader():
        batches.append(batch)
        if len(batches) == rounds + 1:
            break
    model = DualEncoder(folder, pooling="cls", normalize=False, temperature=1.0, query_max_length=16,
                        passage_max_length=128)
    module = RetrieverModule(model.to(device), ContrastiveLoss("singlelh")).train()  # constant lr
    opt = module.configure_optimizers()
    params = [p for p in module.parameters() if p.requires_grad]

    def multipos(batch):
        batch = batch.to(device)
        with autocast_context(device, bf16):
            # F821 below: pyflakes flags names that two_tower ``del``s at its end; this closure only runs before that
            q, p = module.model.encode_queries(batch.query), module.model.encode_passages(batch.passages)  # noqa: F821
            loss = module.batch_loss(q, p, batch)[0]  # noqa: F821
        _finish(loss, params, opt)  # noqa: F821

    st = st_model(type(data)(folder, data.passages, data.queries, data.real), device, 128, None)
    queries = {q: text for q, text, _ in data.queries}
    cols = [st_columns(st, b, data.passages, queries, G) for b in batches]
    st_fn = st_step(st, device, bf16)
    index = {id(b): j for j, b in enumerate(batches)}
    t = interleaved({"multipos": multipos, "st_mnrl": lambda b: st_fn(cols[index[id(b)]])}, batches, warmup=1,
                    device=device)
    qps = B / t["multipos"]
    res["two_tower"] = {
        "model": "BERT-base shape, random init (BertConfig()), CLS, dot product", "batch": B, "group": G,
        "query_len": 16, "passage_len": 128, "rounds": rounds,
        "step_s_multipos": round(t["multipos"], 4), "step_s_st_mnrl": round(t["st_mnrl"], 4),
        "queries_per_s_multipos": round(qps, 1), "step_vs_st_mnrl": round(t["st_mnrl"] / t["multipos"], 3),
        "hours_per_msmarco_epoch_400k": round(MSMARCO_TRAIN_QUERIES / qps / 3600, 3),
        "peak_gpu_gb": round(torch.cuda.max_memory_allocated() / 1e9, 2) if device.type == "cuda" else None,
    }
    del module, model, st, opt
    if device.type == "cuda":
        torch.cuda.empty_cache()


def query_side(folder: str, device, bf16: bool, n: int, rounds: int, data, res: dict) -> None:
    from multipos.losses import compute
    from multipos.model.encoder import DualEncoder
    from multipos.retrieval.encoding import autocast_context
    from multipos.training.corpus_candidates import CorpusTargets, corpus_scores, resolve_chunk_size

    B, P, H = 128, 4, 768
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
    gen = torch.Generator(device=device).manual_seed(0)
    index = torch.empty(n, H, dtype=torch.bfloat16, device=device)
    for lo in range(0, n, 1 << 20):  # random unit rows, filled in slices (no fp32 copy of the whole matrix)
        hi = min(n, lo + (1 << 20))
        index[lo:hi] = F.normalize(torch.randn(hi - lo, H, generator=gen, device=device), dim=-1).to(torch.bfloat16)
    index_gb = index.numel() * index.element_size() / 1e9
    model = DualEncoder(folder, pooling="cls", normalize=False, temperature=1.0, query_max_length=32).to(device)
    model.freeze_passage_encoder()
    chunk = resolve_chunk_size("auto", B, n, H, device)
    encoder_weights = sum(p.numel() for name, p in model.named_parameters()  # matmul weights: no embedding tables
                          if p.requires_grad and "embeddings" not in name)
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-5)
    rng = random.Random(0)
    texts = [q for _, q, _ in data.queries]

    def make(j):
        rows = torch.tensor([[rng.randrange(n) for _ in range(P)] for _ in range(B)], device=device)
        judged = torch.tensor(sorted({(i, int(r)) for i in range(B) for r in rows[i]}), device=device)
        targets = CorpusTargets(rows, torch.ones(B, P, dtype=torch.bool, device=device), judged)
        return [texts[(j * B + i) % len(texts)] for i in range(B)], targets

    inputs = [make(j) for j in range(rounds + 1)]

    def step(x, product="cast"):
        qtexts, targets = x
        opt.zero_grad(set_to_none=True)
        with autocast_context(device, bf16):
            tokens = {k: v.to(device) for k, v in model.tokenize(qtexts, "query").items()}
            q = model.encode_queries(tokens)
            scores, pos, neg = corpus_scores(q, index, model.temperature, targets, chunk, product=product)
            loss = compute("jointlh", scores, pos, neg).mean()
        loss.backward()
        opt.step()

    def split_step(x):  # #68: the index never cast, queries split into bf16 halves (corpus_candidates.split_product)
        step(x, "split")

    qb = torch.randn(B, H, generator=gen, device=device).to(torch.bfloat16)
    a = torch.randn(4096, H, generator=gen, device=device).to(torch.bfloat16)
    b = torch.randn(H, 16384, generator=gen, device=device).to(torch.bfloat16)

    def read(_):  # one pass over the index: its read-bandwidth limit
        return qb @ index.T

    def matmul(_):  # the device's bf16 matrix throughput
        return a @ b

    before = time.perf_counter()
    t = interleaved({"query_side_corpus": step, "query_side_corpus_split": split_step, "read": read, "matmul": matmul},
                    inputs, warmup=1, device=device)
    tflops = 2 * 4096 * H * 16384 / t["matmul"] / 1e12
    corpus_tflop = 2 * (2 * B * n * H) / 1e12
    encoder_tflop = 6 * encoder_weights * B * 32 / 1e12
    flop_limit = (corpus_tflop + encoder_tflop) / tflops
    limit = max(t["read"], flop_limit)
    res["query_side_corpus"] = {
        "model": "BERT-base shape query encoder, random init", "passages": n, "dim": H, "index_dtype": "bfloat16",
        "index_gb": round(index_gb, 2), "batch": B, "positives": P, "query_len": 32, "chunk_size": chunk,
        "objective": "jointlh", "rounds": rounds, "step_s": round(t["query_side_corpus"], 4),
        "queries_per_s": round(B / t["query_side_corpus"], 1),
        "hours_per_msmarco_epoch_400k": round(MSMARCO_TRAIN_QUERIES / (B / t["query_side_corpus"]) / 3600, 3),
        "peak_gpu_gb": round(torch.cuda.max_memory_allocated() / 1e9, 2) if device.type == "cuda" else None,
        "read_s": round(t["read"], 5), "read_gb_per_s": round(index_gb / t["read"], 1),
        "matmul_tflops": round(tflops, 2), "step_tflop": round(corpus_tflop + encoder_tflop, 3),
        "corpus_tflop": round(corpus_tflop, 3), "encoder_tflop": round(encoder_tflop, 3),
        "flop_limit_s": round(flop_limit, 5), "limit_s": round(limit, 5),
        "step_vs_limit": round(t["query_side_corpus"] / limit, 2),
        "split_step_s": round(t["query_side_corpus_split"], 4),
        "split_vs_limit": round(t["query_side_corpus_split"] / limit, 2),
        "split_vs_cast": round(t["query_side_corpus_split"] / t["query_side_corpus"], 3),
        "wall_s": round(time.perf_counter() - before, 1),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--passages", type=int, default=None, help=f"index rows (default {MSMARCO_PASSAGES:,} on CUDA, "
                    "200,000 elsewhere)")
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--batch", type=int, default=64,
                    help="two-tower queries per batch (64; smaller only to try it on a CPU)")
    ap.add_argument("--skip", nargs="*", default=[], choices=["two_tower", "query_side"])
    ap.add_argument("--out", type=Path, default=OUT)
    args = ap.parse_args()
    device, bf16, data = bench_setup()
    n = args.passages or (MSMARCO_PASSAGES if device.type == "cuda" else 200_000)
    res = {**machine_info(), "bench": "paper_scale", "device": str(device),
           "precision": "bf16 autocast" if bf16 else "fp32"}
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="multipos-bert-base-") as tmp:  # 440 MB of weights, removed afterwards
        folder = bert_base(data.model, tmp)
        if "two_tower" not in args.skip:
            two_tower(data, folder, device, bf16, args.rounds, res, args.batch)
            sync(device)
        if "query_side" not in args.skip:
            query_side(folder, device, bf16, n, args.rounds, data, res)
    res["wall_s"] = round(time.perf_counter() - start, 1)
    append_result(args.out, res)


if __name__ == "__main__":
    main()
