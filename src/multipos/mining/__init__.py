"""What a model adds to the training data: :mod:`~multipos.mining.dense_negatives` (hard negatives from an
encoder's top passages), :mod:`~multipos.mining.negative_filter` (positive-aware filtering),
:mod:`~multipos.mining.teacher_scores` (soft targets from a score file) and :mod:`~multipos.mining.teacher_model`
(soft targets from a sentence-transformers model). BM25 negatives come from :mod:`multipos.retrieval.bm25`.
"""
