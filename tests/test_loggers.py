"""W&B logging never blocks: offline when the server cannot be reached."""

from __future__ import annotations

import time

from multipos import loggers


def test_wandb_logger_goes_offline_without_network(tmp_path, monkeypatch):
    monkeypatch.delenv("WANDB_MODE", raising=False)
    monkeypatch.setattr(loggers, "wandb_reachable", lambda *a, **k: False)
    start = time.monotonic()
    logger = loggers.wandb_logger(project="multipos-test", name="t", save_dir=str(tmp_path))
    logger.log_metrics({"train/loss": 1.0}, step=0)
    logger.experiment.finish()
    assert time.monotonic() - start < 120
    assert logger._offline is True
    assert any((tmp_path / "wandb").glob("offline-run-*"))


def test_unreachable_host_is_detected_quickly():
    start = time.monotonic()
    assert loggers.wandb_reachable("127.0.0.1", port=9, timeout=1.0) is False
    assert time.monotonic() - start < 5
