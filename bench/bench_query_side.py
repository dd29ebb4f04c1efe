"""Query-side fine-tuning vs two-tower training: seconds per training query of one optimisation step, side by side.

Three steps on the same batches (B queries, G passages each: the query's first judged passage and G − 1 others),
each a forward, backward and AdamW step of all-MiniLM-L6-v2 (bf16 autocast where native) with JointLH:

* ``two_tower``: queries and passages encoded, both encoders trained (``passages=trained``);
* ``query_side_group``: queries encoded, passages looked up in a frozen index [N, H] (``passages=frozen_index``);
* ``query_side_corpus``: queries scored against every corpus passage, exact, in chunks
  (``passages.candidates=corpus``, :mod:`multipos.training.corpus_candidates`).

Then sequence packing (``pack_sequences=128``, :mod:`multipos.model.packing`) against one padded batch, both
encoders in training mode without dropout: ``query_side_group`` on batches of 16 queries (the query-side studies')
and ``query_side_corpus`` on batches of 64 (the main job's), ``--pack-batches``: ``packing_speedup_<side>_b<B>``.
Then row-sparse word-embedding gradients (:mod:`multipos.training.embedding_gradients`) against the dense backward, both
packed, with gradient clipping, on the group batches: ``embedding_grad_speedup_group_b<B>``.

The index holds random unit vectors of the corpus's shape (timing does not depend on its values; encoding it is a
one-off cost paid through the embedding cache, reported by training's log). The sides take turns on every batch
(:func:`common.interleaved`), so machine load falls on all of them alike; results are ratios. Target: query-side
≥ 20× cheaper per training query than two-tower on the 2-core CPU. Appends to ``bench/results/speed.jsonl``.

    python bench/bench_query_side.py [--batch 32 --group 8 --rounds 6 --pack-batches 16,64 --fp32]
"""

from __future__ import annotations

import argparse
import dataclasses
import random
import time
from pathlib import Path

import torch
from common import append_result, bench_setup, interleaved, machine_info

OUT = Path(__file__).resolve().parent / "results" / "speed.jsonl"


def lookup_groups(data, ids: list[str], rng: random.Random, start: int, batch: int, group: int) -> list:
    """``batch`` training groups from query ``start`` on: each query's first judged passage, then ``group`` − 1 other
    corpus passages drawn with ``rng`` (:class:`multipos.data.groups.Group`, one positive)."""
    from multipos.data.groups import Group

    groups = []
    for qid, text, pos in data.queries[start: start + batch]:
        others = [p for p in rng.sample(ids, group + 1) if p != pos][: group - 1]
        groups.append(Group(qid, text, [pos, *others], 1, {pos}))
    return groups


