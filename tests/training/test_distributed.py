"""Data-parallel training with cross-device negatives (multipos.training.distributed, trainer=ddp).

* masks over the global batch equal the rows of one process's masks on the concatenated batch, false negatives
  masked by passage id across ranks;
* two gloo processes: loss and every parameter gradient (DDP-averaged) equal one process on the union batch, for
  every objective, with and without false negatives across ranks (also with GradCache:
  tests/training/test_grad_cache.py);
* ``python train.py trainer=ddp trainer.accelerator=cpu trainer.devices=2`` trains, validates and writes one set of
  outputs;
* ``hydra/launcher=submitit_slurm`` composes for cluster sweeps.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from multipos.data.groups import Group, group_masks
from multipos.losses import OBJECTIVES, SINGLE_POSITIVE
from tests.helpers import REPO, compose_cfg, tiny_overrides

TOL = 1e-5
WORDS = "cholesterol statin artery heart tumor breast cancer diet fiber sleep melatonin calcium bone".split()


def make_groups(n_positives: int, false_negative: bool) -> list[Group]:
    """Four queries of G = 3 passages (two per rank with two ranks). With ``false_negative``, rank 1's groups hold a
    passage judged relevant to query 0 (rank 0) as a hard negative, and one judged for query 2 sits on rank 0."""
    groups = []
    for i in range(4):
        pids = [f"p{i}-{k}" for k in range(3)]
        judged = set(pids[:n_positives]) | {f"judged-only-{i}"}
        groups.append(Group(f"q{i}", f"{WORDS[i]} {WORDS[i + 4]}", pids, n_positives, judged))
    if false_negative:
        groups[0].judged.add("p3-2")        # rank 1's hard negative is relevant to query 0 (rank 0)
        groups[2].judged.add("p1-2")        # and rank 0's hard negative to query 2 (rank 1)
    return groups


def passage_text(pid: str) -> str:
    """Text of passage ``p<i>-<k>``: varied lengths (each rank pads differently from the union batch), and with the
    tiny BERT no two scores a max / min objective compares are within 5e-3 of each other (at a tie the subgradient
    of max/min follows float noise, so two exact computations may pick different passages)."""
    i, k = (int(x) for x in pid[1:].split("-"))
    return " ".join(WORDS[(i * 4 + k * 5 + j * 3) % len(WORDS)] for j in range(4 + (i + k) % 4))


def make_batch(model, groups: list[Group]):
    """A :class:`multipos.data.collate.Batch` of ``groups`` tokenised by ``model``."""
    from multipos.data.collate import Batch

    positive_mask, negative_mask = group_masks(groups)
    pids = [p for g in groups for p in g.passage_ids]
    return Batch(dict(model.tokenize([g.query for g in groups], "query")),
                 dict(model.tokenize([passage_text(p) for p in pids])),
                 positive_mask, negative_mask, [g.query_id for g in groups], pids, list(groups))


def tiny_encoder(tiny_bert: Path, dropout: float = 0.0):
    """The tiny BERT as a dual encoder. Mean pooling: its random CLS states are nearly the same for every input (score
    spread ≈ 0), which leaves gradients made of cancelling terms; mean-pooled scores spread (std ≈ 0.16 at τ = 4)
    and float32 gradients are within ≈ 2e-6 of float64 ones, below the 1e-5 tolerance."""
    from multipos.model.encoder import DualEncoder

    return DualEncoder(str(tiny_bert), pooling="mean", normalize=False, temperature=4.0,
                       hidden_dropout=dropout, attention_dropout=dropout)


def cases():
    """(objective, false negatives across ranks) for every objective."""
    return [(name, fn) for name in OBJECTIVES for fn in (False, True)]


def rank_gradients(model, name: str, batch, chunk_size: int | None) -> tuple[torch.Tensor, dict]:
    """This process's loss and parameter gradients for ``batch`` (plain, or GradCache with ``chunk_size``)."""
    from multipos.losses import ContrastiveLoss
    from multipos.training.grad_cache import grad_cache_step
    from multipos.training.module import RetrieverModule

    module = RetrieverModule(model, ContrastiveLoss(name))
    model.zero_grad(set_to_none=True)
    if chunk_size is None:
        loss, _ = module.batch_loss(model.encode_queries(batch.query), model.encode_passages(batch.passages), batch)
        loss.backward()
    else:
        loss, _ = grad_cache_step([(model.encode_queries, batch.query), (model.encode_passages, batch.passages)],
                                  lambda q, p: module.batch_loss(q, p, batch), chunk_size)
    grads = {n: (p.grad.clone() if p.grad is not None else torch.zeros_like(p)) for n, p in model.named_parameters()}
    return loss.detach(), grads


