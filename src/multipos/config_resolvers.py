"""What the configs under ``conf/`` need besides their files, registered where a config is loaded: the OmegaConf
resolvers, and one ``eval=<set>`` choice per evaluation set (:func:`register_eval_sets`).

:func:`register_resolvers` is called by the entry points (``train.py``, ``evaluate.py``), by the report when it
resolves a run's saved config (:func:`multipos.report.runs.config_node`) and by the tests' compose helper; importing
:mod:`multipos` registers nothing.

``${basename:<path>[,<path>...]}`` → last component of the first non-null path (run names of evaluate.py);
``${auto_precision:}``,
``${auto_bf16:}``, ``${auto_workers:}``, ``${cores_per_job:<n>}``, ``${threads_per_job:<n>}`` →
:mod:`multipos.hardware`;
``${sweep_dir:…}`` → :func:`sweep_dir`; ``${optuna_storage:…}`` → :func:`optuna_storage`;
``${optuna_seed:…}`` → :func:`optuna_seed`; ``${beir_sets:<paths>,<split>,<metrics>}`` → one eval-set config
per BEIR folder (conf/eval/beir.yaml); ``${if_homogeneous:${stages},<a>,<b>}`` → :func:`if_homogeneous`.
"""

import hashlib
import re
from pathlib import Path

from omegaconf import OmegaConf

from multipos.hardware import (
    auto_log_interval,
    auto_precision,
    auto_workers,
    cores_per_job,
    native_bf16,
    threads_per_job,
)

__all__ = ["register_resolvers", "register_eval_sets", "sweep_dir", "optuna_storage", "optuna_seed", "if_homogeneous",
           "compose_train"]


def _beir_sets(paths, split="test", metrics=("ndcg@10",)):
    from multipos.evaluation.sets import beir_sets

    return beir_sets(paths, split, metrics)


def sweep_dir(experiment: str, scale: str, stamp: str) -> str:
    """Hydra sweep folder: ``multirun/<experiment>-<scale>`` for a study (``scale``: the scale's ``scale.name``, e.g.
    ``cpu-query_side``; fixed, so re-running it resumes), ``multirun/<timestamp>`` for an ad-hoc ``-m`` sweep."""
    if experiment in ("adhoc", "", None):
        return f"multirun/{stamp}"
    return f"multirun/{experiment}" + (f"-{scale}" if scale not in ("none", "", None) else "")


_ITEM = re.compile(r",(?=[+~]*[A-Za-z_][\w.@]*=)")  # the "," that starts the next key=value of an override_dirname


_PATH = re.compile(r"[~.]*/(?:[^/,'\"\[\]{}\s=:]+/)*([^/,'\"\[\]{}\s=:]*)")  # /a/b/c -> c (its last component)


def run_subdir(override_dirname: str) -> str:
    """A sweep cell's folder name, short and readable: Hydra's ``override_dirname`` (``key=value`` pairs, sorted,
    joined by ``,``) with every path in a value shortened to its last component (``data.source.path=/data/a/mine``
    gives ``data.source.path=mine``), a value still longer than 40 characters (a dict or a long list) replaced by
    ``#`` and 8 hex digits of its hash, and a name longer than 200 characters cut to 190 plus its own hash. The full
    overrides are in the run's ``.hydra/overrides.yaml``. Every study's cell names are unchanged by these rules."""
    items = _ITEM.split(str(override_dirname)) if override_dirname else []
    out = []
    for item in items:
        key, sep, value = item.partition("=")
        value = _PATH.sub(lambda m: m.group(1) or "root", value)
        if len(value) > 40:
            value = "#" + hashlib.sha1(value.encode()).hexdigest()[:8]
        out.append(key + sep + value)
    name = ",".join(out)
    return name if len(name) <= 200 else f"{name[:190]}-{hashlib.sha1(name.encode()).hexdigest()[:8]}"


def optuna_storage(sweep_dir: str) -> str:
    """SQLite URL of an Optuna study kept inside the sweep folder (created here: SQLite needs the folder)."""
    folder = Path(sweep_dir).expanduser().resolve()
    folder.mkdir(parents=True, exist_ok=True)
    return f"sqlite:///{folder / 'optuna.db'}"


