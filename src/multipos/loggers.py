"""Experiment loggers: W&B that never blocks (offline when its server cannot be reached)."""

from __future__ import annotations

import os
import socket


def wandb_reachable(host: str = "api.wandb.ai", port: int = 443, timeout: float = 2.0) -> bool:
    """True if a TCP connection to the W&B server opens within ``timeout`` seconds."""
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def wandb_logger(project: str = "multipos", name: str | None = None, save_dir: str = ".", offline: bool | None = None, **kwargs):
    """Lightning ``WandbLogger``; ``offline=None`` picks offline mode when the server is unreachable.

    Offline runs are written under ``<save_dir>/wandb`` and can be uploaded later with ``wandb sync``.
    """
    from lightning.pytorch.loggers import WandbLogger

    if offline is None:
        offline = os.environ.get("WANDB_MODE") == "offline" or not wandb_reachable()
    os.environ.setdefault("WANDB_INIT_TIMEOUT", "30")
    return WandbLogger(project=project, name=name, save_dir=save_dir, offline=offline, **kwargs)
