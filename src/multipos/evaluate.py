"""The evaluation job: ``python evaluate.py`` scores trained weights (or an existing TREC run) on evaluation sets.

``python evaluate.py init_from=<model folder> eval=<set>[,<set>...]`` evaluates a trained model folder (a finished
run's ``<run dir>/model``) with the encoder settings of ``model`` (whose ``name_or_path``, the starting checkpoint, is
the zero-shot reference row and WiSE-FT's default start); ``model.name_or_path=<checkpoint>`` alone evaluates that
checkpoint. ``python evaluate.py -m experiment=<study>`` runs an evaluation-only study (``job: evaluate`` in
``conf/experiment/<study>.yaml``: Table 3, the WiSE-FT curves) into ``multirun/<study>-<size>``, one cell per model it
names.

Outputs in the run directory (files listed in :mod:`multipos.evaluation.runner`), plus ``spec.json`` and
``run_info.json`` (:mod:`multipos.runs.spec`, :mod:`multipos.runs.folder`): re-running the same command into the same
folder skips a finished cell. With ``run_file=<TREC run>`` the run is scored as it is (no encoding, no spec).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from hydra.utils import instantiate
from omegaconf import DictConfig

from multipos.assets import cache_dir
from multipos.evaluation.runner import Evaluation, score_set
from multipos.evaluation.sets import EvalSet
from multipos.formats.trec import read_run
from multipos.hardware import set_torch_threads
from multipos.model.interpolation import interpolate_toward_start
from multipos.runs.folder import RunFolder, model_folder, write_run_info
from multipos.runs.lifecycle import close_run, open_run, write_spec
from multipos.runs.spec import RunSpec, run_spec
from multipos.training.distributed import device_description

log = logging.getLogger(__name__)

__all__ = ["EvaluationJob", "evaluate", "score_run_file", "set_list_override"]


@dataclass
class EvaluationJob:
    """The evaluation job as typed pieces, built by :meth:`setup`, the only reader of the composed config; :meth:`run`
    evaluates.

    ``spec``: what the run computes (:func:`multipos.runs.spec.evaluation_spec`; None when scoring ``run_file``);
    ``folder``: the run folder; ``model``: the encoder's config node, instantiated as it is; ``weights``: the model
    folder evaluated instead of ``model.name_or_path`` (``init_from``), or None; ``evaluation``: the sets and their
    search; ``wise_ft``: (alpha, start) of WiSE-FT, start None when unset; ``zero_shot_model``: the checkpoint of the
    zero-shot reference row when it is not ``model.name_or_path``; ``run_file``: a TREC run to score instead of
    encoding; ``threads``: torch threads.
    """

    spec: RunSpec | None
    folder: RunFolder
    model: DictConfig
    weights: str | None
    evaluation: Evaluation
    wise_ft: tuple[float, str | None] = (1.0, None)
    zero_shot_model: str | None = None
    run_file: str | None = None
    threads: int | None = None

    @classmethod
    def setup(cls, cfg: DictConfig) -> EvaluationJob:
        """Read the composed config once into typed pieces. Errors surface here, before anything is written:
        ValueError when no set is selected, when the config is a training job (``job: train``) or when
        ``wise_ft.alpha`` < 1 has no starting checkpoint; FileNotFoundError for a missing ``init_from`` folder; what
        instantiating an evaluation set raises."""
        if cfg.get("job", "evaluate") != "evaluate":
            raise ValueError(f"experiment={cfg.get('experiment_name')} trains (job: {cfg.job}): run it with "
                             f"`python train.py -m experiment={cfg.get('experiment_name')}`")
        evaluation = Evaluation.from_node(cfg.eval, cfg.get("run_name"))
        if not evaluation.sets:
            raise ValueError("no eval set selected: use eval=<set> (e.g. eval=nfcorpus_test) or eval=[<set>,<set>]")
        weights = model_folder(cfg.get("init_from"))
        wise = cfg.get("wise_ft") or {}
        alpha = float(wise.get("alpha", 1.0))
        start = wise.get("start") or (cfg.model.name_or_path if weights else None)
        if alpha != 1.0 and not start:
            raise ValueError(f"wise_ft.alpha={alpha} needs wise_ft.start=<the checkpoint {cfg.model.name_or_path} "
                             "was fine-tuned from> (e.g. wise_ft.start=all-MiniLM-L6-v2), or init_from=<model folder> "
                             "with model.name_or_path the starting checkpoint")
        run_file = cfg.get("run_file")
        return cls(
            spec=None if run_file else run_spec(cfg),
            folder=RunFolder(out=Path(cfg.paths.output_dir), resume=bool(cfg.get("resume", True)),
                             experiment=cfg.get("experiment_name")),
            model=cfg.model, weights=weights, evaluation=evaluation, wise_ft=(alpha, start),
            zero_shot_model=cfg.get("zero_shot_model"), run_file=run_file, threads=cfg.get("threads"),
        )

    def load_model(self):
        """The encoder evaluated: ``model`` instantiated (from :attr:`weights` when set), then interpolated toward
        the WiSE-FT start when alpha < 1 (:func:`multipos.model.interpolation.interpolate_toward_start`)."""
        model = instantiate(self.model, **({"name_or_path": self.weights} if self.weights else {}))
        alpha, start = self.wise_ft
        if alpha != 1.0:
            interpolate_toward_start(model, model.starting_point(start), alpha)
        return model

    def zero_shot(self):
        """The encoder of the zero-shot reference row: ``zero_shot_model`` when named, else the starting checkpoint
        ``model`` when :attr:`weights` are evaluated, else None (BM25 only; the row is then left out)."""
        if self.zero_shot_model:
            return instantiate(self.model, name_or_path=self.zero_shot_model)
        return instantiate(self.model) if self.weights else None

    def run(self) -> dict:
        """Evaluate; returns {result name: {metric: value}} (also written to ``metrics.json``)."""
        out, started = self.folder.out, time.time()
        out.mkdir(parents=True, exist_ok=True)
        threads = set_torch_threads(self.threads)
        evaluation = self.evaluation
        if self.run_file:
            results = score_run_file(self.run_file, evaluation.sets, out)
            refs = evaluation.reference_rows(sets=evaluation.sets) if evaluation.references else {}
            return self._finish(out, results, refs, [])
        run = open_run(self.spec, self.folder, [], device=device_description() + threads, started=started,
                       precision={"encoding": "bf16" if evaluation.retrieval.get("bf16") else "fp32"})
        if run.done:  # finished here before
            return run.metrics
        model = self.load_model()  # checkpoint errors before anything is written
        write_spec(out, run.spec)
        write_run_info(out, run.info)
        refs = evaluation.run_folder_references(out, self.zero_shot) if evaluation.references else {}
        results = evaluation.evaluate(model, out, cache_dir())
        info = {**run.info, "wall_s": round(run.info["wall_s"] + time.time() - started, 1)}
        self._finish(out, results, refs, [f"wall time {info['wall_s']:.0f} s on {info['device']}"])
        close_run(out, info)
        return results

    def _finish(self, out: Path, results: dict, refs: dict, extra_lines: list[str]) -> dict:
        text = self.evaluation.write(out, results, refs, extra_lines=extra_lines)
        print("\n" + text + "\n")
        print(f"run directory: {out}")
        return results


def evaluate(cfg: DictConfig) -> dict:
    """Run the evaluation job described in the module docstring (:meth:`EvaluationJob.setup`, then
    :meth:`EvaluationJob.run`); returns {result name: {metric: value}}. Raises what :meth:`EvaluationJob.setup`
    raises, before anything is written."""
    return EvaluationJob.setup(cfg).run()


def score_run_file(path: str, sets: list[EvalSet], out=None) -> dict:
    """Score an existing TREC run against each set → {result name: {metric: value}}.

    Passages absent from the set's corpus and queries without judgments are dropped with a warning that
    gives their number and examples. With ``out``, writes ``per_query.<result>.json`` there (and the run
    as scored, ``run.<set>.trec``), so runs from other systems enter significance tests like ours.
    """
    run = read_run(path)
    results = {}
    for es in sets:
        data = es.load()
        unknown = sorted({d for docs in run.values() for d in docs if d not in data.corpus})
        if unknown:
            log.warning("%s: dropping %d passage ids not in the %s corpus, e.g. %s", path, len(unknown), es.name,
                        unknown[:5])
        kept = es.clean({q: {d: s for d, s in docs.items() if d in data.corpus} for q, docs in run.items()})
        results.update(score_set(es, kept, data, out, tag="scored"))
    return results


def set_list_override(argv: Sequence[str], group: str = "eval") -> list[str]:
    """Rewrite ``eval=a,b`` as Hydra's list selection ``eval=[a,b]`` so several sets are scored in one run
    (Hydra itself reads a bare comma list as a sweep and refuses it without ``--multirun``). Left as is
    under ``-m/--multirun``, where the comma keeps its sweep meaning."""
    argv = list(argv)
    if any(a in ("-m", "--multirun") for a in argv):
        return argv
    prefix = f"{group}="
    return [f"{prefix}[{a[len(prefix):]}]" if a.startswith(prefix) and "," in a and "[" not in a else a for a in argv]
