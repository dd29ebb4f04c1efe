"""The accelerator path on a CUDA GPU (every test here is skipped where ``torch.cuda.is_available()`` is False, so CI
never needs a GPU). Issue "The GPU path, proven on a GPU", item 1:

* every objective on scores made under bf16 / fp16 autocast (τ = 0.01: |score| up to 100, where exp overflows fp16)
  gives the loss and score gradient of the same scores in float64 — the objectives promote, nothing overflows;
* corpus encoding on CUDA (bf16 autocast) matches the CPU fp32 embeddings, and ``device="auto"`` moves a CPU model
  to the GPU (the zero-shot reference, the teacher, the final evaluation);
* GradCache on CUDA with dropout on equals plain backpropagation with the same dropout masks (the CUDA random state
  is captured and restored per chunk), for every objective;
* the exact full-corpus reduction (``passages.candidates=corpus``) on CUDA, bf16 index, equals the unchunked
  [B, N] computation, masks built on the scores' device;
* :func:`multipos.model.transfer.pinned` stages every dtype in page-locked memory and ``to_device`` copies it exactly;
* ``train.py``'s job end to end with ``trainer=gpu`` (bf16-mixed): two-tower with dense hard negatives, and
  query-side with every corpus passage a candidate and GradCache — finite metrics, CUDA recorded in run_info.

The rest of the suite runs on the GPU too with ``MULTIPOS_TEST_ACCELERATOR=gpu``
(:func:`tests.helpers.trainer_overrides`): the tiny training jobs then train on CUDA in fp32. docs/gpu.md gives the
command and what it found.
"""

from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F

from multipos.losses import OBJECTIVES, SINGLE_POSITIVE, ContrastiveLoss, compute
from multipos.retrieval.encoding import encode
from multipos.train import train
from multipos.training.corpus_candidates import corpus_scores, corpus_targets, full_corpus_scores
from multipos.training.grad_cache import chunks, grad_cache_step
from multipos.training.module import RetrieverModule
from tests.helpers import compose_cfg, tiny_overrides
from tests.training.test_distributed import make_batch, make_groups, tiny_encoder

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
CUDA = torch.device("cuda")


def _masks(name: str, b: int, n: int):
    """[b, n] masks: one positive per row for single-positive objectives, else two or three; the rest negatives
    except one ignored (judged) column per row."""
    pos = torch.zeros(b, n, dtype=torch.bool)
    for i in range(b):
        for j in range(1 if name in SINGLE_POSITIVE else 2 + i % 2):
            pos[i, (i * 5 + j * 3) % n] = True
    neg = ~pos
    neg[torch.arange(b), (torch.arange(b) * 5 + 1) % n] = False
    return pos, neg


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("name", sorted(OBJECTIVES))
def test_objectives_on_autocast_scores_equal_float64(name, dtype):
    gen = torch.Generator().manual_seed(0)
    q = F.normalize(torch.randn(8, 64, generator=gen), dim=-1).to(CUDA)
    p = F.normalize(torch.randn(32, 64, generator=gen), dim=-1).to(CUDA)
    pos, neg = _masks(name, 8, 32)
    with torch.autocast("cuda", dtype=dtype):
        scores = (q @ p.T) * 100.0            # τ = 0.01
    assert scores.dtype == dtype
    scores = scores.detach().requires_grad_()
    loss = compute(name, scores, pos.to(CUDA), neg.to(CUDA))
    assert loss.dtype == torch.float32 and bool(torch.isfinite(loss).all()), name
    loss.sum().backward()
    ref_scores = scores.detach().double().cpu().requires_grad_()
    ref = compute(name, ref_scores, pos, neg)
    ref.sum().backward()
    assert torch.allclose(loss.double().cpu(), ref.detach(), rtol=1e-5, atol=1e-4), name
    assert bool(torch.isfinite(scores.grad).all()), name
    # the gradient arrives in the scores' dtype: compare at that dtype's resolution
    assert float((scores.grad.double().cpu() - ref_scores.grad).abs().max()) < 1e-2, name


def test_encoding_on_cuda_matches_cpu_fp32_and_auto_moves_the_model(tiny_bert):
    from multipos.model.encoder import DualEncoder

    texts = [f"statin {'cholesterol ' * (i % 7)} heart {i}" for i in range(50)]
    cpu_model = DualEncoder(str(tiny_bert), pooling="mean", normalize=True)
    ref = encode(cpu_model, texts, device="cpu", bf16=False, progress=False)
    model = DualEncoder(str(tiny_bert), pooling="mean", normalize=True)
    got = encode(model, texts, bf16=True, progress=False)          # device="auto"
    assert next(model.parameters()).device.type == "cuda"
    cos = (torch.from_numpy(ref) * torch.from_numpy(got)).sum(-1)
    assert float(cos.min()) > 0.99
    fp32 = encode(model, texts, bf16=False, progress=False)
    assert float((torch.from_numpy(fp32) - torch.from_numpy(ref)).abs().max()) < 1e-4


