"""Evaluation: evaluation sets (BEIR folders, qrels views, DPR QA) and their configs, metrics (ranx; DPR answer-match
accuracy), and the runner both jobs share (dense retrieval + metrics per set, BM25 and zero-shot references, the one
results writer). The job itself is :mod:`multipos.evaluate`; search is :mod:`multipos.retrieval`.

* :mod:`~multipos.evaluation.sets` — ``EvalSet`` / ``QAEvalSet`` (load, clean a run, score it);
* :mod:`~multipos.evaluation.metrics` — ``evaluate_run`` (ranx);
* :mod:`~multipos.evaluation.qa` — DPR passages and QA files, answer matching, top-k accuracy;
* :mod:`~multipos.evaluation.runner` — ``Evaluation`` (the sets and retrieval settings, read once from the config;
  ``evaluate``, ``reference_rows``), ``score_set``, ``add_average`` (the average row over sets), ``write_results``.
"""
