"""Training data: readers of the file formats (BEIR folders, TREC qrels and runs, Tevatron JSONL / HF datasets,
DPR), data sources (NFCorpus graded qrels with BM25 negatives and teacher ordering, Tevatron), dense hard negatives
and their ANCE-style refresh, group construction (regimes, first-M / random-M, masks), the annotation budget, and the
Lightning DataModule that joins them.

(the data model they read into — ``Passage``, ``Corpus``, ``Qrels``, ``Run``, ``BeirDataset``, ``DataFormatError``, the
line readers — is :mod:`multipos.formats.types`, below every layer)

* :mod:`~multipos.formats.beir` — BEIR folders (corpus, queries, qrels files, the checks that tie them);
* :mod:`~multipos.formats.trec` — qrels (TREC and BEIR TSV) and TREC runs;
* :mod:`~multipos.formats.tevatron` — Tevatron training JSONL / HF datasets (the paper's data schema);
* :mod:`~multipos.formats.dpr` — the DPR releases (Wikipedia passages TSV, QA files) for answer-match evaluation;
* :mod:`~multipos.data.sources` — ``BeirGradedSource``, ``TevatronSource``: each reads its format, and only that;
* :mod:`~multipos.data.preparation` — the steps every source's data goes through, in one order (``STEPS``): hard
  negatives (BM25 mining), teacher ordering, negative filtering, teacher scores, grade weights, label noise;
* :mod:`~multipos.mining.dense_negatives` — dense hard negatives, ANCE-style refresh mining (the callback:
  ``multipos.training.callbacks.NegativeRefresh``);
* :mod:`~multipos.data.groups` — ``TrainQuery``, ``GroupBuilder``, ``group_masks`` (the paper's group composition);
* :mod:`~multipos.data.budget` — ``AnnotationBudget`` (Table 7);
* :mod:`~multipos.data.passage_tokens` — the training passages tokenised once;
* :mod:`~multipos.data.collate` — the ``Batch`` and its collator;
* :mod:`~multipos.data.loader` — the training loader: ``EpochSampler``, ``ResumableLoader``, how its workers start
  and send batches;
* :mod:`~multipos.data.datamodule` — ``MultiPosDataModule`` and the ``StageInputs`` a stage hands it.

``MultiPosDataModule`` and ``StageInputs`` are importable from here: ``conf/data`` instantiates
``multipos.data.MultiPosDataModule``.
"""

from multipos.data.datamodule import MultiPosDataModule, StageInputs

__all__ = ["MultiPosDataModule", "StageInputs"]
