"""``python -m multipos.own_data``: the main job's method on your own data, in one command.

    python -m multipos.own_data run <BEIR folder | Tevatron .jsonl> [--budget-min 20] [--seeds 42,43,44]
    python -m multipos.own_data prepare <BEIR folder | Tevatron .jsonl>

``run`` prepares the data (:func:`multipos.own_data.prepare.prepare`: splits, positive tiers, lengths; printed
first, with what the command will do and about how long it takes), searches a recipe on the dev split within
``--budget-min`` minutes (:func:`multipos.own_data.search.search`; ``--budget-min 0`` keeps the main job's recipe),
trains it with each seed (query-side, every corpus passage a candidate, the checkpoint chosen on dev), and prints test
nDCG@10 mean ± sd with the paired t-test against the zero-shot start, next to BM25 (:mod:`multipos.report.summary`).
Everything lands in ``--out`` (default ``multirun/own_data-<name>``): ``search/trial-<n>/`` and ``seed=<s>/`` run
folders, ``search/trials.json``, ``recipe.json`` and ``summary.txt``. Re-running the command continues where it
stopped: finished trials and seeds are read back, not trained again.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from pathlib import Path

from multipos.assets import REPO_ROOT, cache_dir
from multipos.config_resolvers import compose_train


def _train(overrides: list[str], out: Path, extra: list[str] = ()) -> dict:
    """Train one run of ``experiment=own_data`` with ``overrides`` (recorded in ``overrides.txt``) and ``extra``
    (callbacks that do not change what is trained, e.g. the search's pruning) into ``out`` → its results."""
    from omegaconf import OmegaConf

    from multipos.train import train

    out.mkdir(parents=True, exist_ok=True)
    cfg = compose_train(["experiment=own_data", *overrides, *extra, f"paths.output_dir='{out}'"])
    (out / "overrides.txt").write_text("\n".join(overrides) + "\n", encoding="utf-8")
    # the run folder's config and overrides where Hydra would write them: the report reads them (seeds, objective)
    (out / ".hydra").mkdir(exist_ok=True)
    OmegaConf.save(cfg, out / ".hydra" / "config.yaml")
    (out / ".hydra" / "overrides.yaml").write_text("".join(f"- {o}\n" for o in overrides), encoding="utf-8")
    return train(cfg)


def _regime_problem(overrides: list[str], gold: int, silver: int) -> str | None:
    """Why the stage plan that ``overrides`` compose keeps no training positive of the prepared data (``gold`` and
    ``silver`` labels), or None (:func:`multipos.formats.types.regimes_without_positives`)."""
    from multipos.formats.types import REGIME_RULES, regimes_without_positives

    stages = compose_train(["experiment=own_data", *overrides]).stages
    empty = regimes_without_positives([stage.get("regime") for stage in stages.values()], gold, silver)
    if not empty:
        return None
    return (f"regime {empty[0]} keeps no training positive: the prepared data hold {gold} gold and {silver} silver "
            f"positive labels, and {REGIME_RULES[empty[0]]}. Leave the regime at its default (all), or give the tiers "
            "with --gold-grades / --silver-grades (BEIR qrels) or --gold-positives (Tevatron)")


def _estimate(overrides: list[str], budget_min: float, seeds: int, bf16: bool) -> str:
    """The wall-time estimate of ``run``, from this machine's speed (:mod:`multipos.runs.speed`: timed batches of
    encoding the prepared corpus and of a training step, cached): encoding, the search budget, then ``seeds`` seeds
    of the main job's 9 epochs (the recipe's epochs are not known before the search)."""
    from multipos.runs.plan import describe_estimate
    from multipos.runs.speed import job_from_config, measure, predict

    job = job_from_config(compose_train(["experiment=own_data", *overrides]), seeds=seeds, epochs=9)
    speed = measure(job, bf16=bf16)
    return describe_estimate(predict(job, speed), speed, job, warm=False, search_min=budget_min)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m multipos.own_data", description=__doc__.split("\n\n")[0])
    ap.add_argument("command", choices=("run", "prepare"))
    ap.add_argument("data", help="a BEIR folder (qrels/train.tsv, test.tsv; dev.tsv optional) or a Tevatron .jsonl")
    ap.add_argument("--budget-min", type=float, default=20.0, help="wall time of the recipe search (0: none)")
    ap.add_argument("--max-trials", type=int, default=50)
    ap.add_argument("--no-pruning", action="store_true",
                    help="train every search trial to its last epoch (default: successive halving stops the ones "
                         "behind after epochs 1 and 3)")
    ap.add_argument("--seeds", default="42,43,44")
    ap.add_argument("--gold-grades", type=lambda s: [int(x) for x in s.split(",")], default=None,
                    help="train qrels grades that are gold (e.g. 2); default: binary qrels one tier, "
                         "else the top grade")
    ap.add_argument("--silver-grades", type=lambda s: [int(x) for x in s.split(",")], default=None,
                    help="train qrels grades that are silver (e.g. 1)")
    ap.add_argument("--gold-positives", type=int, default=0, help="Tevatron: leading positives of a line that are gold")
    ap.add_argument("--model", default="all-MiniLM-L6-v2")
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("overrides", nargs="*", help="extra train.py overrides, e.g. trainer=gpu")
    args = ap.parse_intermixed_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")

    from transformers import AutoTokenizer

    from multipos.assets import resolve_model
    from multipos.hardware import native_bf16
    from multipos.own_data.prepare import prepare

    folder = resolve_model(args.model)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    cap = min(512, getattr(tokenizer, "model_max_length", 512) or 512)
    st_config = Path(folder) / "sentence_bert_config.json"  # the length a sentence-transformers model was trained at
    if st_config.is_file():
        cap = min(cap, int(json.loads(st_config.read_text()).get("max_seq_length") or cap))
    prepared = prepare(args.data, cache_dir() / "own_data", tokenizer, model_max_length=cap,
                       gold_grades=args.gold_grades, silver_grades=args.silver_grades,
                       gold_positives=args.gold_positives)
    c = prepared.counts
    print(f"data: {prepared.source}\n  prepared: {prepared.folder}\n  {c['passages']} passages; queries: "
          f"train {c['train_queries']}, dev {c['dev_queries']} ({prepared.dev}), test {c['test_queries']} "
          f"({prepared.test}); positive labels: gold {c['gold_labels']}, silver {c['silver_labels']}")
    for note in prepared.notes:
        print(f"  {note}")
    overrides = [*prepared.overrides(), f"model.name_or_path='{args.model}'", *args.overrides]
    problem = _regime_problem(overrides, c["gold_labels"], c["silver_labels"])
    if problem:
        print(f"{prepared.source}: {problem}", file=sys.stderr)
        return 2
    if c["gold_labels"] and c["silver_labels"] and args.command == "run" and args.budget_min > 0:
        print("  recipe search: the paper's five objectives; jointlh_weighted (grade-weighted soft targets) is not "
              "searched: on NFCorpus it helps at the main recipe but not with groups of G=8, and it needs a weight "
              "per grade (docs/objectives.md); try it with loss=jointlh_weighted 'data.source.grade_weights={2: 1.0, "
              "1: 0.5}'")
    if args.command == "prepare":
        print("train one seed with:\n  python train.py experiment=own_data " + " ".join(overrides))
        return 0

    seeds = [int(s) for s in args.seeds.split(",")]
    out = args.out or REPO_ROOT / "multirun" / f"own_data-{prepared.folder.name}"
    print(f"plan: query-side fine-tuning of {args.model} (every corpus passage a candidate); recipe search on dev for "
          f"{args.budget_min:.0f} min, then {len(seeds)} seeds of the best recipe, scored on test next to BM25 and the "
          f"zero-shot start, into {out}\n  expected wall time: "
          f"{_estimate(overrides, args.budget_min, len(seeds), native_bf16())}")
    start = time.time()
    recipe: dict = {}
    if args.budget_min > 0:
        from multipos.own_data.search import search

        def run_trial(trial: dict, folder: Path, extra: list[str]) -> float:
            results = _train([*overrides, *(f"{k}={v}" for k, v in trial.items()), "seed=42", "eval.test_sets={}",
                              "eval.references=false"], folder, extra)
            return float(results["own_dev"]["ndcg@10"])

        recipe, value, trials = search(run_trial, out / "search", args.budget_min * 60, args.max_trials,
                                       prune=not args.no_pruning)
        pruned = sum(t["state"] == "pruned" for t in trials)
        print(f"recipe search: {len(trials)} trials ({pruned} pruned), best dev nDCG@10 {value:.4f}: {recipe}")
    (out / "recipe.json").parent.mkdir(parents=True, exist_ok=True)
    (out / "recipe.json").write_text(json.dumps(recipe or "the main job's recipe", indent=1) + "\n")
    for seed in seeds:
        _train([*overrides, *(f"{k}={v}" for k, v in recipe.items()), f"seed={seed}"], out / "final" / f"seed={seed}")
    from multipos.report.summary import main as summary

    text = summary([str(out / "final")])
    (out / "summary.txt").write_text(text + "\n", encoding="utf-8")
    print(f"done in {(time.time() - start) / 60:.1f} min; summary in {out / 'summary.txt'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