@pytest.mark.parametrize("chunk_size", [2, 12])
def test_grad_cache_on_cuda_equals_plain_backprop_with_dropout(tiny_bert, chunk_size):
    model = tiny_encoder(tiny_bert, dropout=0.1).to(CUDA)
    for name in sorted(OBJECTIVES):
        module = RetrieverModule(model, ContrastiveLoss(name))
        batch = make_batch(model, make_groups(1 if name in SINGLE_POSITIVE else 2, false_negative=True)).to(CUDA)
        grads = {}
        for kind in ("plain", "grad_cache"):
            torch.manual_seed(7)
            model.zero_grad(set_to_none=True)
            if kind == "plain":
                q = torch.cat([model.encode_queries(c) for c in chunks(batch.query, chunk_size)])
                p = torch.cat([model.encode_passages(c) for c in chunks(batch.passages, chunk_size)])
                module.batch_loss(q, p, batch)[0].backward()
            else:
                grad_cache_step([(model.encode_queries, batch.query), (model.encode_passages, batch.passages)],
                                lambda q, p: module.batch_loss(q, p, batch), chunk_size)
            grads[kind] = {n: t.grad.clone() for n, t in model.named_parameters() if t.grad is not None}
        diff = max(float((grads["plain"][n] - grads["grad_cache"][n]).abs().max()) for n in grads["plain"])
        assert diff < 1e-4, (name, diff)


@pytest.mark.parametrize("name", ["jointlh", "lsepair", "summarglh", "lsepair_maxn", "singlelh"])
def test_full_corpus_reduction_on_cuda_with_a_bf16_index(name):
    gen = torch.Generator().manual_seed(1)
    n, b = 5000, 6
    index = F.normalize(torch.randn(n, 48, generator=gen), dim=-1).to(torch.bfloat16).to(CUDA)
    row = {f"d{i}": i for i in range(n)}
    k = 1 if name in SINGLE_POSITIVE else 3
    positives = [[f"d{(i * 97 + j * 13) % n}" for j in range(k)] for i in range(b)]
    judged = [set(p) | {f"d{(i * 31 + 7) % n}"} for i, p in enumerate(positives)]
    targets = corpus_targets(positives, judged, row).to(CUDA)
    q0 = F.normalize(torch.randn(b, 48, generator=gen), dim=-1).to(CUDA)
    summary = "max" if name in ("lsepair_maxn",) else "lse"
    q = q0.clone().requires_grad_()
    # the hardest negative under bf16 rounding may differ between two exact computations (near ties): fp32 for "max"
    autocast = dict(device_type="cuda", dtype=torch.bfloat16, enabled=summary == "lse")
    with torch.autocast(**autocast):
        s, pos, neg = corpus_scores(q, index, 0.05, targets, chunk_size=777, summary=summary)
        loss = compute(name, s, pos, neg).sum()
    loss.backward()
    q_ref = q0.clone().requires_grad_()
    with torch.autocast(**autocast):  # the same autocast as bf16-mixed training
        s_ref, pos_ref, neg_ref = full_corpus_scores(q_ref, index, 0.05, targets)
        ref = compute(name, s_ref, pos_ref, neg_ref).sum()
    ref.backward()
    assert abs(float(loss) - float(ref)) < 1e-2 * max(1.0, abs(float(ref))), name
    assert float((q.grad - q_ref.grad).abs().max()) < 2e-2 * float(q_ref.grad.abs().max()), name


@pytest.mark.parametrize("name", ["jointlh", "lsepair", "lsepair_maxn"])
def test_the_split_product_on_a_bf16_index_equals_the_cast_one(name):
    """#68: the chunk loop's ``product="split"`` (bf16 halves of the queries, float32 output, the index never cast)
    gives the loss and gradients of ``cast`` within 1e-3 relative."""
    from multipos.training.corpus_candidates import split_product, split_product_applies

    gen = torch.Generator().manual_seed(2)
    n, b = 20000, 8
    index = F.normalize(torch.randn(n, 64, generator=gen), dim=-1).to(torch.bfloat16).to(CUDA)
    assert split_product_applies(torch.zeros(1, 64, device=CUDA), index.T)
    targets = corpus_targets([[f"d{i * 7 + j}" for j in range(3)] for i in range(b)], [set() for _ in range(b)],
                             {f"d{i}": i for i in range(n)}).to(CUDA)
    q0 = F.normalize(torch.randn(b, 64, generator=gen), dim=-1).to(CUDA)
    summary = "max" if name == "lsepair_maxn" else "lse"
    out = {}
    for product in ("cast", "split"):
        q = q0.clone().requires_grad_()
        s, pos, neg = corpus_scores(q, index, 0.05, targets, chunk_size=4096, summary=summary, product=product)
        loss = compute(name, s, pos, neg).sum()
        out[product] = (float(loss), torch.autograd.grad(loss, q)[0])
    (ref, ref_grad), (loss, grad) = out["cast"], out["split"]
    assert abs(loss - ref) <= 1e-3 * abs(ref), name
    assert float((grad - ref_grad).abs().max()) <= 1e-3 * float(ref_grad.abs().max()), name
    a = torch.randn(16, 64, device=CUDA)
    torch.testing.assert_close(split_product(a, index.T), a @ index.T.float(), rtol=1e-3, atol=1e-3)