def gloo_worker(rank: int, world_size: int, port: int, tiny_bert: str, out: str, chunk_size: int | None) -> None:
    """Rank ``rank`` of a gloo group: the DDP-averaged gradient of its half of every case's union batch; then rank 0
    computes each union batch in one process and writes the largest differences to ``out``."""
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world_size)
    model = tiny_encoder(Path(tiny_bert))
    ddp = {}
    for name, fn in cases():
        groups = make_groups(1 if name in SINGLE_POSITIVE else 2, fn)
        local = groups[2 * rank: 2 * rank + 2]
        loss, grads = rank_gradients(model, name, make_batch(model, local), chunk_size)
        dist.all_reduce(loss)                      # logged loss: mean over ranks
        for g in grads.values():                   # what DistributedDataParallel does to every gradient
            dist.all_reduce(g)
            g /= world_size
        ddp[(name, fn)] = (loss / world_size, grads)
    dist.destroy_process_group()
    if rank != 0:
        return
    report = {}
    for (name, fn), (loss, grads) in ddp.items():   # one process (world size 1) on the union batch
        groups = make_groups(1 if name in SINGLE_POSITIVE else 2, fn)
        ref_loss, ref_grads = rank_gradients(model, name, make_batch(model, groups), None)
        report[f"{name}/fn={fn}"] = {
            "loss": float((loss - ref_loss).abs()),
            "grad": max(float((grads[n] - ref_grads[n]).abs().max()) for n in ref_grads),
            "grad_scale": max(float(g.abs().max()) for g in ref_grads.values()),
            "params": len(ref_grads)}
    Path(out).write_text(json.dumps(report, indent=1))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_gloo(tiny_bert: Path, out: Path, chunk_size: int | None) -> dict:
    """Start two gloo processes running :func:`gloo_worker` → rank 0's report {case: max abs differences}.

    ``fork``: the workers inherit the torch and transformers modules this process has imported; ``spawn`` would
    import them again in each worker (≈ 13 s per process on the 2-core test machine, against ≈ 1.5 s of work).
    ``spawn`` where this process has used CUDA (``MULTIPOS_TEST_ACCELERATOR=gpu``): autograd's CUDA threads do not
    survive a fork ("Unable to handle autograd's threading in combination with fork-based multiprocessing", H100,
    2026-11-25).
    """
    import torch.multiprocessing as mp

    method = "spawn" if torch.cuda.is_initialized() else "fork"
    mp.start_processes(gloo_worker, args=(2, free_port(), str(tiny_bert), str(out), chunk_size), nprocs=2, join=True,
                       start_method=method)
    return json.loads(out.read_text())


# --------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("false_negative", [False, True])
def test_global_masks_are_rows_of_the_union_masks(false_negative):
    groups = make_groups(2, false_negative)
    union_pos, union_neg = group_masks(groups)
    columns = [p for g in groups for p in g.passage_ids]
    for rank in range(2):
        local = groups[2 * rank: 2 * rank + 2]
        pos, neg = group_masks(local, columns, offset=6 * rank)
        assert (torch.equal(pos, union_pos[2 * rank: 2 * rank + 2])
                and torch.equal(neg, union_neg[2 * rank: 2 * rank + 2]))
    # one process is the special case: the local columns at offset 0
    pos, neg = group_masks(groups[:2], [p for g in groups[:2] for p in g.passage_ids], offset=0)
    assert torch.equal(pos, group_masks(groups[:2])[0]) and torch.equal(neg, group_masks(groups[:2])[1])
    # the cross-rank false negatives are neither positive nor negative for their query; plain negatives stay
    assert bool(union_neg[0, columns.index("p3-2")]) is not false_negative
    assert bool(union_neg[2, columns.index("p1-2")]) is not false_negative
    assert union_neg[0, columns.index("p3-1")] and not union_pos[0, columns.index("p3-2")]


