"""DataLoader workers that do not fork (``spawn``; ``forkserver``, Python 3.14's default on Linux; the worker
processes of Hydra's joblib launcher) receive the dataset and the collate function pickled: both must pickle
without the data module, whose trainer does not (seen on the H200 with ``parallel_jobs=2``, 2026-11-26)."""

from __future__ import annotations

import pickle
from types import SimpleNamespace

import pytest
import torch
from torch.utils.data import DataLoader

from multipos.data import MultiPosDataModule
from multipos.data.sources import BeirGradedSource


def _datamodule(tiny_beir, tiny_bert) -> MultiPosDataModule:
    dm = MultiPosDataModule(BeirGradedSource(str(tiny_beir), "qrels-graded/train.s-3.qrel", negative_depth=20),
                            str(tiny_bert), regime="heterogeneous", group_size=4, max_positives=2, batch_size=2,
                            num_workers=1)
    dm.set_stage("heterogeneous", None)
    dm.setup()
    return dm


def test_the_training_loader_s_collate_function_pickles_without_the_trainer(tiny_beir, tiny_bert):
    dm = _datamodule(tiny_beir, tiny_bert)
    dm.trainer_stand_in = lambda: None  # an attribute no pickle can take, as the Trainer's callbacks are
    loader = dm.train_dataloader()
    collate = pickle.loads(pickle.dumps(loader.collate_fn))
    groups = [dm.dataset[(0, 0)], dm.dataset[(1, 0)]]
    a, b = collate(groups), loader.collate_fn(groups)
    assert a.query_ids == b.query_ids and a.passage_ids == b.passage_ids
    assert torch.equal(a.query["input_ids"], b.query["input_ids"])
    assert torch.equal(a.passages["input_ids"], b.passages["input_ids"])
    assert torch.equal(a.positive_mask, b.positive_mask) and torch.equal(a.negative_mask, b.negative_mask)


def test_a_spawned_worker_yields_the_batches_of_the_main_process(tiny_beir, tiny_bert):
    dm = _datamodule(tiny_beir, tiny_bert)
    loader = dm.train_dataloader()
    keys = [(0, 0), (1, 0)]
    spawned = DataLoader([dm.dataset[k] for k in keys], batch_size=2, collate_fn=loader.collate_fn, num_workers=1,
                         multiprocessing_context="spawn")
    (batch,) = list(spawned)
    expected = loader.collate_fn([dm.dataset[k] for k in keys])
    assert batch.query_ids == expected.query_ids and torch.equal(batch.query["input_ids"], expected.query["input_ids"])
    assert torch.equal(batch.passages["attention_mask"], expected.passages["attention_mask"])


def test_the_training_dataset_pickles(tiny_beir, tiny_bert):
    dm = _datamodule(tiny_beir, tiny_bert)
    loader = dm.train_dataloader()
    dataset = pickle.loads(pickle.dumps(loader.dataset))
    assert dataset[(3, 1)] == loader.dataset[(3, 1)]


def test_workers_start_with_the_standard_library_s_method_inside_a_loky_process(monkeypatch):
    """Inside a job of Hydra's joblib launcher the default start method is loky's, which cannot start the
    DataLoader's plain ``multiprocessing.Process``: the loader names the platform's standard method instead."""
    import multiprocessing
    import sys

    from multipos.data.loader import worker_start_method

    assert worker_start_method(0) is None and worker_start_method(2) is None  # this process: a standard method
    monkeypatch.setattr(multiprocessing, "get_start_method", lambda allow_none=False: "loky")
    assert worker_start_method(0) is None
    expected = "fork" if sys.platform == "linux" and sys.version_info < (3, 14) else "forkserver"
    assert worker_start_method(2) == expected


def test_the_training_loader_s_workers_send_batches_by_file_name_and_yield_the_in_process_batches(tiny_beir, tiny_bert):
    from multipos.data.loader import WorkerInit

    dm = _datamodule(tiny_beir, tiny_bert)
    loader = dm.train_dataloader()
    assert loader.worker_init_fn == WorkerInit(0)
    with_workers = list(loader)
    dm.num_workers = 0
    in_process = list(dm.train_dataloader())
    assert [b.query_ids for b in with_workers] == [b.query_ids for b in in_process]
    for a, b in zip(with_workers, in_process):
        assert torch.equal(a.passages["input_ids"], b.passages["input_ids"]) and torch.equal(a.negative_mask,
                                                                                            b.negative_mask)


