"""Finished runs on disk: :class:`RunResult`, :func:`load_run`, :func:`collect` and reading a run's Hydra config.

A run directory (written by :func:`multipos.train.train`) holds ``metrics.json``, ``per_query.<eval set>.json``,
``.hydra/config.yaml``, ``.hydra/overrides.yaml`` and optionally ``references.json`` and ``run_info.json``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Mapping, Sequence

from multipos.runs.folder import read_json

#: Config keys read from ``.hydra/config.yaml`` into :attr:`RunResult.config` (plain values only); ``regime`` is the
#: stage plan's regimes (:func:`_regime`).
CONFIG_KEYS = ("loss.name", "objective", "data.name", "regime", "data.group_size", "data.max_positives",
               "data.positive_selection", "passages.candidates", "seed")
#: Short names usable in ``row_key`` (and used to label dotted keys), e.g. ``row_key="G,M"`` → ``G=8,M=4``.
KEY_ALIASES = {"objective": "loss.name", "data": "data.name", "regime": "regime",
               "G": "data.group_size", "M": "data.max_positives", "selection": "data.positive_selection",
               "candidates": "passages.candidates", "seed": "seed"}
SHORT_NAMES = {v: k for k, v in KEY_ALIASES.items()}


@dataclass(eq=False)
class RunResult:
    """One finished run: where it lives, what it trained, and what it scored.

    ``metrics``: ``{set: {metric: value}}`` from ``metrics.json``; ``per_query``:
    ``{set: {metric: {qid: value}}}`` from every ``per_query.<set>.json``; ``config``: the plain values
    of :data:`CONFIG_KEYS` (``None`` when absent or an unresolvable interpolation); ``references``:
    ``references.json`` (``{}`` when absent). Equality is identity.
    """

    path: Path
    name: str
    objective: str | None
    config: dict[str, object]
    metrics: dict[str, dict[str, float]]
    per_query: dict[str, dict[str, dict[str, float]]] = field(default_factory=dict, repr=False)
    references: dict[str, dict[str, dict[str, float]]] = field(default_factory=dict, repr=False)
    overrides: list[str] = field(default_factory=list)
    raw_config: dict = field(default_factory=dict, repr=False)
    spec: dict | None = field(default=None, repr=False)

    @property
    def label(self) -> str:
        """The default row label: the objective (``loss.name``), else the directory name."""
        return self.objective or self.name

    def value(self, eval_set: str, metric: str) -> float:
        """``metrics.json[eval_set][metric]``; ``ValueError`` naming the file when absent."""
        try:
            return self.metrics[eval_set][metric]
        except KeyError:
            raise ValueError(f"{self.path / 'metrics.json'}: no {metric!r} for eval set {eval_set!r} "
                             f"(has: {_describe(self.metrics)})") from None

    def query_values(self, eval_set: str, metric: str) -> dict[str, float]:
        """Per-query ``{qid: value}`` of ``metric`` on ``eval_set``.

        Raises ``FileNotFoundError`` naming ``per_query.<eval_set>.json`` when the file is missing and
        ``ValueError`` when it lacks ``metric``.
        """
        file = self.path / f"per_query.{eval_set}.json"
        if eval_set not in self.per_query:
            raise FileNotFoundError(f"{file}: per-query file missing (needed for significance tests)")
        if metric not in self.per_query[eval_set]:
            raise ValueError(f"{file}: no per-query values for {metric!r} "
                             f"(has: {', '.join(self.per_query[eval_set]) or 'nothing'})")
        return self.per_query[eval_set][metric]

    def get(self, key: str) -> object:
        """A config value by alias (:data:`KEY_ALIASES`) or dotted key.

        Keys of :data:`CONFIG_KEYS` come from :attr:`config` and are ``None`` when the run's config
        lacks them; any other dotted key is read unresolved from the raw config (an interpolation
        comes back as its ``${...}`` text), else from a ``key=value`` override of ``.hydra/overrides.yaml``
        (a config-group choice, which leaves no key of its name in the composed config; sweeps made before a
        study's cells were keys of its experiment, such as ``budget=m2_f50``); ``ValueError`` when it is in
        neither.
        """
        key = KEY_ALIASES.get(key, key)
        if key in self.config:
            return self.config[key]
        node: object = self.raw_config
        for part in key.split("."):
            if not isinstance(node, Mapping) or part not in node:
                break
            node = node[part]
        else:
            return node
        choices = override_map(self.overrides)
        if key in choices:
            return choices[key]
        raise ValueError(f"{self.path / '.hydra' / 'config.yaml'}: no config key {key!r}")


def override_map(overrides: Sequence[str]) -> dict[str, str]:
    """``["loss=lsepair", "+x.y=1", "~z"]`` → ``{"loss": "lsepair", "x.y": "1"}`` (deletions are skipped)."""
    out = {}
    for o in overrides:
        m = re.fullmatch(r"\+{0,2}([^=~\s]+)=(.*)", o.strip())
        if m:
            out[m.group(1)] = m.group(2)
    return out


# ----------------------------------------------------------------------------------------------
# loading


def _describe(metrics: Mapping) -> str:
    return "; ".join(f"{s}: {', '.join(m)}" for s, m in metrics.items()) or "nothing"


def _float_map(obj: object, path: Path, what: str) -> dict[str, float]:
    if not isinstance(obj, Mapping):
        raise ValueError(f"{path}: expected an object of {what}, got {type(obj).__name__}")
    out = {}
    for k, v in obj.items():
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise ValueError(f"{path}: value for {k!r} is not a number: {v!r}")
        out[str(k)] = float(v)
    return out


def _nested(obj: object, path: Path, depth: int) -> dict:
    """Validate ``{a: {b: number}}`` (depth 2) or ``{a: {b: {c: number}}}`` (depth 3)."""
    if depth == 1:
        return _float_map(obj, path, "numbers")
    if not isinstance(obj, Mapping):
        raise ValueError(f"{path}: expected a JSON object, got {type(obj).__name__}")
    return {str(k): _nested(v, path, depth - 1) for k, v in obj.items()}


def _load_config(run_dir: Path) -> tuple[dict, dict, list[str]]:
    """(interesting keys, raw unresolved config, overrides) from ``.hydra/``; empty when absent."""
    from omegaconf import DictConfig, ListConfig, OmegaConf

    from multipos.config_resolvers import register_resolvers

    register_resolvers()
    cfg_path, ovr_path = run_dir / ".hydra" / "config.yaml", run_dir / ".hydra" / "overrides.yaml"
    config, raw, overrides = {k: None for k in CONFIG_KEYS}, {}, []
    try:
        if cfg_path.is_file():
            cfg = OmegaConf.load(cfg_path)
            if not isinstance(cfg, DictConfig):
                raise ValueError(f"{cfg_path}: expected a mapping")
            for key in CONFIG_KEYS:  # each value on its own: never resolve the whole config
                if key == "regime":
                    config[key] = _regime(cfg)
                    continue
                value = OmegaConf.select(cfg, key, default=None, throw_on_resolution_failure=False)
                if isinstance(value, (DictConfig, ListConfig)):
                    value = OmegaConf.to_container(value, resolve=False)
                config[key] = value
            raw = OmegaConf.to_container(cfg, resolve=False)
        if ovr_path.is_file():
            ovr = OmegaConf.load(ovr_path)
            overrides = [str(o) for o in OmegaConf.to_container(ovr)] if isinstance(ovr, ListConfig) else []
    except ValueError:
        raise
    except Exception as exc:  # yaml / omegaconf parse errors
        raise ValueError(f"{run_dir / '.hydra'}: cannot read the Hydra config ({exc})") from None
    return config, raw, overrides


def _regime(saved) -> str | None:
    """The regime of a run's stage plan (``stages.<name>.regime``, resolved one by one): ``homogeneous``, or
    ``homogeneous then gold`` for the curriculum; None when the config has no stage plan (an evaluation)."""
    from omegaconf import DictConfig, OmegaConf

    stages = OmegaConf.select(saved, "stages", default=None)
    if not isinstance(stages, DictConfig) or not stages:
        return None
    regimes = [OmegaConf.select(saved, f"stages.{name}.regime", default=None, throw_on_resolution_failure=False)
               for name in stages]
    return " then ".join(str(r) for r in regimes)


def config_node(run_dir: str | Path, key: str, default: object = None) -> object:
    """The node ``key`` (dotted) of ``<run_dir>/.hydra/config.yaml``, resolved, as plain Python values.

    Only that node is resolved (interpolations into other parts of the config, such as
    ``${scale.in_domain_columns}``, work; the rest of the config is never resolved). ``default`` when
    the file or the key is absent. Raises ``ValueError`` naming the file when it cannot be read or
    the node cannot be resolved (e.g. a ``${hydra:...}`` interpolation outside a Hydra job).
    """
    from omegaconf import DictConfig, ListConfig, OmegaConf

    from multipos.config_resolvers import register_resolvers

    register_resolvers()  # a saved config may interpolate ${auto_precision:} and the like
    path = Path(run_dir) / ".hydra" / "config.yaml"
    if not path.is_file():
        return default
    try:
        cfg = OmegaConf.load(path)
        node = OmegaConf.select(cfg, key, default=default)
        if isinstance(node, (DictConfig, ListConfig)):
            node = OmegaConf.to_container(node, resolve=True)
    except Exception as exc:  # yaml parse / interpolation errors
        raise ValueError(f"{path}: cannot read {key!r} ({exc})") from None
    return node


def _objective(config: Mapping, overrides: Sequence[str]) -> str | None:
    """The objective a run trained with (``loss.name``), or that trained the model it evaluated (``objective``, an
    evaluation-only study such as Table 3), else a ``loss=`` override."""
    for key in ("loss.name", "objective"):
        if config.get(key):
            return str(config[key])
    for o in overrides:  # fall back to a `loss=<name>` / `loss.name=<name>` override
        m = re.fullmatch(r"\+{0,2}loss(?:\.name)?=(\S+)", o.strip())
        if m:
            return m.group(1)
    return None


def load_run(run_dir: str | Path, sets: Iterable[str] | None = None, metrics: Iterable[str] | None = None,
             require_per_query: bool = True) -> RunResult:
    """Load one run directory into a :class:`RunResult`.

    Inputs: ``run_dir`` (must contain ``metrics.json``); optional ``sets`` / ``metrics`` to validate
    up front. Reads every ``per_query.<set>.json`` present, ``references.json`` if present and the
    :data:`CONFIG_KEYS` of ``.hydra/config.yaml`` (values read one by one, the config is never resolved
    as a whole, so interpolations such as ``${model.name_or_path}`` are harmless), and ``spec.json`` (what the run
    computed, :class:`multipos.runs.spec.RunSpec`) if present.

    Raises ``FileNotFoundError`` naming the path when ``run_dir`` or its ``metrics.json`` is missing,
    or (``require_per_query``) when ``per_query.<set>.json`` is missing for a requested set;
    ``ValueError`` naming the file for malformed JSON/YAML or a requested set/metric absent from
    ``metrics.json`` (or from the per-query file).
    """
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise FileNotFoundError(f"{run_dir}: no such run directory")
    metrics_path = run_dir / "metrics.json"
    if not metrics_path.is_file():
        raise FileNotFoundError(f"{metrics_path}: not found — {run_dir} is not a finished run directory")
    values = _nested(read_json(metrics_path), metrics_path, 2)
    per_query = {}
    for file in sorted(run_dir.glob("per_query.*.json")):
        per_query[file.name[len("per_query."):-len(".json")]] = _nested(read_json(file), file, 2)
    refs_path = run_dir / "references.json"
    refs = _nested(read_json(refs_path), refs_path, 3) if refs_path.is_file() else {}
    config, raw, overrides = _load_config(run_dir)
    spec_path = run_dir / "spec.json"
    spec = read_json(spec_path) if spec_path.is_file() else None
    run = RunResult(path=run_dir, name=run_dir.name, objective=_objective(config, overrides), config=config,
                    metrics=values, per_query=per_query, references=refs, overrides=overrides, raw_config=raw,
                    spec=spec)
    metrics = list(metrics or ())
    for s in sets or ():
        if s not in values:
            raise ValueError(f"{metrics_path}: no eval set {s!r} (has: {', '.join(values) or 'nothing'})")
        if require_per_query and s not in per_query:
            raise FileNotFoundError(f"{run_dir / f'per_query.{s}.json'}: per-query file missing "
                                    "(needed for significance tests)")
        for m in metrics:
            run.value(s, m)
            if require_per_query:
                run.query_values(s, m)
    return run


def collect(paths: Iterable[str | Path], sets: Iterable[str] | None = None, metrics: Iterable[str] | None = None,
            require_per_query: bool = True) -> list[RunResult]:
    """Load every run under ``paths`` (run directories or sweep directories, searched recursively).

    A path containing ``metrics.json`` is a run; any other directory is searched at any depth for
    directories containing ``metrics.json`` (sorted by path). Runs reached twice are loaded once.
    ``sets`` / ``metrics`` / ``require_per_query`` are passed to :func:`load_run`.
    Returns the runs in the order of ``paths``. Raises ``FileNotFoundError`` naming a path that does
    not exist or holds no run at all.
    """
    sets, metrics = (list(sets) if sets else None), (list(metrics) if metrics else None)
    runs, seen = [], set()
    for p in paths:
        p = Path(p)
        if not p.exists():
            raise FileNotFoundError(f"{p}: no such run or sweep directory")
        if (p / "metrics.json").is_file():
            dirs = [p]
        else:
            dirs = sorted({f.parent for f in p.rglob("metrics.json") if f.is_file()})
            if not dirs:
                raise FileNotFoundError(f"{p}: no metrics.json found (not a run directory, and no runs below it)")
        for d in dirs:
            key = d.resolve()
            if key not in seen:
                seen.add(key)
                runs.append(load_run(d, sets, metrics, require_per_query))
    return runs
