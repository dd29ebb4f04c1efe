"""The run folder and its one owner: what a run directory holds and when it is finished (``folder``), what a run
computes (``spec``: the run spec, its key and equivalence key; ``migrate`` re-keys older folders), reusing a
finished run that computed the same (``reuse``), a run's life from open to close (``lifecycle``), finding runs
(``find``) and reading their training logs (``logs``).

* :mod:`~multipos.runs.folder` — ``run_info.json``, :func:`~multipos.runs.folder.is_finished` (the one rule),
  ``prepare_run_dir``, checkpoints;
* :mod:`~multipos.runs.spec` — ``RunSpec`` (``key``, ``equivalence_key``), ``run_spec``;
* :mod:`~multipos.runs.migrate` — ``python -m multipos.runs.migrate <sweep dir>``: re-key finished runs;
* :mod:`~multipos.runs.reuse` — the equivalent-run index, ``find_equivalent``, ``adopt``;
* :mod:`~multipos.runs.lifecycle` — ``open_run``, ``close_run``;
* :mod:`~multipos.runs.find` — ``sweep_runs``, ``find_runs``, ``latest_run``;
* :mod:`~multipos.runs.logs` — ``stage_logs``, ``training_log``, ``series``.
"""
