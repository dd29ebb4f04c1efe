"""Whole training loop against sentence-transformers' whole ``train``: same model, data, batch, group and steps.

* ``multipos``: ``lightning.Trainer.fit`` as ``conf/trainer/default.yaml`` builds it (precision where native,
  clipping 1.0, logging every step) of a :class:`multipos.module.RetrieverModule` (SingleLH = InfoNCE over the
  in-batch groups) on :class:`multipos.data.datamodule.MultiPosDataModule` (tokenisation in DataLoader workers on
  a GPU: :func:`multipos.hardware.auto_workers`);
* ``sentence_transformers``: ``SentenceTransformerTrainer`` with ``MultipleNegativesRankingLoss`` (scale 20 = 1/τ)
  on a ``datasets.Dataset`` of (anchor, positive, negative_1 … negative_{G−1}) columns holding the same texts,
  bf16 where native, the same number of DataLoader workers, no checkpoints, no evaluation, no reporting.

Both: all-MiniLM-L6-v2 (assets) or the tiny random BERT, B queries × G passages, 32/128-token queries/passages,
AdamW lr 2e-5, ``--steps`` optimizer steps. Timed: the wall time of ``fit`` / ``train`` (start-up of the loop, data
loading, tokenisation, steps, logging), each side run twice in the order A B A B and the faster run kept.
Target (issue "The GPU path, proven on a GPU"): ``fit_vs_st_train`` = ST train time / multipos fit time ≥ 1.5.

    python bench/bench_fit_vs_st.py [--batch 64 --group 8 --steps 40]

Appends one JSON line to ``bench/results/speed.jsonl``.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import torch

from common import REPO, append_result, bench_setup, machine_info, sync

OUT = Path(__file__).resolve().parent / "results" / "speed.jsonl"


def multipos_fit(data, device, batch: int, group: int, steps: int) -> float:
    from hydra.utils import instantiate
    from lightning.pytorch.loggers import CSVLogger
    from omegaconf import OmegaConf
    from sides import data_module, multipos_model

    from multipos.config_resolvers import register_resolvers
    from multipos.losses import ContrastiveLoss
    from multipos.module import RetrieverModule

    register_resolvers()  # conf/trainer/default.yaml reads ${auto_precision:}
    dm = data_module(data, batch, group, 32, 128)
    cfg = OmegaConf.load(REPO / "conf" / "trainer" / "default.yaml")
    trainer = instantiate(cfg, max_steps=steps, max_epochs=-1, enable_checkpointing=False, enable_progress_bar=False,
                          enable_model_summary=False, logger=CSVLogger(tempfile.mkdtemp(prefix="multipos-bench-csv-")))
    module = RetrieverModule(multipos_model(data), ContrastiveLoss("singlelh"), scheduler=None)
    sync(device)
    start = time.perf_counter()
    trainer.fit(module, datamodule=dm)
    sync(device)
    return time.perf_counter() - start


def st_train(data, device, batch: int, group: int, steps: int, bf16: bool) -> float:
    from datasets import Dataset
    from sentence_transformers import SentenceTransformer, SentenceTransformerTrainer, SentenceTransformerTrainingArguments
    from sentence_transformers.sentence_transformer.losses import MultipleNegativesRankingLoss
    from sides import TAU, MemorySource

    from multipos.hardware import auto_workers

    corpus, queries = MemorySource(data).load()
    rows = {"anchor": [], "positive": [], **{f"negative_{j}": [] for j in range(1, group)}}
    for q in queries:
        rows["anchor"].append(q.query)
        rows["positive"].append(corpus[q.gold[0]].full_text())
        for j in range(1, group):
            rows[f"negative_{j}"].append(corpus[q.negatives[j - 1]].full_text())
    dataset = Dataset.from_dict(rows)
    st = SentenceTransformer(data.model, device=str(device),
                             config_kwargs={"attention_probs_dropout_prob": 0.0})  # as model=minilm
    st.max_seq_length = 128
    args = SentenceTransformerTrainingArguments(
        output_dir=tempfile.mkdtemp(prefix="multipos-bench-st-"), per_device_train_batch_size=batch, max_steps=steps,
        learning_rate=2e-5, warmup_ratio=0.0, lr_scheduler_type="constant", max_grad_norm=1.0, bf16=bf16, use_cpu=device.type == "cpu",
        dataloader_num_workers=auto_workers(), save_strategy="no", eval_strategy="no", report_to=[], logging_steps=1,
        disable_tqdm=True, seed=0)
    trainer = SentenceTransformerTrainer(model=st, args=args, train_dataset=dataset,
                                         loss=MultipleNegativesRankingLoss(st, scale=1.0 / TAU))
    sync(device)
    start = time.perf_counter()
    trainer.train()
    sync(device)
    return time.perf_counter() - start


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--group", type=int, default=8)
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--out", type=Path, default=OUT)
    args = ap.parse_args()
    device, bf16, data = bench_setup()
    runs = {"multipos_fit_s": [], "st_train_s": []}
    for _ in range(2):
        runs["multipos_fit_s"].append(multipos_fit(data, device, args.batch, args.group, args.steps))
        runs["st_train_s"].append(st_train(data, device, args.batch, args.group, args.steps, bf16))
        if device.type == "cuda":
            torch.cuda.empty_cache()
    best = {k: min(v) for k, v in runs.items()}
    res = {**machine_info(), "bench": "fit_vs_st_train", "device": str(device),
           "precision": "bf16 autocast" if bf16 else "fp32", "model": Path(data.model).name,
           "data": "nfcorpus" if data.real else "random texts", "batch": args.batch, "group": args.group,
           "query_len": 32, "passage_len": 128, "steps": args.steps,
           "runs": {k: [round(x, 2) for x in v] for k, v in runs.items()},
           **{k: round(v, 2) for k, v in best.items()},
           "queries_per_s_multipos_fit": round(args.batch * args.steps / best["multipos_fit_s"], 1),
           "queries_per_s_st_train": round(args.batch * args.steps / best["st_train_s"], 1),
           "fit_vs_st_train": round(best["st_train_s"] / best["multipos_fit_s"], 3),
           "targets": {"fit_vs_st_train": 1.5}}
    append_result(args.out, res)


if __name__ == "__main__":
    main()