def optuna_seed(base: int, sweep_dir: str, study_name: str) -> int:
    """Seed of the Optuna sampler of a study kept in ``sweep_dir`` (:func:`optuna_storage`): ``base`` plus the number
    of trials, of any state, that the stored study ``study_name`` already holds (``base`` for a new study).

    A seeded sampler starts its random sequence again in every process, so a continued study seeded with ``base`` alone
    proposes its first trials again: their runs are read back as finished, the study records them a second time, and
    no new point is tried (seen on the two-tower recipe search, 2026-11-27). With the count, each continuation draws
    new points, and the same stored history gives the same seed."""
    db = Path(sweep_dir).expanduser().resolve() / "optuna.db"
    if not db.is_file():  # nothing stored yet (and no empty database made here)
        return int(base)
    import optuna

    summaries = optuna.get_all_study_summaries(storage=f"sqlite:///{db}")
    return int(base) + sum(s.n_trials for s in summaries if s.study_name == study_name)


def _basename(*paths) -> str:
    """Last component of the first path that is not null (run names of ``evaluate.py``: ``init_from``, else
    ``model.name_or_path``); a folder named ``model`` (a run's weights) is named by its run folder."""
    path = next((p for p in paths if p not in (None, "")), "")
    parts = [p for p in str(path).rstrip("/").split("/") if p]
    return (parts[-2] if len(parts) > 1 and parts[-1] == "model" else parts[-1]) if parts else ""


def if_homogeneous(stages, when_homogeneous, otherwise):
    """``when_homogeneous`` if every stage of the plan (the ``stages`` node, conf/regime) trains on silver positives
    only (regime ``homogeneous``), else ``otherwise``: scale=paper's data (conf/data/msmarco.yaml) reads the LLM-only
    file for Table 2 and the human-first one for every regime that needs gold positives."""
    regimes = [stage.get("regime") for stage in (stages or {}).values()]
    return when_homogeneous if regimes and all(r == "homogeneous" for r in regimes) else otherwise


def register_resolvers() -> None:
    """Register every resolver the configs use (idempotent: ``replace=True``)."""
    OmegaConf.register_new_resolver("basename", _basename, replace=True)
    OmegaConf.register_new_resolver("run_subdir", run_subdir, replace=True)
    OmegaConf.register_new_resolver("auto_precision", auto_precision, replace=True)
    OmegaConf.register_new_resolver("auto_bf16", native_bf16, replace=True)
    OmegaConf.register_new_resolver("auto_workers", auto_workers, replace=True)
    OmegaConf.register_new_resolver("auto_log_interval", auto_log_interval, replace=True)
    OmegaConf.register_new_resolver("cores_per_job", cores_per_job, replace=True)
    OmegaConf.register_new_resolver("threads_per_job", threads_per_job, replace=True)
    OmegaConf.register_new_resolver("sweep_dir", sweep_dir, replace=True)
    OmegaConf.register_new_resolver("optuna_storage", optuna_storage, replace=True)
    OmegaConf.register_new_resolver("optuna_seed", optuna_seed, replace=True)
    OmegaConf.register_new_resolver("beir_sets", _beir_sets, replace=True)
    OmegaConf.register_new_resolver("if_homogeneous", if_homogeneous, replace=True)


def register_eval_sets(conf_dir: str | Path) -> list[str]:
    """Make ``eval=<name>`` select the one evaluation set ``conf/benchmark/<name>.yaml`` (with
    ``conf/eval/settings.yaml``) for every benchmark file, through Hydra's ConfigStore: each set is defined once, in
    its benchmark file, and no ``conf/eval`` file repeats it. A ``conf/eval/<name>.yaml`` file of the same name would
    win (Hydra reads the config path first); there is none. Returns the names registered."""
    from hydra.core.config_store import ConfigStore

    names = sorted(p.stem for p in Path(conf_dir, "benchmark").glob("*.yaml"))
    store = ConfigStore.instance()
    for name in names:
        store.store(group="eval", name=name,
                    node={"defaults": ["settings", {f"/benchmark@test_sets.{name}": name}, "_self_"]})
    return names


def compose_train(overrides: list[str]):
    """``conf/train.yaml`` composed with Hydra ``overrides`` outside a Hydra job (resolvers and evaluation sets
    registered first, as ``train.py`` does) → the DictConfig. Raises Hydra's errors for a bad override."""
    from hydra import compose, initialize_config_dir

    from multipos.assets import REPO_ROOT

    conf = REPO_ROOT / "conf"
    register_resolvers()
    register_eval_sets(conf)
    with initialize_config_dir(config_dir=str(conf), version_base="1.3"):
        return compose(config_name="train", overrides=overrides)
