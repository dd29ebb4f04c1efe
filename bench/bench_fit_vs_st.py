"""Whole training loop against sentence-transformers' whole ``train``: same model, data, batch, group and steps.

* ``multipos``: ``lightning.Trainer.fit`` as ``conf/trainer/default.yaml`` builds it (precision where native,
  clipping 1.0, logging every step on a CPU, every 10 on a GPU: :func:`multipos.hardware.auto_log_interval`) of a
  :class:`multipos.training.module.RetrieverModule` (SingleLH = InfoNCE over the
  in-batch groups) on :class:`multipos.data.datamodule.MultiPosDataModule` (tokenisation in DataLoader workers on
  a GPU: :func:`multipos.hardware.auto_workers`);
* ``sentence_transformers``: ``SentenceTransformerTrainer`` with ``MultipleNegativesRankingLoss`` (scale 20 = 1/τ)
  on a ``datasets.Dataset`` of (anchor, positive, negative_1 … negative_{G−1}) columns holding the same texts,
  bf16 where native, the same number of DataLoader workers and logging interval, no checkpoints, no evaluation, no
  reporting.

Both: all-MiniLM-L6-v2 (assets) or the tiny random BERT, B queries × G passages, 32/128-token queries/passages,
AdamW lr 2e-5, ``--steps`` optimizer steps. Timed: the wall time of ``fit`` / ``train`` (start-up of the loop, data
loading, tokenisation, steps, logging), each side run twice in the order A B A B and the faster run kept. Each run
is also split into ``setup`` (the call to the loop's first hook: trainer, strategy, data loader, passage tokens),
``first_step`` (to the end of the first step: DataLoader workers starting, the first batch, kernels warming up) and
``step`` (the median of the later steps, between consecutive step ends), so that a ratio below target says where.
Target (issue "The GPU path, proven on a GPU"): ``fit_vs_st_train`` = ST train time / multipos fit time ≥ 1.5.

    python bench/bench_fit_vs_st.py [--batch 64 --group 8 --steps 40]

Appends one JSON line to ``bench/results/speed.jsonl``.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import torch
from common import REPO, append_result, bench_setup, machine_info, sync

OUT = Path(__file__).resolve().parent / "results" / "speed.jsonl"


class Phases:
    """Wall-clock marks of one training run → ``{"setup_s", "first_step_s", "step_s"}`` (see the module docstring)."""

    def __init__(self, device):
        self.device, self.start, self.begin, self.ends = device, None, None, []

    def mark_begin(self):
        sync(self.device)
        self.begin = time.perf_counter()

    def mark_step(self):
        sync(self.device)
        self.ends.append(time.perf_counter())

    def split(self) -> dict:
        later = [b - a for a, b in zip(self.ends[1:], self.ends[2:])] or [float("nan")]
        return {"setup_s": round(self.begin - self.start, 3), "first_step_s": round(self.ends[0] - self.begin, 3),
                "step_s": round(statistics.median(later), 4)}


def multipos_fit(data, device, batch: int, group: int, steps: int, phases: Phases | None = None) -> float:
    import lightning as L
    from hydra.utils import instantiate
    from lightning.pytorch.loggers import CSVLogger
    from omegaconf import OmegaConf
    from sides import data_module, multipos_model

    from multipos.config_resolvers import register_resolvers
    from multipos.losses import ContrastiveLoss
    from multipos.training.module import RetrieverModule

    register_resolvers()  # conf/trainer/default.yaml reads ${auto_precision:}
    dm = data_module(data, batch, group, 32, 128)
    cfg = OmegaConf.load(REPO / "conf" / "trainer" / "default.yaml")
    class Marks(L.Callback):
        def on_train_start(self, trainer, pl_module):
            phases.mark_begin()

        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            phases.mark_step()

    phases = phases or Phases(device)
    trainer = instantiate(cfg, max_steps=steps, max_epochs=-1, enable_checkpointing=False, enable_progress_bar=False,
                          enable_model_summary=False, logger=CSVLogger(tempfile.mkdtemp(prefix="multipos-bench-csv-")),
                          callbacks=[Marks()])
    module = RetrieverModule(multipos_model(data), ContrastiveLoss("singlelh"))  # constant lr
    sync(device)
    start = phases.start = time.perf_counter()
    trainer.fit(module, datamodule=dm)
    sync(device)
    return time.perf_counter() - start


def st_train(data, device, batch: int, group: int, steps: int, bf16: bool, phases: Phases | None = None) -> float:
    from datasets import Dataset
    from sentence_transformers import (
        SentenceTransformer,
        SentenceTransformerTrainer,
        SentenceTransformerTrainingArguments,
    )
    from sentence_transformers.sentence_transformer.losses import MultipleNegativesRankingLoss
    from sides import TAU, MemorySource

    from multipos.hardware import auto_log_interval, auto_workers

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
        learning_rate=2e-5, warmup_ratio=0.0, lr_scheduler_type="constant", max_grad_norm=1.0, bf16=bf16,
        use_cpu=device.type == "cpu",
        dataloader_num_workers=auto_workers(), save_strategy="no", eval_strategy="no", report_to=[],
        logging_steps=auto_log_interval(),
        disable_tqdm=True, seed=0)
    from transformers import TrainerCallback

    phases = phases or Phases(device)

    class Marks(TrainerCallback):
        def on_train_begin(self, args, state, control, **kwargs):
            phases.mark_begin()

        def on_step_end(self, args, state, control, **kwargs):
            phases.mark_step()

    trainer = SentenceTransformerTrainer(model=st, args=args, train_dataset=dataset,
                                         loss=MultipleNegativesRankingLoss(st, scale=1.0 / TAU), callbacks=[Marks()])
    sync(device)
    start = phases.start = time.perf_counter()
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
    split = {"multipos_fit_s": [], "st_train_s": []}
    for _ in range(2):
        phases = Phases(device)
        runs["multipos_fit_s"].append(multipos_fit(data, device, args.batch, args.group, args.steps, phases))
        split["multipos_fit_s"].append(phases.split())
        phases = Phases(device)
        runs["st_train_s"].append(st_train(data, device, args.batch, args.group, args.steps, bf16, phases))
        split["st_train_s"].append(phases.split())
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
           "phases_of_best": {k.removesuffix("_s"): split[k][v.index(min(v))] for k, v in runs.items()},
           "targets": {"fit_vs_st_train": 1.5}}
    append_result(args.out, res)


if __name__ == "__main__":
    main()
