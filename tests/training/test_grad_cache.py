"""GradCache (multipos.training.grad_cache, ``module.grad_cache_chunk_size``): the same gradients as plain training.

* with dropout on, for every objective: GradCache equals one forward/backward of the whole batch drawing the same
  dropout masks (chunk covering the batch: the module's plain step itself; smaller chunks: the full graph built
  chunk by chunk), and the training run's random stream continues as after plain training;
* in a Lightning fit (manual optimization): the same weights as plain training after optimizer, schedule and
  gradient-clipping steps, ``training_step`` outputs for callbacks, and a checkpoint resume that continues exactly;
* with two gloo processes: DDP + GradCache equals one process on the union batch.
"""

from __future__ import annotations

from functools import partial

import lightning as L
import pytest
import torch

from multipos.losses import OBJECTIVES, SINGLE_POSITIVE, ContrastiveLoss
from multipos.training.grad_cache import chunks, grad_cache_step
from multipos.training.module import (
    GradCacheSettings,
    OptimizerSettings,
    RetrieverModule,
    ScheduleSettings,
    linear_warmup_decay,
)
from tests.training.test_distributed import TOL, cases, make_batch, make_groups, run_gloo, tiny_encoder


def _grads(model) -> dict:
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def _max_diff(a: dict, b: dict) -> float:
    assert a.keys() == b.keys()
    return max(float((a[n] - b[n]).abs().max()) for n in a)


def _full_graph_step(module: RetrieverModule, batch, chunk_size: int) -> torch.Tensor:
    """Plain backpropagation through the whole batch, embeddings computed chunk by chunk (same RNG draws as
    GradCache)."""
    model = module.model
    q = torch.cat([model.encode_queries(c) for c in chunks(batch.query, chunk_size)])
    p = torch.cat([model.encode_passages(c) for c in chunks(batch.passages, chunk_size)])
    loss, _ = module.batch_loss(q, p, batch)
    loss.backward()
    return loss.detach()


def _grad_cache(module: RetrieverModule, batch, chunk_size: int) -> torch.Tensor:
    model = module.model
    loss, extra = grad_cache_step([(model.encode_queries, batch.query), (model.encode_passages, batch.passages)],
                                  lambda q, p: module.batch_loss(q, p, batch), chunk_size)
    assert extra["scores"].shape == extra["positive_mask"].shape == (4, 12) and not extra["scores"].requires_grad
    return loss


@pytest.mark.parametrize("chunk_size", [2, 12])
def test_grad_cache_equals_plain_backprop_with_dropout_for_every_objective(tiny_bert, chunk_size):
    model = tiny_encoder(tiny_bert, dropout=0.1)
    assert model.training and model.query_encoder.config.hidden_dropout_prob == 0.1
    worst = 0.0
    for name in OBJECTIVES:
        module = RetrieverModule(model, ContrastiveLoss(name))
        batch = make_batch(model, make_groups(1 if name in SINGLE_POSITIVE else 2, false_negative=True))
        runs = {}
        for kind in ("plain", "grad_cache"):
            torch.manual_seed(7)
            model.zero_grad(set_to_none=True)
            if kind == "grad_cache":
                loss = _grad_cache(module, batch, chunk_size)
            elif chunk_size >= 12:  # one chunk per side: exactly the module's plain training computation
                loss = module.batch_loss(model.encode_queries(batch.query), model.encode_passages(batch.passages),
                                         batch)[0]
                loss.backward()
            else:
                loss = _full_graph_step(module, batch, chunk_size)
            runs[kind] = (loss, _grads(model), torch.get_rng_state())
        (plain_loss, plain_grads, plain_rng), (gc_loss, gc_grads, gc_rng) = runs["plain"], runs["grad_cache"]
        assert abs(float(plain_loss.detach() - gc_loss)) < TOL, name
        assert _max_diff(plain_grads, gc_grads) < TOL, name
        assert torch.equal(plain_rng, gc_rng), name  # the re-forward drew nothing from the run's random stream
        worst = max(worst, _max_diff(plain_grads, gc_grads))
    # dropout is really on: other masks (another seed) give other gradients
    torch.manual_seed(8)
    model.zero_grad(set_to_none=True)
    _grad_cache(module, batch, chunk_size)
    assert _max_diff(_grads(model), gc_grads) > 1e-3
    print(f"chunk {chunk_size}: max |grad diff| GradCache vs plain {worst:.2e}")


def test_chunk_size_must_be_positive(tiny_bert):
    with pytest.raises(ValueError, match="grad_cache_chunk_size"):
        chunks({"input_ids": torch.zeros(3, 2)}, 0)
    with pytest.raises(ValueError, match="grad_cache_chunk_size"):
        RetrieverModule(tiny_encoder(tiny_bert), ContrastiveLoss("lsepair"), grad_cache=GradCacheSettings(0))


