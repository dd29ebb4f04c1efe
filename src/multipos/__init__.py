"""multipos: training dense retrievers with multiple positive passages per query.

Layers, lowest first (a module imports only from layers below it or its own):

* ``formats/``: the data model (``types``) and the file formats (``beir``, ``trec``, ``tevatron``, ``dpr``); no torch;
* ``losses`` (the objectives, one function per paper equation), ``atomic`` (atomic writes), ``hardware`` (native
  bf16, workers), ``config_mapping`` (settings dataclasses from config mappings), ``config_resolvers``;
* ``assets/``: the default data and checkpoints from their public sources;
* ``model/``: the dual encoder, its settings, LoRA, export, tokenization, packing, WiSE-FT interpolation;
* ``retrieval/``: encoding and the embedding cache, FAISS, BM25, top-k, shards;
* ``mining/``: dense hard negatives, positive-aware filtering, teacher scores and teacher models;
* ``data/``: training data (``sources``), groups and masks, annotation budget, label noise, the LightningDataModule;
* ``evaluation/``: evaluation sets, metrics (ranx), QA accuracy, the runner shared by both jobs;
* ``training/``: the LightningModule, stage plans, one stage's fit, callbacks, loggers, DDP columns, GradCache, the
  frozen passage index and corpus candidates of query-side fine-tuning, diagnostics;
* ``runs/``: the run folder's one owner — its spec and key, finished rule, reuse, migration, logs;
* ``report/``: tables, significance, plots, the main job's summary;
* jobs: ``train`` / ``evaluate`` (behind ``train.py`` / ``evaluate.py``), ``shard_job`` (``python -m
  multipos.shard_job``), ``own_data/`` (``make train DATA=``), ``annotate/`` (``annotate.py``).
"""

from multipos.hardware import auto_precision, auto_workers, native_bf16

__version__ = "0.1.0"
__all__ = ["auto_precision", "auto_workers", "native_bf16", "__version__"]
