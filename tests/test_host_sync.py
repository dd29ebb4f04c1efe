"""The training step never makes the host wait for the device (issue "The GPU path, proven on a GPU", item 2: the
Lightning loop against the bare step).

On a GPU the host queues kernels ahead of the device; a value read back to the host (``.item()``, ``bool(t)``,
``.tolist()``, a boolean index) or a copy from pageable host memory makes it wait until the device has caught up,
and the Python the loop runs next (Lightning's hooks and logging) becomes time the device idles. A bare PyTorch loop
has none of these stalls, so each one in multipos's own step is a cost the Lightning loop pays and the bare loop
does not.

On the CPU, :class:`HostReads` records every tensor method that reads values back to the host and is called from the
multipos package itself, and the tiny training jobs check that none happens in a training step after the first (the
first one checks the loss masks' rows, by design). The copies to the device are checked on a GPU, in
``tests/test_cuda.py`` (``torch.cuda.set_sync_debug_mode``); here :func:`multipos.model.transfer.to_device` is checked
to be a
plain copy on the CPU.
"""

from __future__ import annotations

import traceback
from pathlib import Path

import lightning
import lightning_utilities
import pytest
import torch
from torch.overrides import TorchFunctionMode

import multipos
from multipos.losses import ContrastiveLoss
from multipos.model.transfer import to_device
from multipos.train import train
from multipos.training.corpus_candidates import _chunk_mask
from multipos.training.module import RetrieverModule
from tests.helpers import compose_cfg, tiny_overrides, training_device_type

PACKAGE = str(Path(multipos.__file__).resolve().parent)
#: The training loop's own code: multipos and Lightning (``lightning``, and the ``lightning_utilities`` helpers its
#: logging converts values with).
LOOP = (PACKAGE, *(str(Path(m.__file__).resolve().parent) for m in (lightning, lightning_utilities)))
READS = frozenset({"item", "tolist", "numpy", "__bool__", "__int__", "__float__", "__index__", "nonzero",
                   "masked_select", "unique", "_local_scalar_dense"})


def _advanced_index(index) -> bool:
    """True where ``index`` (what ``t[index]`` is given) holds a tensor, so that ``t[index] = v`` is ``index_put_``."""
    return torch.is_tensor(index) or (isinstance(index, tuple) and any(torch.is_tensor(i) for i in index))


class HostReads(TorchFunctionMode):
    """Records the tensor calls that make the host wait for the device, made directly from a source file under one of
    ``roots`` (default: the multipos package): ``reads`` is a list of ``(call, "file:line function")``.

    Recorded: the reads of device values back to the host (``item``, ``bool(t)``, ``tolist``, ``nonzero``, indexing
    with a boolean tensor, …), and ``t[tensor index] = python scalar`` (recorded as ``"index_put_ scalar"``): on a
    CUDA tensor PyTorch makes the scalar a host tensor and copies it from pageable memory, a host wait per call (the
    H200 suite of 2026-11-27 found one in every corpus chunk); a slice with a scalar is a fill and is not recorded.
    Only calls on a tensor of ``device_type`` (default: the suite's training device,
    :func:`tests.helpers.training_device_type`) count: where the jobs train on CUDA, a NumPy view of a host tensor
    (the staging of a batch into pinned memory, :mod:`multipos.model.transfer`) reads nothing from the device. Calls
    from
    anywhere else (PyTorch, transformers, this test) are not recorded."""

    def __init__(self, roots: tuple[str, ...] = (PACKAGE,), device_type: str | None = None):
        super().__init__()
        self.roots = roots
        self.device_type = device_type or training_device_type()
        self.reads: list[tuple[str, str]] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        name = getattr(func, "__name__", "")
        indexing = name in ("__getitem__", "__setitem__") and len(args) > 1
        boolean_index = indexing and torch.is_tensor(args[1]) and args[1].dtype == torch.bool
        scalar_put = (indexing and name == "__setitem__" and len(args) > 2 and not torch.is_tensor(args[2])
                      and _advanced_index(args[1]))
        if (name in READS or boolean_index or scalar_put) and any(
                torch.is_tensor(a) and a.device.type == self.device_type for a in args):
            caller = traceback.extract_stack(limit=2)[0]
            if str(Path(caller.filename).resolve()).startswith(self.roots):
                call = "index_put_ scalar" if scalar_put and not boolean_index else name
                self.reads.append((call, f"{Path(caller.filename).name}:{caller.lineno} {caller.name}"))
        return func(*args, **(kwargs or {}))


