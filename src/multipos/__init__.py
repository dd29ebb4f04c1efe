"""multipos: training dense retrievers with multiple positive passages per query.

Modules and subpackages, by concept:

* the science: ``losses`` (objectives, one function per paper equation), ``stages`` (training-stage plans:
  regimes, curriculum), ``diagnostics`` (Sec. 3.3 gradient diagnostics);
* ``data/``: ``readers`` (file formats), ``sources`` (training data, BM25 / teacher ordering), ``dense_negatives``
  (dense hard-negative mining and ANCE-style refresh), ``groups`` (group construction and masks), ``budget``
  (annotation budget), ``datamodule`` (LightningDataModule); ``assets`` (data and checkpoint locations);
* query-side fine-tuning: ``passage_index`` (the frozen passage index, looked up by corpus row),
  ``corpus_candidates`` (every corpus passage a candidate: exact objectives in chunks), ``weight_interpolation``
  (WiSE-FT toward the starting weights);
* the model and its training: ``model`` (dual encoder), ``module`` (LightningModule), ``distributed``
  (cross-device negatives under DDP), ``grad_cache`` (GradCache), ``callbacks`` (retrieval validation, resume
  checkpoints, RNG states), ``loggers`` (W&B that never blocks);
* ``retrieval/``: ``encoding`` (encoding and the embedding cache), ``dense`` (FAISS runs), ``bm25`` (lexical runs),
  ``topk`` (exact top-k merge), ``shards`` / ``shard_job`` (sharded corpus encoding and search);
* ``evaluation/``: ``sets`` (evaluation sets), ``metrics`` (ranx metrics), ``qa`` (DPR answer-match accuracy),
  ``runner`` (evaluation shared by both jobs);
* jobs and outputs: ``train`` / ``evaluate`` (the jobs behind ``train.py`` / ``evaluate.py``), ``equivalent_runs``
  (config hash, equivalence key, reusing a finished run that trained the same model), ``atomic`` (atomic writes),
  ``run_folder`` (the run directory: ``run_info.json``, the one "finished" rule, finding runs, the training logs),
  ``report/`` (tables, significance, plots, the main job's summary).
"""

from pathlib import Path

from omegaconf import OmegaConf

__version__ = "0.1.0"


def auto_precision() -> str:
    """Lightning precision: ``bf16-mixed`` where bf16 is supported natively (a CUDA GPU with bf16, or a
    CPU with AVX512-BF16/AMX), else ``32-true``."""
    import torch

    if torch.cuda.is_available():
        return "bf16-mixed" if torch.cuda.is_bf16_supported() else "32-true"
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:
        return "32-true"
    return "bf16-mixed" if ("avx512_bf16" in flags or "amx_bf16" in flags) else "32-true"


def native_bf16() -> bool:
    """True where bf16 is native (:func:`auto_precision` is ``bf16-mixed``): ``${auto_bf16:}`` and the meaning of
    ``bf16=None`` in :mod:`multipos.retrieval.encoding`."""
    return auto_precision() == "bf16-mixed"


def auto_workers() -> int:
    """DataLoader workers for training: tokenization runs in worker processes when a CUDA GPU trains (on an
    H100 it took 75–80 % of each step in the main process), and in the main process on a CPU, whose cores
    the model's own compute already uses (workers would only compete with it)."""
    import os

    import torch

    return min(4, max(1, (os.cpu_count() or 2) - 1)) if torch.cuda.is_available() else 0


def _beir_sets(paths, split="test", metrics=("ndcg@10",)):
    from multipos.evaluation.sets import beir_sets

    return beir_sets(paths, split, metrics)


def sweep_dir(experiment: str, size: str, stamp: str) -> str:
    """Hydra sweep folder: ``multirun/<experiment>-<scale>`` for a study (fixed, so re-running it resumes),
    ``multirun/<timestamp>`` for an ad-hoc ``-m`` sweep."""
    if experiment in ("adhoc", "", None):
        return f"multirun/{stamp}"
    return f"multirun/{experiment}" + (f"-{size}" if size not in ("none", "", None) else "")


def optuna_storage(sweep_dir: str) -> str:
    """SQLite URL of an Optuna study kept inside the sweep folder (created here: SQLite needs the folder)."""
    folder = Path(sweep_dir).expanduser().resolve()
    folder.mkdir(parents=True, exist_ok=True)
    return f"sqlite:///{folder / 'optuna.db'}"


# ${basename:<path>} → last path component (run names of evaluate.py); ${auto_precision:} → see above;
# ${auto_bf16:} → bf16 encoding where native; ${auto_workers:} → see auto_workers; ${sweep_dir:...} → see sweep_dir;
# ${beir_sets:<paths>,<split>,<metrics>} → one eval-set config per BEIR folder (conf/eval/beir.yaml).
OmegaConf.register_new_resolver("basename", lambda path: str(path).rstrip("/").split("/")[-1], replace=True)
OmegaConf.register_new_resolver("auto_precision", auto_precision, replace=True)
OmegaConf.register_new_resolver("auto_bf16", native_bf16, replace=True)
OmegaConf.register_new_resolver("auto_workers", auto_workers, replace=True)
OmegaConf.register_new_resolver("sweep_dir", sweep_dir, replace=True)
OmegaConf.register_new_resolver("optuna_storage", optuna_storage, replace=True)
OmegaConf.register_new_resolver("beir_sets", _beir_sets, replace=True)
