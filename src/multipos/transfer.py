"""Host-to-device copies that leave the host free to run ahead of the device.

A copy from pageable host memory to a CUDA device (``tensor.to("cuda")``, ``torch.tensor(x, device="cuda")``)
makes the host wait until every kernel already queued on the device's stream has run: PyTorch synchronises the
stream after such a copy. In a training step that is a stall. The host cannot queue the next kernels while the
device runs the last ones, so every millisecond of Python the loop spends before its next kernel (Lightning's hooks
and logging, building masks) is time the device waits. Staging the tensor in pinned (page-locked) memory and copying
it with ``non_blocking=True`` queues the copy in stream order instead; PyTorch's caching host allocator keeps the
pinned staging buffer alive until the copy has run (PyTorch tutorial "A guide on good usage of ``non_blocking`` and
``pin_memory()``").

The other kind of stall, a device value read back to the host (``.item()``, ``bool(t)``, a boolean index), is kept
out of the training step by design; ``tests/test_host_sync.py`` checks both on the CPU, and on a GPU.
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["to_device"]


def to_device(tensor: Tensor, device: torch.device | str) -> Tensor:
    """``tensor`` on ``device``, without making the host wait for the device.

    A CPU tensor bound for a CUDA device is pinned and copied with ``non_blocking=True``: the copy runs in stream
    order, after the kernels already queued, and later kernels on the same stream see it. Any other pair of devices
    (CPU → CPU, a tensor already on the device, MPS) is ``tensor.to(device)``. Same shape and dtype.
    """
    device = torch.device(device)
    if device.type != "cuda" or tensor.device.type != "cpu":
        return tensor.to(device)
    return tensor.pin_memory().to(device, non_blocking=True)
