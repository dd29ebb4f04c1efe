"""Host-to-device copies that leave the host free to run ahead of the device.

A copy from pageable host memory to a CUDA device (``tensor.to("cuda")``, ``torch.tensor(x, device="cuda")``)
makes the host wait until every kernel already queued on the device's stream has run: PyTorch synchronises the
stream after such a copy. In a training step that is a stall. The host cannot queue the next kernels while the
device runs the last ones, so every millisecond of Python the loop spends before its next kernel (Lightning's hooks
and logging, building masks) is time the device waits. Staging the tensor in pinned (page-locked) memory and copying
it with ``non_blocking=True`` queues the copy in stream order instead; PyTorch's caching host allocator keeps the
pinned staging buffer alive until the copy has run (PyTorch tutorial "A guide on good usage of ``non_blocking`` and
``pin_memory()``").

The staging copy into pinned memory is made by the calling thread alone (:func:`pinned`). PyTorch's own copy
(``Tensor.pin_memory``, ``copy_``) splits a tensor of more than 32,768 elements over its intra-op (OpenMP) threads, and
those threads sleep while the main process waits for the device; waking them can cost far more than the copy.
Staging the token tensors and masks of a B=64 × G=8 NFCorpus batch received from a DataLoader worker, 30 ms after the
last copy, took medians of 1.4, 2.8 and 9.4 ms in three runs (90th percentiles 9.8–9.9 ms) with PyTorch's copy over
two threads, and 0.20–0.36 ms in one thread (``bench/bench_batch_receive.py``, 2-core AMD EPYC, 2026-11-27).

The other kind of stall, a device value read back to the host (``.item()``, ``bool(t)``, a boolean index), is kept
out of the training step by design; ``tests/test_host_sync.py`` checks both on the CPU, and on a GPU.
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["pinned", "to_device"]

#: dtypes NumPy holds as they are, so their bytes can be copied by NumPy in the calling thread (no bfloat16, no
#: float8, no quantised types: those are pinned by PyTorch's own copy).
_NUMPY_DTYPES = frozenset({torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64,
                           torch.float16, torch.float32, torch.float64})


def to_device(tensor: Tensor, device: torch.device | str) -> Tensor:
    """``tensor`` on ``device``, without making the host wait for the device.

    A CPU tensor bound for a CUDA device is pinned and copied with ``non_blocking=True``: the copy runs in stream
    order, after the kernels already queued, and later kernels on the same stream see it. Any other pair of devices
    (CPU → CPU, a tensor already on the device, MPS) is ``tensor.to(device)``. Same shape and dtype.
    """
    device = torch.device(device)
    if device.type != "cuda" or tensor.device.type != "cpu":
        return tensor.to(device)
    return pinned(tensor).to(device, non_blocking=True)


def pinned(tensor: Tensor) -> Tensor:
    """``tensor`` (CPU) in page-locked memory: the tensor itself when it is pinned already, else a pinned copy (same
    shape, dtype and values, contiguous) that the calling thread makes alone, without PyTorch's intra-op threads
    (module docstring: waking PyTorch's sleeping intra-op threads costs more than the copy). Tensors NumPy cannot hold
    (bfloat16, …) or that require grad are copied by ``Tensor.pin_memory``. Raises RuntimeError where no accelerator
    is available (PyTorch's pinned allocator)."""
    if tensor.is_pinned():
        return tensor
    return _copy_into(tensor, lambda shape, dtype: torch.empty(shape, dtype=dtype, pin_memory=True))


def _copy_into(tensor: Tensor, empty) -> Tensor:
    """A copy of ``tensor`` into ``empty(shape, dtype)``, made by NumPy in this thread where the dtype allows (else
    ``tensor.pin_memory()``)."""
    if tensor.requires_grad or tensor.dtype not in _NUMPY_DTYPES:
        return tensor.pin_memory()
    out = empty(tensor.shape, tensor.dtype)
    out.numpy()[...] = tensor.numpy()
    return out
