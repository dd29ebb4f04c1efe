"""Test helpers: compose the project's Hydra configs without running a Hydra app."""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path
from types import ModuleType

from hydra import compose, initialize_config_dir

from multipos.config_resolvers import register_eval_sets, register_resolvers

REPO = Path(__file__).resolve().parents[1]
CONF = str(Path(__file__).resolve().parents[1] / "conf")
#: The words of the tiny fixtures' texts, by topic (tests/conftest.py; tests/paper_miniature.py): the tiny BERT's
#: vocabulary covers them.
TOPICS = {
    "heart": "cholesterol statin artery heart blood pressure cardiac",
    "cancer": "tumor breast cancer cells chemotherapy oncology",
    "diet": "vegetables fruit fiber diet nutrition plant",
    "sleep": "sleep melatonin insomnia night rest circadian",
    "bone": "calcium bone osteoporosis fracture vitamin dairy",
}


def load_bench(relative_path: str, name: str) -> ModuleType:
    """Import a script under ``bench/`` (not a package) as module ``name``: ``bench/`` goes on ``sys.path`` for its
    ``common`` import, and the module is registered in ``sys.modules`` so its dataclasses can look it up."""
    if str(REPO / "bench") not in sys.path:
        sys.path.insert(0, str(REPO / "bench"))
    spec = importlib.util.spec_from_file_location(name, REPO / relative_path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def compose_cfg(config_name: str, overrides: list[str], return_hydra_config: bool = False):
    """Compose ``conf/<config_name>.yaml`` with ``overrides`` (Hydra override syntax); with
    ``return_hydra_config`` the ``hydra`` node (sweeper, launcher) is kept."""
    register_resolvers()  # what train.py / evaluate.py do before Hydra composes
    register_eval_sets(CONF)
    with initialize_config_dir(config_dir=CONF, version_base="1.3"):
        return compose(config_name=config_name, overrides=overrides, return_hydra_config=return_hydra_config)


def training_device_type() -> str:
    """The device type the suite's tiny training jobs run on: ``cuda`` with ``MULTIPOS_TEST_ACCELERATOR=gpu`` (a GPU
    machine, docs/gpu.md), else ``cpu``. Raises ValueError for any other value of the variable."""
    accelerator = os.environ.get("MULTIPOS_TEST_ACCELERATOR", "cpu")
    if accelerator not in ("cpu", "gpu"):
        raise ValueError(f"MULTIPOS_TEST_ACCELERATOR must be cpu or gpu, got {accelerator!r}")
    return "cuda" if accelerator == "gpu" else "cpu"


def trainer_overrides() -> list[str]:
    """The tests' trainer: ``trainer=cpu_fp32``; with ``MULTIPOS_TEST_ACCELERATOR=gpu`` (a GPU machine, docs/gpu.md) the
    same fp32 trainer on CUDA, so the tiny training jobs of the suite exercise the accelerator path."""
    if training_device_type() == "cpu":
        return ["trainer=cpu_fp32"]
    # deterministic CUDA kernels where PyTorch has them (a resumed run must equal the uninterrupted one); needs
    # CUBLAS_WORKSPACE_CONFIG=:4096:8 in the environment (bench/gpu/setup.sh sets it)
    return ["trainer=cpu_fp32", "trainer.accelerator=gpu", "trainer.deterministic=warn"]


def tiny_overrides(tiny_beir: Path, tiny_bert: Path, out: Path, *extra: str) -> list[str]:
    """Overrides that point a run of the groups' defaults (``experiment=base``) at the tiny fixtures (fp32, CPU,
    small groups)."""
    return [
        "experiment=base",
        f"paths.output_dir={out}",
        f"model.name_or_path={tiny_bert}",
        "model.pooling=cls", "model.normalize=false", "model.temperature=1.0",
        f"data.source.path={tiny_beir}", "data.source.ordering=given", "data.source.negative_depth=20",
        "data.batch_size=2", "data.group_size=4", "data.max_positives=2",
        *trainer_overrides(), "trainer.max_epochs=1", "trainer.enable_progress_bar=false",
        "trainer.log_every_n_steps=1",
        "eval=nfcorpus_dev", f"eval.test_sets.nfcorpus_dev.path={tiny_beir}",
        "eval.test_sets.nfcorpus_dev.name=tiny_test", "eval.test_sets.nfcorpus_dev.split=test",
        f"eval.validation={{_target_: multipos.evaluation.sets.EvalSet, name: tiny_dev, path: '{tiny_beir}', "
        "split: dev, metrics: [ndcg@10]}",
        "eval.bf16=false", "eval.k=20", "eval.passage_max_length=64",
        *extra,
    ]


def preempt_in_stage_two(monkeypatch):
    """Make training raise ``RuntimeError("preempted in stage 2")`` at global step 2 of a SingleLH stage (the
    curriculum's gold stage), as a preempted job would → the real ``RetrieverModule.training_step``, to set back."""
    from multipos.training.module import RetrieverModule

    real_step = RetrieverModule.training_step

    def dies_in_stage_two(self, batch, batch_idx):
        if self.loss.name == "singlelh" and self.trainer.global_step == 2:
            raise RuntimeError("preempted in stage 2")
        return real_step(self, batch, batch_idx)

    monkeypatch.setattr(RetrieverModule, "training_step", dies_in_stage_two)
    return real_step
