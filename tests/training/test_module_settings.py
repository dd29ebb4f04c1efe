"""RetrieverModule's structure (multipos.training.module): typed settings built from ``conf/module`` in one place
(``RetrieverModule.from_config``), and one path from scores to loss — every passage side (two-tower, query-side over
a frozen index, every corpus passage), with or without GradCache, hands :class:`Scores` to ``scores_loss``, whose
loss is the one the step returns and logs."""

from __future__ import annotations

import lightning as L
import pytest
import torch
from hydra.utils import instantiate
from torch.utils.data import DataLoader

from multipos.losses import ContrastiveLoss
from multipos.training.module import (
    GradCacheSettings,
    OptimizerSettings,
    PassageSettings,
    RetrieverModule,
    ScheduleSettings,
    Scores,
    StageSettings,
)
from multipos.training.passage_index import FrozenPassageIndex
from tests.helpers import compose_cfg
from tests.training.test_distributed import make_batch, make_groups, tiny_encoder


def test_settings_refuse_what_the_module_cannot_train():
    with pytest.raises(ValueError, match=r"module.warmup_ratio must be in \[0, 1\)"):
        ScheduleSettings(warmup_ratio=1.0)
    with pytest.raises(ValueError, match="module.grad_cache_chunk_size must be >= 1"):
        GradCacheSettings(chunk_size=0)
    assert GradCacheSettings(chunk_size="3").chunk_size == 3
    with pytest.raises(ValueError, match="passages.candidates='everything'"):
        PassageSettings(candidates="everything")
    with pytest.raises(ValueError, match="passages.candidates=corpus scores every corpus passage"):
        PassageSettings(candidates="corpus")
    index = FrozenPassageIndex(["a"], torch.zeros(1, 2))
    with pytest.raises(ValueError, match="passages.chunk_size must be a number"):
        PassageSettings(index, "corpus", chunk_size="many")
    assert OptimizerSettings().factory.func is torch.optim.AdamW  # the default optimizer


def test_a_frozen_index_needs_a_frozen_passage_encoder(tiny_bert):
    index = FrozenPassageIndex(["a"], torch.zeros(1, 32))
    with pytest.raises(ValueError, match="a frozen passage index needs a frozen passage encoder"):
        RetrieverModule(tiny_encoder(tiny_bert), ContrastiveLoss("lsepair"), passages=PassageSettings(index))


def test_conf_module_builds_the_typed_settings(tiny_bert):
    """``conf/module/retriever.yaml`` (its keys as they are) → :meth:`RetrieverModule.from_config` → the settings."""
    cfg = compose_cfg("train", ["module.grad_cache_chunk_size=4", "module.gradient_clip_val=0.5",
                                "module.optimizer.lr=1e-4", "module.warmup_ratio=0.2", "paths.output_dir=o"])
    assert set(cfg.module) == {"_target_", "_partial_", "optimizer", "scheduler", "warmup_ratio",
                               "grad_cache_chunk_size", "gradient_clip_val", "gradient_clip_algorithm"}
    module = instantiate(cfg.module)(model=tiny_encoder(tiny_bert), loss=ContrastiveLoss("lsepair"),
                                     stage=StageSettings(lr=3e-4, schedule_offset=2, schedule_total=9))
    assert module.optimizer_settings.factory.func is torch.optim.AdamW
    assert module.optimizer_settings.factory.keywords["lr"] == 1e-4 and module.optimizer_settings.lr == 3e-4
    assert (module.schedule.warmup_ratio, module.schedule.offset, module.schedule.total) == (0.2, 2, 9)
    assert module.grad_cache == GradCacheSettings(4, 0.5, "norm") and not module.automatic_optimization
    assert module.candidates == "group" and module.passage_row is None


SIDES = {  # name: (objective, passage side, GradCache chunk)
    "two_tower": ("jointlh", None, None),
    "two_tower_grad_cache": ("jointlh", None, 2),
    "query_side_group": ("lsepair", "group", None),
    "query_side_group_grad_cache": ("lsepair", "group", 1),
    "query_side_corpus": ("lsepair_maxn", "corpus", None),
    "query_side_corpus_grad_cache": ("summarglh", "corpus", 3),
}


@pytest.mark.parametrize("side", list(SIDES))
def test_every_passage_side_reaches_the_loss_through_scores_loss(tiny_bert, monkeypatch, side):
    """Two steps of a Lightning fit per path: each step calls ``scores_loss`` exactly once, with :class:`Scores`
    whose masks match the scores' shape, and what the step returns and logs as ``train/loss`` is its loss."""
    objective, candidates, chunk = SIDES[side]
    torch.manual_seed(0)
    model = tiny_encoder(tiny_bert)
    passages = PassageSettings()
    if candidates is not None:
        model.freeze_passage_encoder()
        ids = [f"p{i}-{k}" for i in range(4) for k in range(3)] + ["extra-0", "extra-1"]
        passages = PassageSettings(FrozenPassageIndex(ids, torch.randn(len(ids), 32)), candidates, chunk_size=5)
    batch = make_batch(model, make_groups(2, false_negative=True))
    if candidates is not None:
        batch.passages = None  # looked up in the index, never encoded
    module = RetrieverModule(model, ContrastiveLoss(objective), optimizer=OptimizerSettings(lr=1e-3),
                             grad_cache=GradCacheSettings(chunk), passages=passages)
    calls, steps, logged = [], [], []
    real_loss, real_step, real_log = RetrieverModule.scores_loss, RetrieverModule.training_step, RetrieverModule.log

    def scores_loss(self, scored):
        assert isinstance(scored, Scores)
        assert scored.scores.shape == scored.positive_mask.shape == scored.negative_mask.shape
        out = real_loss(self, scored)
        calls.append(float(out[0].detach()))
        return out

    def training_step(self, b, i):
        out = real_step(self, b, i)
        steps.append((len(calls), float(out["loss"])))
        return out

    def log(self, name, value, *args, **kwargs):
        if name == "train/loss":
            logged.append(float(value.detach()))
        return real_log(self, name, value, *args, **kwargs)

    monkeypatch.setattr(RetrieverModule, "scores_loss", scores_loss)
    monkeypatch.setattr(RetrieverModule, "training_step", training_step)
    monkeypatch.setattr(RetrieverModule, "log", log)
    trainer = L.Trainer(accelerator="cpu", devices=1, max_steps=2, logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0,
                        limit_val_batches=0, log_every_n_steps=1)
    trainer.fit(module, train_dataloaders=DataLoader([batch, batch], batch_size=None))
    assert trainer.global_step == 2 and module.automatic_optimization is (chunk is None)
    assert [n for n, _ in steps] == [1, 2]  # one scores_loss per step
    assert [loss for _, loss in steps] == calls == logged