@pytest.mark.parametrize("extra", [
    ("data.source.negatives=dense", "loss=lsepair"),
    ("passages=frozen_index", "passages.candidates=corpus", "loss=jointlh", "module.grad_cache_chunk_size=1"),
], ids=["two_tower_dense_negatives", "query_side_corpus_grad_cache"])
def test_train_job_on_cuda_in_bf16(tiny_beir, tiny_bert, tmp_path, monkeypatch, caplog, extra):
    import logging

    monkeypatch.setenv("MULTIPOS_CACHE", str(tmp_path / "cache"))
    out = tmp_path / "run"
    overrides = [o for o in tiny_overrides(tiny_beir, tiny_bert, out) if not o.startswith("trainer")]
    overrides += ["trainer=gpu", "trainer.max_epochs=2", "trainer.enable_progress_bar=false", "eval.bf16=true", *extra]
    with caplog.at_level(logging.INFO):
        metrics = train(compose_cfg("train", overrides))
    assert "GPU available: True (cuda), used: True" in caplog.text
    values = [v for split in metrics.values() if isinstance(split, dict) for v in split.values()
              if isinstance(v, float)]
    assert values and all(v == v for v in values)
    assert not json.loads((out / "run_info.json").read_text())["device"].startswith("CPU")


@pytest.mark.parametrize("extra", [
    ("loss=jointlh",),
    ("passages=frozen_index", "passages.candidates=corpus", "passages.chunk_size=7", "loss=lsepair_maxn"),
], ids=["two_tower", "query_side_corpus_max"])
def test_training_steps_make_the_host_wait_for_the_gpu_nowhere_in_multipos(tiny_beir, tiny_bert, tmp_path, monkeypatch,
                                                                          extra):
    """``torch.cuda.set_sync_debug_mode("warn")`` around every batch transfer and every training step of a bf16 job:
    no synchronising CUDA call from a multipos source file (a value read back, a copy from pageable memory), except
    the first step's check of the loss masks' rows (tests/test_host_sync.py does the same on the CPU for reads)."""
    import warnings
    from pathlib import Path

    import multipos
    from multipos.data.datamodule import MultiPosDataModule

    package = str(Path(multipos.__file__).resolve().parent)
    calls: dict[str, list[list[str]]] = {"transfer": [], "step": []}

    def watched(kind, fn):
        def call(self, *args):
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                torch.cuda.set_sync_debug_mode("warn")
                try:
                    out = fn(self, *args)
                finally:
                    torch.cuda.set_sync_debug_mode("default")
            calls[kind].append([f"{Path(w.filename).name}:{w.lineno}" for w in caught
                                if str(Path(w.filename).resolve()).startswith(package)
                                and "synchroniz" in str(w.message)])
            return out
        return call

    monkeypatch.setenv("MULTIPOS_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(MultiPosDataModule, "transfer_batch_to_device",
                        watched("transfer", MultiPosDataModule.transfer_batch_to_device))
    monkeypatch.setattr(RetrieverModule, "training_step", watched("step", RetrieverModule.training_step))
    overrides = [o for o in tiny_overrides(tiny_beir, tiny_bert, tmp_path / "run") if not o.startswith("trainer")]
    train(compose_cfg("train", [*overrides, "trainer=gpu", "trainer.max_epochs=2", "trainer.enable_progress_bar=false",
                                "eval.bf16=true", *extra]))
    assert len(calls["step"]) >= 4 and len(calls["transfer"]) >= 4
    assert calls["step"][0]  # the first step checks the loss masks' rows: a synchronising read, and it is seen
    assert [c for c in calls["transfer"] if c] == [] and [c for c in calls["step"][1:] if c] == []