class _Outputs(L.Callback):
    """Records what ``training_step`` returns (the interface gradient diagnostics read) and the gradient norm
    before clipping (callbacks' ``on_before_optimizer_step`` runs before the module's and the trainer's clipping)."""

    def __init__(self):
        self.outputs, self.norms = [], []

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self.outputs.append(outputs)

    def on_before_optimizer_step(self, trainer, pl_module, optimizer):
        self.norms.append(float(torch.cat([p.grad.flatten() for p in pl_module.parameters()
                                           if p.grad is not None]).norm()))


def _fit(tiny_beir, tiny_bert, chunk_size, steps: int, checkpoints=None, resume=None):
    """Fit the tiny BERT (dropout off) for ``steps`` optimizer steps with SGD, a warm-up/decay schedule and active
    gradient clipping; GradCache when ``chunk_size``; a checkpoint after every step into ``checkpoints``; resumed
    from the checkpoint ``resume``. Returns (module, recorded training_step outputs)."""
    from lightning.pytorch.callbacks import ModelCheckpoint

    from tests.model.test_encoder import _datamodule

    torch.manual_seed(0)
    dm = _datamodule(tiny_beir, tiny_bert, batch_size=2, seed=0)  # 5 training queries: 2 steps per epoch
    clip = 0.05  # below the tiny model's gradient norm: clipping is active
    module = RetrieverModule(tiny_encoder(tiny_bert), ContrastiveLoss("lsepair"),
                             optimizer=OptimizerSettings(partial(torch.optim.SGD, lr=0.5)),
                             schedule=ScheduleSettings(linear_warmup_decay, warmup_ratio=0.5, total=4),
                             grad_cache=GradCacheSettings(chunk_size, gradient_clip_val=clip))
    seen = _Outputs()
    callbacks = [seen] + ([ModelCheckpoint(dirpath=checkpoints, filename="{step}", every_n_train_steps=1,
                                           save_top_k=-1)]
                          if checkpoints else [])
    trainer = L.Trainer(accelerator="cpu", devices=1, max_steps=steps, max_epochs=4, logger=False,
                        enable_checkpointing=bool(checkpoints), enable_progress_bar=False, enable_model_summary=False,
                        num_sanity_val_steps=0, limit_val_batches=0, callbacks=callbacks,
                        gradient_clip_val=None if chunk_size else clip)
    trainer.fit(module, datamodule=dm, ckpt_path=resume)
    assert min(seen.norms) > 2 * clip  # clipping changed every step
    return module, seen.outputs


def _weight_diff(a: RetrieverModule, b: RetrieverModule) -> float:
    weights = dict(a.model.named_parameters())
    return max(float((p - weights[n]).detach().abs().max()) for n, p in b.model.named_parameters())


def test_lightning_fit_with_grad_cache_matches_plain_and_resumes(tiny_beir, tiny_bert, tmp_path):
    plain, plain_out = _fit(tiny_beir, tiny_bert, None, steps=3)
    cached, cached_out = _fit(tiny_beir, tiny_bert, 3, steps=3, checkpoints=tmp_path)
    assert not cached.automatic_optimization and plain.automatic_optimization
    assert cached.trainer.global_step == plain.trainer.global_step == 3
    assert cached.lr_schedulers().last_epoch == 3  # the schedule stepped once per optimizer step
    assert _weight_diff(plain, cached) < TOL
    for a, b in zip(plain_out, cached_out, strict=True):
        assert set(a) == set(b) == {"loss", "scores", "positive_mask", "negative_mask"}
        assert a["scores"].shape == b["scores"].shape == a["positive_mask"].shape == (2, 8)
        assert a["negative_mask"].dtype == torch.bool and abs(float(a["loss"] - b["loss"])) < TOL
    # resumed from the mid-epoch checkpoint after step 1, a GradCache run ends where the uninterrupted one ends
    resumed, resumed_out = _fit(tiny_beir, tiny_bert, 3, steps=3, resume=tmp_path / "step=1.ckpt")
    assert resumed.trainer.global_step == 3 and len(resumed_out) == 2
    assert _weight_diff(cached, resumed) < TOL


def test_ddp_with_grad_cache_two_gloo_processes_equal_one_process(tiny_bert, tmp_path):
    report = run_gloo(tiny_bert, tmp_path / "report.json", chunk_size=1)
    assert set(report) == {f"{n}/fn={fn}" for n, fn in cases()}
    for case, diff in report.items():
        assert diff["params"] > 10 and diff["grad_scale"] > 1e-4, case
        assert diff["loss"] < TOL and diff["grad"] < TOL, (case, diff)
    print("DDP + GradCache: max |loss diff|", max(d["loss"] for d in report.values()),
          "max |grad diff|", max(d["grad"] for d in report.values()))
