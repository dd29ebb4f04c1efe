"""The best recipes of a recipe search as config files: ``python -m multipos.report.recipes <sweep dir> [--top 3]``.

Reads every finished trial of a recipe-search sweep (``experiment=nfcorpus_recipe_search``: one run folder per
trial, its sweep overrides in ``.hydra/overrides.yaml``), ranks the trials by the metric the search maximised
(``optimized_metric``, e.g. ``nfcorpus_dev/ndcg@10``: dev only, the test set is never read), and writes one config
file per recipe, ``conf/recipe/top<i>.yaml`` (``# @package _global_``): config-group choices as ``defaults``
overrides, every other override as a key, and a comment naming the trial and its dev value.
``experiment=recipe_confirmation`` runs them with three seeds each (``recipe=top1,top2,top3``).

Group names that changed since the trials ran are mapped (:data:`RENAMED_GROUPS`: a trial's retired
``training_regime`` choice is a ``regime`` choice). Raises FileNotFoundError for a missing sweep folder and
ValueError when fewer finished trials than ``top`` hold the metric.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from omegaconf import OmegaConf

from multipos import atomic
from multipos.report.runs import load_run, override_map
from multipos.runs.find import sweep_runs

#: Config groups renamed after stored trials ran: old name → new name.
RENAMED_GROUPS = {"training_regime": "regime"}
#: Sweep overrides that are not part of a recipe.
NOT_RECIPE = ("seed", "hydra.", "experiment", "trainer.enable_progress_bar")


def ranked_trials(sweep: str | Path, metric: str | None = None) -> list[tuple[float, Path, dict[str, str]]]:
    """(value, run folder, recipe overrides) of every finished trial holding ``metric`` (``"<set>/<name>"``; default:
    the runs' ``optimized_metric``), best first; ties keep folder order."""
    finished, _ = sweep_runs(sweep)
    out = []
    for run_dir in finished:
        run = load_run(run_dir, require_per_query=False)
        key = metric or run.get("optimized_metric")
        if not key:
            raise ValueError(f"{run_dir}: no optimized_metric in its config; pass --metric <set>/<metric>")
        name, _, m = str(key).rpartition("/")
        if m not in run.metrics.get(name, {}):
            continue
        recipe = {RENAMED_GROUPS.get(k, k): v for k, v in override_map(run.overrides).items()
                  if not k.startswith(NOT_RECIPE)}
        out.append((float(run.metrics[name][m]), run_dir, recipe))
    return sorted(out, key=lambda t: -t[0])


def recipe_yaml(recipe: dict[str, str], conf_dir: str | Path, note: str) -> str:
    """A ``# @package _global_`` config holding ``recipe`` (override key → value): keys naming a config group
    (a folder of ``conf_dir``) become ``override /<group>: <choice>`` defaults, the rest nested keys typed as Hydra
    types command-line values. ``note`` becomes the header comment."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    groups = {k: v for k, v in recipe.items() if (Path(conf_dir) / k).is_dir()}
    rest = [f"{k}={v}" for k, v in recipe.items() if k not in groups]
    values = OmegaConf.create()
    for override in OverridesParser.create().parse_overrides(rest):  # 4 → 4, 1e-05 → float, corpus → "corpus"
        OmegaConf.update(values, override.key_or_group, override.value(), force_add=True)
    lines = ["# @package _global_", *[f"# {line}" for line in note.splitlines()]]
    if groups:
        lines += ["defaults:", *[f"  - override /{g}: {c}" for g, c in groups.items()]]
    body = OmegaConf.to_yaml(values).strip()
    return "\n".join(lines + ([body] if body and body != "{}" else [])) + "\n"


def write_recipes(sweep: str | Path, top: int, out_dir: str | Path, conf_dir: str | Path,
                  metric: str | None = None) -> list[Path]:
    """Write ``<out_dir>/top1.yaml`` … ``top<top>.yaml`` from the best ``top`` trials of ``sweep`` → their paths
    (each written atomically)."""
    trials = ranked_trials(sweep, metric)
    if len(trials) < top:
        raise ValueError(f"{sweep}: {len(trials)} finished trials hold the metric, fewer than --top {top}")
    paths = []
    for i, (value, run_dir, recipe) in enumerate(trials[:top], start=1):
        note = (f"Recipe top{i} of the recipe search {Path(sweep).name} ({len(trials)} finished trials): dev value "
                f"{value:.4f}, trial folder {run_dir.name}.\nWritten by: python -m multipos.report.recipes {sweep} "
                f"--top {top}")
        path = Path(out_dir) / f"top{i}.yaml"
        atomic.write_text(path, recipe_yaml(recipe, conf_dir, note))
        paths.append(path)
    return paths


def main(argv: list[str] | None = None) -> None:
    """``python -m multipos.report.recipes <sweep> [--top N] [--metric set/metric] [--conf DIR] [--out DIR]``: write
    the best ``--top`` recipes of a recipe search (:func:`write_recipes`) and print their paths."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("sweep", help="the recipe search's sweep folder, e.g. multirun/nfcorpus_recipe_search-cpu")
    ap.add_argument("--top", type=int, default=3)
    ap.add_argument("--metric", default=None, help="<set>/<metric> (default: the runs' optimized_metric)")
    ap.add_argument("--conf", default="conf", help="the Hydra config folder (config groups are its folders)")
    ap.add_argument("--out", default=None, help="where the files go (default: <conf>/recipe)")
    args = ap.parse_args(argv)
    paths = write_recipes(args.sweep, args.top, args.out or Path(args.conf) / "recipe", args.conf, args.metric)
    for p in paths:
        print(p)


if __name__ == "__main__":
    main()
