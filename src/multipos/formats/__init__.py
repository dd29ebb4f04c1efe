"""File formats and the data model, readable without torch, Lightning or transformers: :mod:`~multipos.formats.types`
(queries, passages, qrels as plain data), :mod:`~multipos.formats.beir`, :mod:`~multipos.formats.trec` (qrels and
runs), :mod:`~multipos.formats.tevatron` (JSONL groups) and :mod:`~multipos.formats.dpr`.
"""