def test_group_masks_rejects_columns_without_the_groups():
    groups = make_groups(2, False)
    with pytest.raises(ValueError, match="columns"):
        group_masks(groups[:2], [p for g in groups for p in g.passage_ids], offset=3)


def test_two_gloo_processes_equal_one_process_on_the_union_batch(tiny_bert, tmp_path):
    report = run_gloo(tiny_bert, tmp_path / "report.json", chunk_size=None)
    assert set(report) == {f"{n}/fn={fn}" for n, fn in cases()}
    for case, diff in report.items():
        assert diff["params"] > 10 and diff["grad_scale"] > 1e-4, case  # gradients exist and are not all zero
        assert diff["loss"] < TOL and diff["grad"] < TOL, (case, diff)
    print("max |loss diff|", max(d["loss"] for d in report.values()),
          "max |grad diff|", max(d["grad"] for d in report.values()))


def test_two_tower_batches_need_their_groups_only_across_processes(tiny_bert):
    """:meth:`RetrieverModule.needs_batch_groups`: one process masks with the batch's own masks (no groups); several
    need every query's judged passages for the global masks. (``candidates=corpus`` needs them in one process too:
    the query-side jobs of tests/training/test_query_side.py and tests/test_host_sync.py train with them.)"""
    from types import SimpleNamespace

    from multipos.losses import ContrastiveLoss
    from multipos.training.module import RetrieverModule

    module = RetrieverModule(tiny_encoder(tiny_bert), ContrastiveLoss("lsepair"))
    assert module.needs_batch_groups() is False  # no trainer: one process
    for world_size, needed in ((1, False), (2, True)):
        module._trainer = SimpleNamespace(world_size=world_size)
        assert module.needs_batch_groups() is needed


def test_one_process_layout_needs_no_process_group():
    from multipos.training.distributed import batch_layout, gather_with_grad, world

    assert world() == (0, 1)
    layout = batch_layout(2, None, 6)
    assert layout.loss_scale == 1.0 and layout.offset == 0 and layout.passage_counts == (6,)
    x = torch.ones(6, 3)
    assert gather_with_grad(x, layout.passage_counts) is x
    with pytest.raises(ValueError, match="rows"):
        gather_with_grad(torch.ones(5, 3), layout.passage_counts)


@pytest.mark.parametrize("extra", [[], pytest.param(["module.grad_cache_chunk_size=2"], marks=pytest.mark.slow)],
                         ids=["plain", "grad_cache"])
def test_train_py_ddp_two_cpu_processes_writes_one_set_of_outputs(tiny_beir, tiny_bert, tmp_path, extra):
    out = tmp_path / "run"
    overrides = [o for o in tiny_overrides(tiny_beir, tiny_bert, out)  # gloo on CPU
                 if not o.startswith(("paths.output_dir", "trainer.accelerator", "trainer.deterministic"))]
    cmd = [sys.executable, "train.py", "experiment=base", f"hydra.run.dir={out}", "trainer=ddp",
           "trainer.accelerator=cpu",
           "trainer.devices=2", "eval.references=false", *overrides, *extra]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "PYTHONUNBUFFERED": "1"}
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, log[-4000:]
    assert "MEMBER: 2/2" in log  # Lightning initialised a two-process group
    metrics = json.loads((out / "metrics.json").read_text())
    assert set(metrics) == {"tiny_dev", "tiny_test"}
    info = json.loads((out / "run_info.json").read_text())
    assert info["status"] == "complete"
    # one set of outputs: one model, one run file per set, one CSV log, one Hydra config, nothing half-written
    names = sorted(p.name for p in out.iterdir())
    assert not [n for n in names if ".tmp-" in n], names
    assert sorted(n for n in names if n.startswith("run.")) == ["run.tiny_dev.trec", "run.tiny_test.trec"]
    hydra_configs = [p.relative_to(out).as_posix() for p in out.rglob("config.yaml") if p.parent.name != "model"]
    assert len(list((out / "csv").rglob("metrics.csv"))) == 1
    assert sorted(hydra_configs) == [".hydra.accepted/config.yaml", ".hydra/config.yaml"]  # rank 0's, and its kept copy
    assert (out / "model" / "config.json").is_file() and len(list(out.rglob("model.safetensors"))) == 1
    assert (out / "checkpoints" / "stage1" / "last.ckpt").is_file()
    text = (out / "csv").rglob("metrics.csv").__next__().read_text()
    assert "train/loss" in text and "val/ndcg@10" in text