def group_lookup_loss(model, q: torch.Tensor, groups: list, index: torch.Tensor, row: dict[str, int]) -> torch.Tensor:
    """JointLH of query embeddings ``q`` [B, H] against their groups' passages looked up in the frozen ``index``
    [N, H] by corpus row (``passages=frozen_index``, ``candidates=group``) → the mean loss (a scalar)."""
    from multipos.data.groups import group_masks
    from multipos.losses import compute

    rows = torch.tensor([row[p] for g in groups for p in g.passage_ids], device=q.device)
    pos, neg = group_masks(groups)
    return compute("jointlh", model.score(q, index[rows]), pos.to(q.device), neg.to(q.device)).mean()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--group", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--chunk-size", type=int, default=65536)
    ap.add_argument("--pack-batches", default="16,64",
                    help="queries per batch of the packing comparisons: group candidates at the first, "
                         "corpus at the second")
    ap.add_argument("--fp32", action="store_true",
                    help="no bf16 autocast (the query-side studies' CPU precision, scale.query_side_precision)")
    ap.add_argument("--out", type=Path, default=OUT)
    args = ap.parse_args()
    device, bf16, data = bench_setup()
    bf16 = bf16 and not args.fp32
    from multipos.data.groups import group_masks
    from multipos.losses import compute
    from multipos.model.encoder import DualEncoder
    from multipos.retrieval.encoding import autocast_context
    from multipos.training.corpus_candidates import corpus_scores, corpus_targets

    B, G = args.batch, args.group
    ids = list(data.passages)
    row = {p: i for i, p in enumerate(ids)}
    rng = random.Random(0)
    batches = [lookup_groups(data, ids, rng, j * B, B, G) for j in range(args.rounds + 1)]

    def encoder(frozen: bool):
        model = DualEncoder(data.model, attention_dropout=0.0, query_max_length=32, passage_max_length=128).to(device)
        if frozen:
            model.freeze_passage_encoder()
        params = [p for p in model.parameters() if p.requires_grad]
        return model, torch.optim.AdamW(params, lr=1e-5)

    gen = torch.Generator().manual_seed(0)
    index = torch.nn.functional.normalize(torch.randn(len(ids), 384, generator=gen), dim=-1).to(device)
    tt, qg, qc = encoder(False), encoder(True), encoder(True)

    def step(model, opt, loss_fn, groups, clip: float | None = None):
        opt.zero_grad()
        with autocast_context(device, bf16):
            q = model.encode_queries({k: v.to(device)
                                      for k, v in model.tokenize([g.query for g in groups], "query").items()})
            loss = loss_fn(model, q, groups)
        loss.backward()
        if clip is not None:  # as training clips (trainer.gradient_clip_val)
            torch.nn.utils.clip_grad_norm_([p for p in model.parameters() if p.requires_grad], clip)
        opt.step()

    def two_tower(model, q, groups):
        tokens = model.tokenize([data.passages[p] for g in groups for p in g.passage_ids], "passage")
        p = model.encode_passages({k: v.to(device) for k, v in tokens.items()})
        pos, neg = group_masks(groups)
        return compute("jointlh", model.score(q, p), pos.to(device), neg.to(device)).mean()

    def group_lookup(model, q, groups):
        return group_lookup_loss(model, q, groups, index, row)

    def corpus(model, q, groups):
        targets = corpus_targets([g.passage_ids[:1] for g in groups], [g.judged for g in groups], row).to(device)
        scores, pos, neg = corpus_scores(q, index, model.temperature, targets, args.chunk_size)
        return compute("jointlh", scores, pos, neg).mean()

    sides = {"two_tower": lambda b: step(*tt, two_tower, b), "query_side_group": lambda b: step(*qg, group_lookup, b),
             "query_side_corpus": lambda b: step(*qc, corpus, b)}
    start = time.perf_counter()
    t = interleaved(sides, batches, warmup=1, device=device)
    res = {**machine_info(), "bench": "query_side", "device": str(device),
           "precision": "bf16 autocast" if bf16 else "fp32",
           "model": Path(data.model).name, "data": "nfcorpus" if data.real else "random texts",
           "corpus_passages": len(ids),
           "batch": B, "group": G, "query_len": 32, "passage_len": 128, "rounds": args.rounds, "objective": "jointlh",
           "chunk_size": args.chunk_size, "targets": {"two_tower_vs_query_side_per_query": 20.0}}
    res.update({f"s_per_training_query_{k}": round(v / B, 5) for k, v in t.items()})
    res["two_tower_vs_query_side_group"] = round(t["two_tower"] / t["query_side_group"], 2)
    res["two_tower_vs_query_side_corpus"] = round(t["two_tower"] / t["query_side_corpus"], 2)

    # sequence packing against one padded batch: two training-mode encoders without dropout, same batches
    def train_mode(packing: int):
        model = DualEncoder(data.model, attention_dropout=0.0, hidden_dropout=0.0, query_max_length=32).to(device)
        model.freeze_passage_encoder()
        model.train()
        model.pack_sequences = packing
        # as training
        return model, torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-5, fused=True)

    padded, packed = train_mode(0), train_mode(128)
    shuffled = dataclasses.replace(data, queries=rng.sample(data.queries, len(data.queries)))
    for (name, loss), nb in zip((("group", group_lookup), ("corpus", corpus)),
                                (int(b) for b in args.pack_batches.split(","))):
        # random batches of the training queries, as a shuffled epoch draws them (lengths vary along the qrels order)
        big = [lookup_groups(shuffled, ids, rng, j * nb, nb, G) for j in range(2 * args.rounds + 1)]
        tp = interleaved({"padded": lambda b: step(*padded, loss, b), "packed": lambda b: step(*packed, loss, b)},
                         big, warmup=1, device=device)
        res[f"s_per_step_{name}_b{nb}_padded"] = round(tp["padded"], 4)
        res[f"s_per_step_{name}_b{nb}_packed"] = round(tp["packed"], 4)
        res[f"packing_speedup_{name}_b{nb}"] = round(tp["padded"] / tp["packed"], 2)

    # row-sparse word-embedding gradients (multipos.training.embedding_gradients, applied by CPU training) against
    # the dense backward: packed batches of the query-side studies' size, gradient clipping as training does
    from multipos.training.embedding_gradients import RowSparseEmbeddingGrads

    dense, sparse = train_mode(128), train_mode(128)
    RowSparseEmbeddingGrads([sparse[0].query_encoder])

    nb = int(args.pack_batches.split(",")[0])
    small = [lookup_groups(shuffled, ids, rng, j * nb, nb, G) for j in range(2 * args.rounds + 1)]
    te = interleaved({"dense": lambda b: step(*dense, group_lookup, b, clip=1.0),
                      "row_sparse": lambda b: step(*sparse, group_lookup, b, clip=1.0)},
                     small, warmup=1, device=device)
    res[f"s_per_step_group_b{nb}_dense_embedding_grad"] = round(te["dense"], 4)
    res[f"s_per_step_group_b{nb}_row_sparse_embedding_grad"] = round(te["row_sparse"], 4)
    res[f"embedding_grad_speedup_group_b{nb}"] = round(te["dense"] / te["row_sparse"], 2)
    res["wall_s"] = round(time.perf_counter() - start, 1)
    append_result(args.out, res)


if __name__ == "__main__":
    main()
