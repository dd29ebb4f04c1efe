"""``python -m multipos.shard_job``: encode a BEIR corpus into memory-mapped shards with N processes and search
them exactly, writing one TREC run (the job behind :mod:`multipos.retrieval.shards`).

Run it under ``torchrun`` for several processes (one per GPU with nccl, or CPU processes with gloo)::

    torchrun --nproc_per_node=8 -m multipos.shard_job --model outputs/<run>/model --data msmarco-passage \\
        --split dev --out shards/msmarco --num-shards 8 --k 1000
    python evaluate.py eval=msmarco_dev run_file=shards/msmarco/run.dev.trec

Without ``torchrun`` it runs as one process. A folder whose manifest names the same model fingerprint,
passage count, dtype and shard count is searched without re-encoding.
"""

from __future__ import annotations

import argparse
import logging
import os
from pathlib import Path

log = logging.getLogger(__name__)


def _setup_process_group():
    """Join the ``torchrun`` process group when ``WORLD_SIZE`` > 1 (nccl with CUDA, else gloo) → torch device."""
    import torch
    import torch.distributed as dist

    local = int(os.environ.get("LOCAL_RANK", 0))
    device = torch.device(f"cuda:{local}") if torch.cuda.is_available() else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    if int(os.environ.get("WORLD_SIZE", 1)) > 1 and not dist.is_initialized():
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    return device


def _reusable(folder: Path, model, count: int, num_shards: int, settings: dict) -> bool:
    """True when ``folder`` already holds complete shards of this model, corpus size, shard count and
    ``settings`` (manifest fields ``dtype``, ``bf16``, ``max_length``)."""
    from multipos.retrieval.shards import ShardedEmbeddings

    try:
        store = ShardedEmbeddings.open(folder)
        for i in range(len(store.shards)):
            store.embeddings(i)
    except (FileNotFoundError, ValueError):
        return False
    return (store.meta.get("model"), store.count, len(store.shards)) == (model.fingerprint(), count, num_shards) \
        and all(store.meta.get(key) == value for key, value in settings.items())


def main(argv: list[str] | None = None) -> Path | None:
    """Parse arguments, encode (or reuse) the shards, search them; rank 0 writes ``<out>/run.<split>.trec`` and
    returns its path (other ranks return None)."""
    import torch.distributed as dist

    from multipos.assets import resolve_dataset
    from multipos.formats.beir import load_beir
    from multipos.formats.trec import write_run
    from multipos.model.encoder import DualEncoder
    from multipos.retrieval.encoding import encode, native_bf16
    from multipos.retrieval.shards import DTYPES, ShardedEmbeddings, distributed_search, encode_shards

    ap = argparse.ArgumentParser(prog="python -m multipos.shard_job", description=__doc__.split("\n")[0])
    ap.add_argument("--model", required=True, help="checkpoint folder, asset name or hub id (DualEncoder)")
    ap.add_argument("--data", required=True, help="BEIR folder or dataset name")
    ap.add_argument("--split", default="test", help="qrels split whose queries are searched")
    ap.add_argument("--out", required=True, help="shard folder; the run is written into it")
    ap.add_argument("--num-shards", type=int, default=None, help="default: one per process")
    ap.add_argument("--k", type=int, default=1000)
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--max-length", type=int, default=None, help="passage tokens (default: the model's)")
    ap.add_argument("--bf16", action=argparse.BooleanOptionalAction, default=None,
                    help="bf16 autocast (default: where native, as eval.bf16)")
    ap.add_argument("--dtype", choices=DTYPES, default="float32", help="embeddings on disk")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")

    device = _setup_process_group()
    group = dist.is_initialized()
    world = dist.get_world_size() if group else 1
    rank = dist.get_rank() if group else 0
    model = DualEncoder(args.model).to(device)
    data = load_beir(resolve_dataset(args.data), args.split)
    pids, out = data.corpus.ids, Path(args.out)
    num_shards = args.num_shards or world
    bf16 = native_bf16() if args.bf16 is None else args.bf16
    settings = {"dtype": args.dtype, "bf16": bf16, "max_length": args.max_length}
    reuse = [_reusable(out, model, len(pids), num_shards, settings) if rank == 0 else None]
    if group:  # one decision for all ranks (encode_shards has barriers every rank must reach)
        dist.broadcast_object_list(reuse, src=0)
    if reuse[0]:
        log.info("reusing the shards in %s", out)
    else:
        encode_shards(model, pids, data.corpus.texts(pids), out, num_shards=num_shards, max_length=args.max_length,
                      batch_size=args.batch_size, bf16=bf16, dtype=args.dtype, progress=rank == 0)
    qids = list(data.queries)
    q_emb = encode(model, [data.queries[q] for q in qids], "query", batch_size=args.batch_size, bf16=bf16,
                   progress=False, device=None)
    run = distributed_search(q_emb, ShardedEmbeddings.open(out), qids, k=args.k)
    path = None
    if run is not None:
        path = out / f"run.{args.split}.trec"
        write_run(run, path)
        log.info("wrote %s (%d queries, top-%d)", path, len(run), args.k)
    if group:
        dist.destroy_process_group()
    return path


if __name__ == "__main__":
    main()