def test_host_reads_sees_a_read_from_the_package_and_not_from_a_test():
    from multipos.losses import _check_rows

    with HostReads(device_type="cpu") as rec:
        bool(torch.ones(2).any())  # this file: not the package
        _check_rows("singlelh", torch.ones(3, dtype=torch.long))
    assert [call for call, _ in rec.reads] == ["__bool__", "__bool__"]
    assert all("losses.py" in where for _, where in rec.reads)


def test_contrastive_loss_checks_the_rows_of_its_first_batch_and_reads_nothing_later():
    scores, one = torch.randn(2, 4), torch.tensor([[True, False, False, False], [False, False, True, False]])
    loss = ContrastiveLoss("singlelh")
    with pytest.raises(ValueError, match="rows \\[0\\] have several"):
        loss(scores, one | torch.tensor([[False, True, False, False], [False] * 4]), ~one)
    loss = ContrastiveLoss("jointlh")
    loss(scores, one, ~one)
    with HostReads(device_type="cpu") as rec:
        for _ in range(3):
            loss(scores, one, ~one)
    assert rec.reads == []


def test_corpus_chunk_mask_marks_the_judged_pairs_inside_the_chunk():
    judged = torch.tensor([[0, 1], [0, 7], [1, 4], [1, 5], [2, 9]])
    got = _chunk_mask(judged, 4, 8, (3, 4), "cpu")
    want = torch.zeros(3, 4, dtype=torch.bool)
    want[0, 3] = want[1, 0] = want[1, 1] = True
    assert torch.equal(got, want)
    assert not _chunk_mask(torch.zeros(0, 2, dtype=torch.long), 0, 4, (3, 4), "cpu").any()


def test_corpus_chunk_mask_writes_a_device_value_not_a_host_scalar():
    """Regression (H200 suite, 2026-11-27): ``mask[rows, cols] = True`` copied the scalar from the host to the GPU in
    every chunk of every query-side step over the corpus (``test_cuda.py``'s sync check, ``query_side_corpus_max``)."""
    judged = torch.tensor([[0, 1], [0, 7], [1, 4], [1, 5], [2, 9]])
    with HostReads(device_type="cpu") as rec:
        _chunk_mask(judged, 4, 8, (3, 4), "cpu")
    assert rec.reads == []


def test_host_reads_records_a_scalar_put_at_tensor_indices_and_only_calls_on_the_training_device():
    from multipos.model import transfer

    mask, rows = torch.zeros(3, 4, dtype=torch.bool), torch.tensor([0, 2])
    with HostReads(roots=(str(Path(__file__).resolve()),), device_type="cpu") as rec:
        mask[rows, rows] = True  # index_put_ of a host scalar: recorded
        mask[:, 1] = True  # a slice: a fill on the device, not recorded
        mask[rows, rows] = torch.ones((), dtype=torch.bool)  # a tensor value: not recorded
    assert [call for call, _ in rec.reads] == ["index_put_ scalar"]
    host = torch.arange(6).reshape(2, 3)
    for device_type, seen in (("cpu", True), ("meta", False)):  # "meta" stands for a CUDA run's device here
        with HostReads(device_type=device_type) as rec:
            copy = transfer._copy_into(host, lambda shape, dtype: torch.empty(shape, dtype=dtype))
        assert torch.equal(copy, host)
        assert any(call == "numpy" and "transfer.py" in where for call, where in rec.reads) == seen, device_type


def test_to_device_on_the_cpu_is_the_tensor_itself():
    t = torch.arange(6).reshape(2, 3)
    assert to_device(t, "cpu") is t.to("cpu")
    assert torch.equal(to_device(t, torch.device("cpu")), t)