def test_between_logging_steps_the_whole_loop_makes_the_host_wait_nowhere(tiny_beir, tiny_bert, tmp_path, monkeypatch):
    """``torch.cuda.set_sync_debug_mode("warn")`` over a whole ``trainer=gpu`` ``fit``, progress bar on
    (:func:`multipos.training.fit.progress_bar`), logging every 1000 steps: no synchronising CUDA call from Lightning's
    or
    multipos's code in a step that is neither the first (the loss masks' row check) nor an epoch's last (dev
    retrieval, checkpoints, the bar's epoch summary). Before 2026-11-26 every step read ``train/loss`` back
    (``prog_bar=True``: Lightning converts it at every step). tests/test_host_sync.py does the same on the CPU."""
    import warnings
    from pathlib import Path

    import lightning
    import lightning_utilities

    import multipos
    from tests.test_host_sync import StepTag

    roots = tuple(str(Path(m.__file__).resolve().parent) for m in (multipos, lightning, lightning_utilities))
    caught: list[tuple[str, str, int]] = []  # (message, file, line) of each warning
    tag = StepTag(caught)

    real_fit = lightning.Trainer.fit

    def fit(self, *args, **kwargs):  # each warning recorded as it is raised, so the step tags count them
        self.callbacks.insert(0, tag)
        real_showwarning = warnings.showwarning
        with warnings.catch_warnings():
            warnings.simplefilter("always")
            warnings.showwarning = lambda message, category, filename, lineno, *a, **k: caught.append(
                (str(message), filename, lineno))
            torch.cuda.set_sync_debug_mode("warn")
            try:
                return real_fit(self, *args, **kwargs)
            finally:
                torch.cuda.set_sync_debug_mode("default")
                warnings.showwarning = real_showwarning

    monkeypatch.setenv("MULTIPOS_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(lightning.Trainer, "fit", fit)
    overrides = [o for o in tiny_overrides(tiny_beir, tiny_bert, tmp_path / "run") if not o.startswith("trainer")]
    train(compose_cfg("train", [*overrides, "trainer=gpu", "trainer.max_epochs=2", "trainer.enable_progress_bar=true",
                                "trainer.log_every_n_steps=1000", "data.batch_size=1", "eval.bf16=true"]))
    waits = [(batch_idx, [f"{Path(f).name}:{line}" for message, f, line in warned
                          if "synchroniz" in message and str(Path(f).resolve()).startswith(roots)])
             for (_, batch_idx, last), warned in tag.steps() if not last]
    assert len(tag.tags) >= 8 and len(waits) >= 6
    assert [(i, w) for i, w in waits[1:] if w] == []


def test_a_loader_with_pin_memory_yields_pinned_batches_that_move_to_the_gpu_unchanged(tiny_beir, tiny_bert):
    """``MultiPosDataModule.pin_memory`` (timed by bench/bench_speed.py): with a worker, the loader's pin-memory
    thread yields batches whose tensors are page-locked, and :meth:`Batch.to` copies them as they are."""
    from multipos.data import MultiPosDataModule
    from multipos.data.sources import BeirGradedSource

    dm = MultiPosDataModule(BeirGradedSource(str(tiny_beir), "qrels-graded/train.s-3.qrel", negative_depth=20),
                            str(tiny_bert), regime="heterogeneous", group_size=4, max_positives=2, batch_size=2,
                            num_workers=1)
    dm.set_stage("heterogeneous", None)
    dm.setup()
    dm.pin_memory = True
    batches = list(dm.train_dataloader())
    assert batches
    for batch in batches:
        tensors = [*batch.query.values(), *batch.passages.values(), batch.positive_mask, batch.negative_mask]
        assert all(t.is_pinned() for t in tensors)
        moved = batch.to(CUDA)
        assert moved.positive_mask.is_cuda and torch.equal(moved.passages["input_ids"].cpu(),
                                                           batch.passages["input_ids"])


def test_pinned_stages_each_dtype_in_page_locked_memory_and_to_device_copies_it_exactly():
    """:func:`multipos.model.transfer.pinned` (NumPy's copy for the dtypes NumPy holds, ``Tensor.pin_memory`` for
    bfloat16)
    and :func:`multipos.model.transfer.to_device` on a real pinned allocator."""
    from multipos.model.transfer import pinned, to_device

    for t in (torch.arange(24).reshape(4, 6), torch.arange(24).reshape(4, 6).T, torch.rand(3, 4) > 0.5,
              torch.randn(3, 4).to(torch.bfloat16), torch.arange(12, dtype=torch.int32)[::3]):
        p = pinned(t)
        assert p.is_pinned() and p.dtype == t.dtype and torch.equal(p, t)
        assert pinned(p) is p
        moved = to_device(t, CUDA)
        assert moved.is_cuda and torch.equal(moved.cpu(), t)
