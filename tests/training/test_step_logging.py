"""The module logs ``train/loss`` and ``train/lr`` only on the steps whose values can reach a logger or the progress
bar (:meth:`multipos.training.module.RetrieverModule._logs_this_step`, from the trainer's public attributes), and what
the loggers write is what logging at every step wrote."""

from __future__ import annotations

from csv import DictReader
from types import SimpleNamespace

import pytest
import torch

from multipos.train import train
from multipos.training.module import RetrieverModule
from tests.helpers import compose_cfg, tiny_overrides


def _fit(tiny_beir, tiny_bert, out, *extra: str) -> tuple[list[dict], list[int], dict, float]:
    """Train on the tiny fixtures (2 epochs, batch 1) → (metrics.csv rows, the training steps (0, 1, … over the
    whole fit) in which the module called ``self.log("train/loss", …)``, the trainer's callback metrics at the end,
    the last step's loss)."""
    calls, last, done = [], {}, [0]
    real_log, real_step = RetrieverModule.log, RetrieverModule.training_step

    def log(self, name, value, *args, **kwargs):
        if name == "train/loss":
            calls.append(done[0])
        return real_log(self, name, value, *args, **kwargs)

    def step(self, batch, batch_idx):
        out = real_step(self, batch, batch_idx)
        done[0] += 1
        last["loss"], last["trainer"] = float(out["loss"].detach()), self.trainer
        return out

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(RetrieverModule, "log", log)
        mp.setattr(RetrieverModule, "training_step", step)
        train(compose_cfg("train", [*tiny_overrides(tiny_beir, tiny_bert, out), "trainer.max_epochs=2",
                                    "data.batch_size=1", "logger=csv", *extra]))
    with (out / "csv" / "metrics.csv").open() as f:
        rows = [{k: v for k, v in r.items() if v} for r in DictReader(f)]
    return rows, calls, dict(last["trainer"].callback_metrics), last["loss"]


@pytest.mark.parametrize("extra", [(), ("loss=jointlh", "module.grad_cache_chunk_size=1")],
                         ids=["two_tower", "grad_cache"])
def test_logging_only_the_logged_steps_writes_the_rows_that_logging_every_step_wrote(tiny_beir, tiny_bert, tmp_path,
                                                                                     monkeypatch, extra):
    monkeypatch.setenv("MULTIPOS_CACHE", str(tmp_path / "cache"))
    every = ("trainer.log_every_n_steps=3", *extra)
    rows, calls, metrics, last_loss = _fit(tiny_beir, tiny_bert, tmp_path / "skipping", *every)
    monkeypatch.setattr(RetrieverModule, "_logs_this_step", lambda self: True)  # up to 2026-11-26: every step
    all_rows, all_calls, _, _ = _fit(tiny_beir, tiny_bert, tmp_path / "every_step", *every)

    steps = 1 + max(all_calls)
    assert all_calls == list(range(steps)) and steps >= 8
    assert rows == all_rows
    written = [int(r["step"]) for r in rows if "train/loss" in r]
    assert written and all((s + 1) % 3 == 0 for s in written)
    per_epoch = steps // 2
    assert steps == 2 * per_epoch and per_epoch % 3  # two equal epochs, whose ends are not logging steps
    assert calls == [s for s in range(steps) if (s + 1) % 3 == 0 or (s + 1) % per_epoch == 0]  # written, epoch ends
    assert set(written) <= set(calls)
    # the bar's epoch summary shows the last step's loss
    assert float(metrics["train/loss"]) == pytest.approx(last_loss) and "train/lr" in metrics


def test_a_step_logs_outside_a_trainer():
    """Without a trainer (a module used on its own) nothing says which steps are written: every step logs."""
    assert RetrieverModule(torch.nn.Linear(2, 2), None)._logs_this_step() is True


def test_the_logged_steps_come_from_the_trainers_public_attributes():
    """Lightning's ``should_update_logs`` (every ``log_every_n_steps`` optimizer steps, or when training stops), a
    ``fast_dev_run`` or an epoch's last batch, read from a stand-in trainer that has nothing but those public
    attributes: no private Lightning attribute is read."""
    module = RetrieverModule(torch.nn.Linear(2, 2), None)

    def logs(**attributes) -> bool:
        module._trainer = SimpleNamespace(**{"fast_dev_run": False, "is_last_batch": False, "should_stop": False,
                                             "log_every_n_steps": 3, "global_step": 0, **attributes})
        return module._logs_this_step()

    assert [logs(global_step=s) for s in range(6)] == [False, False, True, False, False, True]
    assert logs(is_last_batch=True) and logs(should_stop=True) and logs(fast_dev_run=1)
    assert not logs(log_every_n_steps=0, global_step=2) and not logs(log_every_n_steps=0, should_stop=True)
    assert logs(log_every_n_steps=0, is_last_batch=True)