@pytest.mark.parametrize("extra", [
    ("loss=singlelh",),
    ("loss=jointlh", "module.grad_cache_chunk_size=1"),
    ("passages=frozen_index", "passages.candidates=group", "loss=lsepair"),
    ("passages=frozen_index", "passages.candidates=corpus", "passages.chunk_size=7", "loss=summarglh"),
    ("passages=frozen_index", "passages.candidates=corpus", "passages.chunk_size=7", "loss=lsepair_maxn"),
], ids=["two_tower", "two_tower_grad_cache", "query_side_group", "query_side_corpus_lse", "query_side_corpus_max"])
def test_no_training_step_after_the_first_reads_a_value_back(tiny_beir, tiny_bert, tmp_path, monkeypatch, extra):
    """``pack_sequences=0``: sequence packing is a CPU-only path (it returns before reading anything when the batch is
    on an accelerator), so it is left out of what is counted here."""
    monkeypatch.setenv("MULTIPOS_CACHE", str(tmp_path / "cache"))
    steps: list[list[tuple[str, str]]] = []
    real = RetrieverModule.training_step

    def recorded(self, batch, batch_idx):
        with HostReads() as rec:
            out = real(self, batch, batch_idx)
        steps.append(rec.reads)
        return out

    monkeypatch.setattr(RetrieverModule, "training_step", recorded)
    train(compose_cfg("train", [*tiny_overrides(tiny_beir, tiny_bert, tmp_path / "run"), "trainer.max_epochs=2",
                                "pack_sequences=0", *extra]))
    assert len(steps) >= 4
    assert any("_check_rows" in where for _, where in steps[0])  # the first step checks the masks' rows
    assert [reads for reads in steps[1:] if reads] == []


class StepTag(lightning.Callback):
    """Splits what a whole ``fit`` records (``records``: a list that grows as it runs) by training step: each batch
    start notes ``(epoch, batch_idx, last batch of the epoch)`` and how many records there are; what is recorded until
    the next batch starts belongs to that step. Also used by ``tests/test_cuda.py``."""

    def __init__(self, records: list):
        self.records, self.tags = records, []

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        self.tags.append((trainer.current_epoch, batch_idx, batch_idx + 1 == trainer.num_training_batches,
                          len(self.records)))

    def steps(self) -> list[tuple[tuple[int, int, bool], list]]:
        """[((epoch, batch_idx, last of its epoch), the records of that step)] in step order."""
        ends = [n for *_, n in self.tags[1:]] + [len(self.records)]
        return [(tuple(tag), self.records[start:end]) for (*tag, start), end in zip(self.tags, ends)]


@pytest.mark.parametrize("log_every,extra", [
    (1, ()),
    (1000, ()),
    (1000, ("loss=jointlh", "module.grad_cache_chunk_size=1")),
    (1000, ("passages=frozen_index", "passages.candidates=corpus", "passages.chunk_size=7", "loss=lsepair")),
], ids=["every_step", "two_tower", "two_tower_grad_cache", "query_side_corpus"])
def test_between_logging_steps_the_loop_reads_nothing_back(tiny_beir, tiny_bert, tmp_path, monkeypatch, log_every,
                                                           extra):
    """The whole Lightning loop, progress bar included (:func:`multipos.training.fit.progress_bar`), reads the loss
    back from
    the device only when it logs (``trainer.log_every_n_steps``; every 10 steps where a CUDA GPU is) and at an
    epoch's end: in the two-tower loop, with GradCache (Lightning's manual optimisation) and in query-side training
    over every corpus passage. Logging every step reads at every step (what a GPU run did before 2026-11-26);
    logging every 1000 steps reads at no step but an epoch's last (its dev retrieval, the bar's epoch summary, the
    next epoch's sampler).
    Reads from PyTorch's optimizer (the CPU's single-tensor AdamW reads its step count; on CUDA the step counts stay
    on the CPU) and from transformers (the attention mask check at each forward's start, the bare loop's as well) are
    not counted."""
    monkeypatch.setenv("MULTIPOS_CACHE", str(tmp_path / "cache"))
    rec = HostReads(LOOP)
    tag = StepTag(rec.reads)
    real_fit = lightning.Trainer.fit

    def fit(self, *args, **kwargs):
        self.callbacks.insert(0, tag)
        with rec:
            return real_fit(self, *args, **kwargs)

    monkeypatch.setattr(lightning.Trainer, "fit", fit)
    train(compose_cfg("train", [*tiny_overrides(tiny_beir, tiny_bert, tmp_path / "run"), "trainer.max_epochs=2",
                                "data.batch_size=1", "pack_sequences=0", "trainer.enable_progress_bar=true",
                                f"trainer.log_every_n_steps={log_every}", *extra]))
    steps = tag.steps()
    assert len(steps) >= 8 and sum(not last for (_, _, last), _ in steps) >= 6
    if log_every == 1:
        assert all(any(call == "item" for call, _ in reads) for _, reads in steps)
    else:
        assert [(t, reads) for t, reads in steps[1:] if reads and not t[2]] == []  # the first step checks the masks
