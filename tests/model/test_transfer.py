"""multipos.model.transfer: host-to-device copies without a host wait, staged in pinned memory by the calling thread
alone.

Pinning needs an accelerator, so here the copy is made into ordinary memory (``_copy_into`` with ``torch.empty``) and
PyTorch's own copies are made to fail: the values arrive, and no intra-op thread was asked to make them.
tests/test_cuda.py pins for real."""

from __future__ import annotations

import pytest
import torch

import multipos.model.transfer as transfer
from multipos.model.transfer import _copy_into, pinned, to_device


def _plain(shape, dtype):
    return torch.empty(shape, dtype=dtype)


def _no_torch_copies(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("PyTorch's own copy was used")

    for name in ("copy_", "pin_memory", "clone", "contiguous"):
        monkeypatch.setattr(torch.Tensor, name, refuse)


@pytest.mark.parametrize("make", [
    lambda: torch.arange(24).reshape(4, 6),                               # token ids, int64
    lambda: torch.arange(24).reshape(4, 6) % 3 == 0,                      # a mask
    lambda: torch.arange(24, dtype=torch.int32).reshape(4, 6)[:, ::2],   # strided
    lambda: torch.arange(24).reshape(4, 6).T,                             # transposed
    lambda: torch.randn(3, 5, dtype=torch.float16),
    lambda: torch.tensor(2.5),                                            # 0-dim
    lambda: torch.zeros(0, 7, dtype=torch.long),                          # empty
], ids=["int64", "bool", "strided_int32", "transposed", "float16", "scalar", "empty"])
def test_the_staging_copy_is_made_by_numpy_in_this_thread_with_the_same_values(make, monkeypatch):
    source = make()
    _no_torch_copies(monkeypatch)
    out = _copy_into(source, _plain)
    assert out.dtype == source.dtype and out.shape == source.shape and out.is_contiguous()
    assert out.data_ptr() != source.data_ptr() or source.numel() == 0
    monkeypatch.undo()
    assert torch.equal(out, source)


@pytest.mark.parametrize("make", [lambda: torch.randn(2, 3).to(torch.bfloat16),
                                  lambda: torch.randn(2, 3, requires_grad=True)], ids=["bfloat16", "requires_grad"])
def test_what_numpy_cannot_hold_is_pinned_by_pytorch(make, monkeypatch):
    source, seen = make(), []
    monkeypatch.setattr(torch.Tensor, "pin_memory", lambda self: seen.append(self) or self.detach().clone())
    out = _copy_into(source, _plain)
    assert seen == [source] and torch.equal(out, source.detach())


def test_a_pinned_tensor_is_returned_as_it_is(monkeypatch):
    t = torch.arange(3)
    monkeypatch.setattr(torch.Tensor, "is_pinned", lambda self: True)
    assert pinned(t) is t


def test_pinning_without_an_accelerator_raises():
    if torch.cuda.is_available():
        pytest.skip("a CUDA GPU is present: pinning works")
    with pytest.raises(RuntimeError, match="pin"):
        pinned(torch.arange(3))


def test_to_a_cuda_device_the_tensor_is_staged_by_pinned_and_copied_without_blocking(monkeypatch):
    """The CPU → CUDA path, with the pinned copy and the device copy recorded instead of made."""
    calls = []

    class Staged(torch.Tensor):
        def to(self, device, non_blocking=False):
            calls.append((str(device), non_blocking))
            return self

    monkeypatch.setattr(transfer, "pinned", lambda t: calls.append("pinned") or t.as_subclass(Staged))
    to_device(torch.arange(3), "cuda:0")
    assert calls == ["pinned", ("cuda:0", True)]
    calls.clear()
    to_device(torch.arange(3), "cpu")  # no other device pair is staged
    assert calls == []
