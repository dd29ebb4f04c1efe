"""multipos: training dense retrievers with multiple positive passages per query.

Modules and subpackages, by concept:

* the science: ``losses`` (objectives, one function per paper equation), ``stages`` (training-stage plans:
  regimes, curriculum), ``diagnostics`` (Sec. 3.3 gradient diagnostics);
* ``config_mapping`` (settings dataclasses from config mappings), ``tokenization`` (the EOS rule, tokenizer checks),
  ``lora`` (LoRA adapters), ``st_format`` (the sentence-transformers folder format), ``hardware`` (native bf16,
  workers), ``config_resolvers`` (the configs' resolvers);
* ``types`` (the data model: passages, corpora, qrels, runs, a loaded dataset; below every layer);
* ``data/``: ``beir``, ``trec``, ``tevatron``, ``dpr`` (file formats), ``negative_filter`` (positive-aware
  hard-negative filtering), ``sources`` (training data, BM25 / teacher ordering), ``dense_negatives``
  (dense hard-negative mining and ANCE-style refresh), ``groups`` (group construction and masks), ``budget``
  (annotation budget), ``datamodule`` (LightningDataModule); ``assets`` (data and checkpoint locations);
* query-side fine-tuning: ``passage_index`` (the frozen passage index, looked up by corpus row),
  ``corpus_candidates`` (every corpus passage a candidate: exact objectives in chunks), ``weight_interpolation``
  (WiSE-FT toward the starting weights);
* the model and its training: ``model`` (dual encoder), ``encoder_settings`` (pooling, normalisation, temperature,
  prompts: saved with a checkpoint or given), ``module`` (LightningModule), ``distributed``
  (cross-device negatives under DDP), ``grad_cache`` (GradCache), ``transfer`` (host-to-device copies that do
  not make the host wait for a GPU), ``callbacks`` (retrieval validation, resume
  checkpoints, RNG states, the progress bar), ``loggers`` (W&B that never blocks);
* ``retrieval/``: ``encoding`` (encoding and the embedding cache), ``dense`` (FAISS runs), ``bm25`` (lexical runs),
  ``topk`` (exact top-k merge), ``shards`` (sharded corpus encoding and search);
* ``evaluation/``: ``sets`` (evaluation sets), ``metrics`` (ranx metrics), ``qa`` (answer matching and top-k answer
  accuracy), ``runner`` (evaluation shared by both jobs);
* jobs and outputs: ``train`` / ``evaluate`` (the jobs behind ``train.py`` / ``evaluate.py``), ``shard_job``
  (``python -m multipos.shard_job``: sharded encoding and exact search of a corpus), ``fit`` (one training
  stage), ``atomic`` (atomic writes), ``report/`` (tables, significance, plots, the main job's summary);
* ``runs/``: the run folder's one owner — ``folder`` (``run_info.json``, the one "finished" rule, resume
  checkpoints), ``spec`` (what a run computes: its key and equivalence key), ``migrate`` (re-keying older run
  folders), ``reuse`` (copying a finished run that trained the same model), ``lifecycle`` (opening and closing a run),
  ``find`` (finding runs), ``logs`` (training logs).
"""

from multipos.hardware import auto_precision, auto_workers, native_bf16

__version__ = "0.1.0"
__all__ = ["auto_precision", "auto_workers", "native_bf16", "__version__"]
