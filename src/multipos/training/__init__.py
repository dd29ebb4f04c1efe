"""Training a dual encoder with Lightning: :mod:`~multipos.training.module` (``RetrieverModule``),
:mod:`~multipos.training.stages` (the stage plan), :mod:`~multipos.training.fit` (one stage),
:mod:`~multipos.training.callbacks`, :mod:`~multipos.training.loggers`, :mod:`~multipos.training.distributed` (DDP
columns), :mod:`~multipos.training.grad_cache`, :mod:`~multipos.training.passage_index` (the frozen index of
query-side fine-tuning), :mod:`~multipos.training.corpus_candidates` (every corpus passage a candidate),
:mod:`~multipos.training.diagnostics` and :mod:`~multipos.training.embedding_gradients`.

Import the module you need; this package imports nothing itself.
"""