def test_submitit_slurm_launcher_composes_for_sweeps():
    cfg = compose_cfg("train", ["experiment=base", "hydra/launcher=submitit_slurm", "trainer=ddp", "trainer.devices=4",
                                "trainer.num_nodes=2", "hydra.launcher.nodes=2", "hydra.launcher.tasks_per_node=4",
                                "hydra.launcher.gpus_per_node=4"],
                      return_hydra_config=True)
    launcher = cfg.hydra.launcher
    assert launcher._target_ == "hydra_plugins.hydra_submitit_launcher.submitit_launcher.SlurmLauncher"
    assert launcher.nodes == cfg.trainer.num_nodes and launcher.tasks_per_node == cfg.trainer.devices
    assert cfg.trainer.strategy._target_ == "lightning.pytorch.strategies.DDPStrategy"


def test_ddp_in_a_local_multirun_is_refused_unless_the_cluster_starts_the_processes(monkeypatch):
    from hydra.core.hydra_config import HydraConfig

    from multipos.training.distributed import check_launch

    for key in ("SLURM_NTASKS", "RANK", "LOCAL_RANK"):
        monkeypatch.delenv(key, raising=False)
    cfg = compose_cfg("train", ["experiment=base", "hydra.mode=MULTIRUN", "trainer=ddp"], return_hydra_config=True)
    HydraConfig.instance().set_config(cfg)
    try:
        check_launch(1)  # one process: nothing to launch
        with pytest.raises(ValueError, match="submitit_slurm"):
            check_launch(2)
        monkeypatch.setenv("SLURM_NTASKS", "2")  # SLURM (submitit) starts one task per device
        check_launch(2)
    finally:
        HydraConfig.instance().cfg = None


@pytest.mark.parametrize("candidates", ["group", "corpus"])
def test_train_py_ddp_query_side_two_cpu_processes(tiny_beir, tiny_bert, tmp_path, candidates):
    """Query-side fine-tuning under DDP: each rank holds the frozen index, one untied model comes out, E_d unchanged."""
    from transformers import AutoModel

    out = tmp_path / "run"
    overrides = [o for o in tiny_overrides(tiny_beir, tiny_bert, out)  # gloo on CPU
                 if not o.startswith(("paths.output_dir", "trainer.accelerator", "trainer.deterministic"))]
    cmd = [sys.executable, "train.py", "experiment=base", f"hydra.run.dir={out}", "trainer=ddp",
           "trainer.accelerator=cpu",
           "trainer.devices=2", "eval.references=false", "passages=frozen_index", f"passages.candidates={candidates}",
           "loss=jointlh", *overrides]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "PYTHONUNBUFFERED": "1"}
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, log[-4000:]
    assert "MEMBER: 2/2" in log
    assert json.loads((out / "run_info.json").read_text())["status"] == "complete"
    assert len(list(out.rglob("model.safetensors"))) == 2  # query_encoder/ and passage_encoder/
    start = AutoModel.from_pretrained(tiny_bert).state_dict()
    passage = AutoModel.from_pretrained(out / "model" / "passage_encoder").state_dict()
    assert all(torch.equal(passage[k], start[k]) for k in start)
