"""Callbacks (multipos.training.callbacks): the RNG states a checkpoint carries for a resumed run's dropout."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch

from multipos.training.callbacks import RNGStateCheckpoint


def _draws() -> tuple:
    return torch.rand(3).tolist(), random.random(), float(np.random.rand())


def test_cpu_python_and_numpy_states_round_trip():
    cb, checkpoint = RNGStateCheckpoint(), {}
    torch.manual_seed(1), random.seed(1), np.random.seed(1)
    cb.on_save_checkpoint(None, None, checkpoint)
    expected = _draws()
    _draws()
    cb.on_load_checkpoint(None, None, checkpoint)
    assert _draws() == expected


def test_the_cuda_generator_is_saved_and_restored(monkeypatch):
    """A GPU's dropout draws from the CUDA generator: without its state a run resumed mid-epoch on an H100
    (2026-11-25) ended with other weights than the uninterrupted run. Stand-ins for torch.cuda keep this on the CPU."""
    state = torch.arange(8, dtype=torch.uint8)
    restored = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_rng_state", lambda: state.clone())
    monkeypatch.setattr(torch.cuda, "set_rng_state", restored.append)
    cb, checkpoint = RNGStateCheckpoint(), {}
    cb.on_save_checkpoint(None, None, checkpoint)
    assert torch.equal(checkpoint["multipos_rng"]["cuda"], state)
    cb.on_load_checkpoint(None, None, checkpoint)
    assert len(restored) == 1 and torch.equal(restored[0], state)

    del checkpoint["multipos_rng"]["cuda"]  # a checkpoint written on the CPU: the CUDA generator stays as seeded
    cb.on_load_checkpoint(None, None, checkpoint)
    assert len(restored) == 1


def test_no_cuda_state_where_cuda_is_not_initialised(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: False)
    checkpoint = {}
    RNGStateCheckpoint().on_save_checkpoint(None, None, checkpoint)
    assert "cuda" not in checkpoint["multipos_rng"]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_dropout_on_cuda_after_a_restore_draws_the_same_masks():
    torch.cuda.manual_seed(3)
    x = torch.ones(64, device="cuda")
    cb, checkpoint = RNGStateCheckpoint(), {}
    cb.on_save_checkpoint(None, None, checkpoint)
    expected = torch.nn.functional.dropout(x, 0.5)
    torch.nn.functional.dropout(x, 0.5)
    cb.on_load_checkpoint(None, None, checkpoint)
    assert torch.equal(torch.nn.functional.dropout(x, 0.5), expected)


def test_the_progress_bar_shows_the_logged_loss_and_follows_the_logging_interval():
    """:func:`multipos.training.fit.progress_bar`: none when the trainer disables it, else a bar refreshing every
    ``log_every_n_steps`` steps that shows ``train/loss`` from the logged metrics (the module logs it without
    ``prog_bar``, which Lightning would read back from the device at every step)."""
    from types import SimpleNamespace

    from omegaconf import OmegaConf

    from multipos.training.callbacks import LoggedProgressBar
    from multipos.training.fit import progress_bar

    assert progress_bar(OmegaConf.create({"enable_progress_bar": False, "log_every_n_steps": 10})) == []
    (bar,) = progress_bar(OmegaConf.create({"enable_progress_bar": True, "log_every_n_steps": 10}))
    assert isinstance(bar, LoggedProgressBar) and bar.refresh_rate == 10
    assert progress_bar(OmegaConf.create({"log_every_n_steps": 0}))[0].refresh_rate == 1
    trainer = SimpleNamespace(callback_metrics={"train/loss": torch.tensor(1.5), "train/lr": torch.tensor(2e-5)},
                              progress_bar_metrics={"val/ndcg@10": 0.25}, loggers=[])
    shown = bar.get_metrics(trainer, None)
    assert shown["train/loss"] == 1.5 and shown["val/ndcg@10"] == 0.25 and "train/lr" not in shown
    assert "train/loss" not in bar.get_metrics(SimpleNamespace(callback_metrics={}, progress_bar_metrics={},
                                                               loggers=[]), None)
