"""``hydra/launcher=slurm`` (conf/hydra/launcher/slurm.yaml): a job's time limit, signal and requeueing come from the
scale (``scale.slurm``, conf/scale/paper.yaml), Lightning's own SLURM requeueing is off, and a job that submitit
requeues resumes into the metrics of an uninterrupted one."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import lightning as L
import pytest
from omegaconf import OmegaConf, open_dict

from multipos.runs.spec import run_key
from tests.helpers import REPO, compose_cfg, tiny_overrides

SLURM_TARGET = "hydra_plugins.hydra_submitit_launcher.submitit_launcher.SlurmLauncher"


def test_paper_scale_jobs_get_the_scales_time_limit_and_requeueing():
    for scale in ("paper", "paper_query_side"):
        cfg = compose_cfg("train", ["experiment=base", f"scale={scale}", "hydra/launcher=slurm"],
                          return_hydra_config=True)
        launcher, slurm = cfg.hydra.launcher, cfg.scale.slurm
        assert launcher._target_ == SLURM_TARGET
        assert launcher.timeout_min == slurm.timeout_min == 180  # not Hydra's 60
        assert launcher.signal_delay_s == slurm.signal_delay_s
        assert launcher.max_num_timeout == slurm.max_num_timeout >= 1
        assert (launcher.nodes, launcher.tasks_per_node, launcher.gpus_per_node) == (1, 1, 1)
        assert launcher.cpus_per_task == slurm.cpus_per_task
        assert cfg.callbacks.model_checkpoint.every_n_train_steps == 1000  # what a requeued job resumes from
    ddp = compose_cfg("train", ["experiment=base", "scale=paper", "hydra/launcher=slurm", "trainer=ddp",
                                "trainer.devices=4", "trainer.num_nodes=2", "data.batch_size=16"],
                      return_hydra_config=True)
    assert (ddp.hydra.launcher.nodes, ddp.hydra.launcher.tasks_per_node, ddp.hydra.launcher.gpus_per_node) == (2, 4, 4)
    ev = compose_cfg("evaluate", ["experiment=table3_ood", "scale=paper", "hydra/launcher=slurm"],
                     return_hydra_config=True)  # evaluate.py: no trainer node
    assert (ev.hydra.launcher.timeout_min, ev.hydra.launcher.tasks_per_node, ev.hydra.launcher.gpus_per_node) == (
        180, 1, 1)


def test_the_time_limit_covers_a_run_at_the_measured_step_times():
    """``scale.slurm.timeout_min`` leaves twice the hours of one run: the epochs at the measured hours an epoch
    (the slower of two-tower and query-side) plus the 0.5 h its comment estimates for encoding the collection."""
    bench = json.loads((REPO / "bench/results/gpu/2026-11-25-h100-paper_scale.jsonl").read_text().splitlines()[-1])
    epoch_h = max(bench["two_tower"]["hours_per_msmarco_epoch_400k"],
                  bench["query_side_corpus"]["hours_per_msmarco_epoch_400k"])
    cfg = compose_cfg("train", ["experiment=base", "scale=paper"])
    run_h = cfg.trainer.max_epochs * epoch_h + 0.5
    assert 2 * run_h * 60 <= cfg.scale.slurm.timeout_min < 3 * run_h * 60


def test_cpu_scale_is_unaffected():
    """The CPU scale has no cluster recipe: its default launcher is still joblib, and with hydra/launcher=slurm it
    gets Hydra's defaults. Neither the launcher nor the scale's SLURM settings change any run's key."""
    plain = compose_cfg("train", ["experiment=table2_homogeneous"], return_hydra_config=True)
    assert "JoblibLauncher" in plain.hydra.launcher._target_ and "slurm" not in plain.scale
    assert plain.callbacks.model_checkpoint.every_n_train_steps is None
    slurm = compose_cfg("train", ["experiment=table2_homogeneous", "hydra/launcher=slurm"], return_hydra_config=True)
    launcher = slurm.hydra.launcher
    assert (launcher.timeout_min, launcher.signal_delay_s, launcher.max_num_timeout) == (60, 120, 0)
    assert launcher.gpus_per_node is None and launcher.tasks_per_node == 1
    assert run_key(plain) == run_key(slurm)
    paper = compose_cfg("train", ["experiment=table2_homogeneous", "scale=paper"])
    key = run_key(paper)
    with open_dict(paper):
        del paper.scale["slurm"]
        paper.callbacks.model_checkpoint.every_n_train_steps = None
    assert run_key(paper) == key


