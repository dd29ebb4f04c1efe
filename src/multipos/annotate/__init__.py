"""From a corpus and queries to multi-positive training data: the paper's LLM annotation pipeline (Sec. 4.2, after
Zhang et al. 2025) with pluggable judges, every call cached.

``python annotate.py`` (Hydra, ``conf/annotate.yaml``) runs :class:`multipos.annotate.pipeline.Annotator`: candidate
pooling (:mod:`multipos.annotate.candidates`), relevance filtering, a pseudo-answer, utility verification
(:mod:`multipos.annotate.stages`), through a judge (:mod:`multipos.annotate.judges`) whose calls go through an on-disk
cache (:mod:`multipos.annotate.cache`).
"""
