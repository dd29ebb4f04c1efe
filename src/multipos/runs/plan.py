"""What ``make train`` will do and about how long it takes, printed before it starts.

``python -m multipos.runs.plan [--seeds 42,43,44] [--parallel-jobs 3] [--no-measure]`` prints the plan of the main
job on the embedded default and a wall-time estimate measured on this machine (:mod:`multipos.runs.speed`: a few
timed batches of encoding each corpus the job encodes and of its training step, scaled by the job's counts; 10-30 s,
kept in the cache so that a second plan does not measure again). With the caches already filled (a second run), the
corpora are not encoded again and the estimate says so. ``--no-measure`` prints the plan without an estimate."""

from __future__ import annotations

import argparse
import sys

from multipos.assets import assets_dir, built_assets_dir, cache_dir
from multipos.runs.speed import runs_at_once

__all__ = ["describe_estimate", "main"]


def describe_estimate(prediction: dict[str, float], speed, job, warm: bool, search_min: float = 0.0) -> str:
    """One line for a plan: the predicted minutes (:func:`multipos.runs.speed.predict`, plus ``search_min`` minutes
    of recipe search) and the measured rates they rest on."""
    rates = ", ".join(f"{c.name} {speed.passages_per_s[c.name]:.0f}/s at {c.max_length} tokens" for c in job.corpora)
    when = f"measured {speed.measured_at}, cached" if speed.cached else f"measured now in {speed.measuring_s:.0f} s"
    encode = "corpora cached: none encoded" if warm else f"{prediction['encode'] / 60:.0f} min encoding"
    search = f"{search_min:.0f} min of recipe search, " if search_min else ""
    total = prediction["total"] / 60 + search_min
    order = "side by side" if runs_at_once(job, speed) > 1 else "one after another"
    return (f"about {total:.0f} min ({search}{encode}, {prediction['train'] / 60:.0f} min training "
            f"{job.seeds} seed(s) {order}, {prediction['evaluate'] / 60:.0f} min evaluating; start-up, "
            f"BM25 and scoring not counted), from this machine's speed ({when}, {speed.precision}: passages {rates}; "
            f"a training step of {job.batch_size} queries {speed.step_s:.2f} s)")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m multipos.runs.plan", description=__doc__.split("\n\n")[0])
    ap.add_argument("--seeds", default="42,43,44")
    ap.add_argument("--parallel-jobs", type=int, default=1, help="seeds trained side by side (make train: one a seed)")
    ap.add_argument("--no-measure", action="store_true", help="print the plan without measuring this machine")
    args = ap.parse_args(argv)

    seeds = len(args.seeds.split(","))
    warm = any((cache_dir() / "embeddings").glob("*")) if (cache_dir() / "embeddings").is_dir() else False
    missing = [n for n in ("data/nfcorpus", "data/trec-dl-2019", "data/trec-dl-2020", "models/all-MiniLM-L6-v2")
               if not (assets_dir() / n).is_dir() and not (built_assets_dir() / n).is_dir()]
    print("make train: query-side fine-tuning of all-MiniLM-L6-v2 on NFCorpus (JointLH, M=4, every corpus passage a "
          f"candidate), {seeds} seed(s); NFCorpus dev picks each checkpoint; NFCorpus test and TREC DL 2019/2020 are "
          "scored at the end next to BM25 and the zero-shot start, with paired t-tests.")
    if missing:
        print(f"  first builds {', '.join(missing)} from their public sources (python -m multipos.assets list); "
              "no estimate before they exist")
        return 0
    if args.no_measure:
        return 0
    from dataclasses import replace

    from multipos.config_resolvers import compose_train
    from multipos.hardware import native_bf16
    from multipos.runs.speed import job_from_config, measure, predict

    job = replace(job_from_config(compose_train(["experiment=default"]), seeds=seeds), side_by_side=args.parallel_jobs)
    speed = measure(job, bf16=native_bf16())
    cached = frozenset(c.name for c in job.corpora) if warm else frozenset()
    print(f"  expected wall time: {describe_estimate(predict(job, speed, cached), speed, job, warm)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