def test_lightning_leaves_the_requeueing_to_the_launcher(tmp_path, monkeypatch):
    """Inside a SLURM job the Trainer's cluster environment is SLURM's with ``auto_requeue`` off (no second requeue,
    no ``hpc_ckpt_<n>.ckpt`` outside the stage folders); outside one, Lightning's own choice."""
    from lightning.pytorch.plugins.environments import SLURMEnvironment

    from multipos.training.fit import FitPlan, build_trainer

    trainer_cfg = OmegaConf.create({"_target_": "lightning.Trainer", "accelerator": "cpu", "devices": 1,
                                    "enable_progress_bar": False})
    plan = FitPlan(out=tmp_path, trainer=trainer_cfg, callbacks=None, logger=None, loss=OmegaConf.create({}),
                   module=OmegaConf.create({}))
    for key in ("SLURM_NTASKS", "SLURM_JOB_NAME"):
        monkeypatch.delenv(key, raising=False)
    assert not isinstance(build_trainer(plan, 1, [])._accelerator_connector.cluster_environment, SLURMEnvironment)
    for key, value in {"SLURM_NTASKS": "1", "SLURM_JOB_NAME": "train", "SLURM_JOB_ID": "7", "SLURM_PROCID": "0",
                       "SLURM_LOCALID": "0", "SLURM_NODEID": "0", "SLURM_NODELIST": "node1"}.items():
        monkeypatch.setenv(key, value)
    env = build_trainer(plan, 1, [])._accelerator_connector.cluster_environment
    assert isinstance(env, SLURMEnvironment) and env.auto_requeue is False


class SignalAtStep(L.Callback):
    """Sends SIGUSR2 to its own process at the end of training step ``step`` (None: never), once per run folder (a
    marker file in it): the signal SLURM sends a submitit job ``signal_delay_s`` before its time limit, and on
    preemption."""

    def __init__(self, step: int | None = None):
        self.step = step

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        marker = os.path.join(trainer.default_root_dir, "signalled")
        if self.step is not None and trainer.global_step == self.step and not os.path.exists(marker):
            open(marker, "w").close()
            os.kill(os.getpid(), signal.SIGUSR2)


@pytest.mark.slow  # about 75 s on 2 cores: three job processes start (torch, Lightning, FAISS), two side by side
def test_a_requeued_job_resumes_to_the_metrics_of_an_uninterrupted_one(tiny_beir, tiny_bert, tmp_path):
    """Two cells of one sweep through ``hydra/launcher=submitit_local`` (submitit's local executor: the job process,
    signal handling and requeueing of the SLURM executor, without sbatch), identical but for when a SIGUSR2 comes:
    never, or at the end of step 4 of 4 (epoch 2's last batch, before its checkpoint is written). submitit's
    handler takes the signal as a preemption, pickles the launcher's ``checkpoint()`` (the same cell again) and
    exits the job for requeueing; the executor starts it again, and the run resumes from its newest checkpoint
    (step 3, mid-epoch). Not covered: sbatch, ``scontrol requeue`` and the time-out count (a signal near the time
    limit takes the same path with one requeue fewer left)."""
    sweep = tmp_path / "sweep"
    overrides = [o for o in tiny_overrides(tiny_beir, tiny_bert, tmp_path)
                 if not o.startswith(("paths.output_dir=", "trainer.max_epochs="))]
    env = {**os.environ, "MULTIPOS_CACHE": str(tmp_path / "cache"), "HF_HUB_OFFLINE": "1",
           "OMP_NUM_THREADS": "1"}  # one thread: identical float reductions in every process
    p = subprocess.run([sys.executable, "train.py", "-m", *overrides, "eval.references=false", "trainer.max_epochs=2",
                        "callbacks.model_checkpoint.every_n_train_steps=1", "hydra/launcher=submitit_local",
                        f"hydra.sweep.dir={sweep}", f"+callbacks.signal._target_={__name__}.SignalAtStep",
                        "+callbacks.signal.step=null,4"], cwd=REPO, env=env, capture_output=True, text=True,
                       timeout=600)
    logs = "".join(f.read_text() for f in sweep.rglob(".submitit/*/*_log.*"))
    assert p.returncode == 0, (p.stdout + p.stderr + logs)[-4000:]
    cells = {json.loads((f.parent / "run_info.json").read_text())["resumed"]: f.parent
             for f in sweep.rglob("metrics.json")}
    assert set(cells) == {False, True}, sorted(cells)
    whole, requeued = cells[False], cells[True]
    assert (requeued / "signalled").is_file() and not (whole / "signalled").exists()
    assert "this job is preempted" in logs and "Requeued job" in logs
    info = json.loads((requeued / "run_info.json").read_text())
    assert info["status"] == "complete" and info["resumed_from"][0].endswith("step=3.ckpt")
    assert json.loads((requeued / "metrics.json").read_text()) == json.loads((whole / "metrics.json").read_text())
    assert ((requeued / "model" / "model.safetensors").read_bytes()
            == (whole / "model" / "model.safetensors").read_bytes())