def test_worker_init_switches_the_worker_to_file_names_and_keeps_lightning_s_worker_seeding(monkeypatch):
    import lightning.fabric.utilities.seed as seed

    from multipos.data.loader import WorkerInit

    calls = []
    monkeypatch.setattr(seed, "pl_worker_init_function", lambda worker_id, rank=None: calls.append((worker_id, rank)))
    before = torch.multiprocessing.get_sharing_strategy()
    try:
        monkeypatch.delenv("PL_SEED_WORKERS", raising=False)
        WorkerInit(rank=1)(0)
        assert torch.multiprocessing.get_sharing_strategy() == "file_system" and calls == []
        monkeypatch.setenv("PL_SEED_WORKERS", "1")  # what seed_everything(workers=True) sets (multipos.train)
        WorkerInit(rank=1)(3)
        assert calls == [(3, 1)]
        WorkerInit(rank=1, sharing="file_descriptor")(4)  # torch's default, which bench_speed.py times against it
        assert torch.multiprocessing.get_sharing_strategy() == "file_descriptor" and calls == [(3, 1), (4, 1)]
    finally:
        torch.multiprocessing.set_sharing_strategy(before)


def test_worker_init_keeps_file_descriptors_where_file_names_fail(monkeypatch, caplog):
    import logging

    from multipos.data.loader import WorkerInit

    def fails(self):
        raise RuntimeError("error executing torch_shm_manager")

    monkeypatch.delenv("PL_SEED_WORKERS", raising=False)
    monkeypatch.setattr(torch.Tensor, "share_memory_", fails)
    before = torch.multiprocessing.get_sharing_strategy()
    try:
        with caplog.at_level(logging.WARNING, logger="multipos.data.loader"):
            WorkerInit()(2)
        assert torch.multiprocessing.get_sharing_strategy() == before
        assert "worker 2: tensors by file name failed (RuntimeError: error executing torch_shm_manager)" in caplog.text
    finally:
        torch.multiprocessing.set_sharing_strategy(before)


def test_a_loader_with_pin_memory_pins_every_tensor_of_each_batch(tiny_beir, tiny_bert, monkeypatch):
    """``MultiPosDataModule.pin_memory``: the DataLoader's pin-memory thread calls :meth:`Batch.pin_memory`, which
    pins every token tensor and both masks (:func:`multipos.model.transfer.pinned`) and keeps the rest (a stand-in for
    ``pinned`` here: pinning needs an accelerator; tests/test_cuda.py pins for real)."""
    from torch.utils.data._utils.pin_memory import pin_memory

    import multipos.data.collate as collate

    dm = _datamodule(tiny_beir, tiny_bert)
    assert dm.train_dataloader().pin_memory is False  # the default
    dm.pin_memory = True
    assert dm.train_dataloader().pin_memory is True
    batch = dm.train_dataloader().collate_fn([dm.dataset[(0, 0)], dm.dataset[(1, 0)]])
    pinned = []
    monkeypatch.setattr(collate, "pinned", lambda t: pinned.append(t) or t.clone())
    out = pin_memory(batch)  # what the loader's pin-memory thread does with each batch
    tensors = [*batch.query.values(), *batch.passages.values(), batch.positive_mask, batch.negative_mask]
    assert len(pinned) == len(tensors) and all(any(p is t for p in pinned) for t in tensors)
    assert out.query_ids == batch.query_ids and out.passage_ids == batch.passage_ids and out.groups is batch.groups
    assert torch.equal(out.passages["input_ids"], batch.passages["input_ids"]) and out.passages["input_ids"] is not \
        batch.passages["input_ids"]


@pytest.mark.parametrize("needs", [None, False, True], ids=["not_said", "not_needed", "needed"])
def test_batches_carry_their_groups_unless_the_stage_inputs_say_none_are_needed(tiny_beir, tiny_bert, needs):
    """:attr:`multipos.data.StageInputs.batch_groups` (the stage's module says it:
    :meth:`multipos.training.module.RetrieverModule.needs_batch_groups`): False leaves the groups in the worker;
    inputs that do not say, or none handed over, keep them. Everything else in the batch is the same, and the data
    module asks the trainer's module nothing."""
    from multipos.data import StageInputs

    dm = _datamodule(tiny_beir, tiny_bert)
    keys = [dm.dataset[(0, 0)], dm.dataset[(1, 0)]]
    kept = dm.train_dataloader().collate_fn(keys)  # no trainer, no inputs
    if needs is not None:
        dm.set_inputs(StageInputs(batch_groups=needs))
    module = SimpleNamespace(needs_batch_groups=lambda: not needs)  # contradicts the inputs: never asked
    dm.trainer = SimpleNamespace(lightning_module=module, world_size=1, global_rank=0, current_epoch=0)
    batch = pickle.loads(pickle.dumps(dm.train_dataloader().collate_fn(keys)))  # as a worker sends it
    assert kept.groups == keys
    assert batch.groups == (None if needs is False else keys)
    assert batch.query_ids == kept.query_ids and batch.passage_ids == kept.passage_ids
    assert torch.equal(batch.positive_mask, kept.positive_mask) and torch.equal(batch.negative_mask, kept.negative_mask)
    assert torch.equal(batch.passages["input_ids"], kept.passages["input_ids"])
