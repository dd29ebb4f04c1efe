"""What ``make train`` will do and about how long it takes, printed before it starts.

``python -m multipos.runs.plan [--seeds 42,43,44]`` prints the plan of the main job on the embedded default and a
wall-time estimate for this machine from measured runs of the same command on a fresh clone (cold caches): about
22 min on a 2-core CPU without native bf16 (fp32; most of it encoding NFCorpus and the TREC DL sub-corpora), about
7 min on a 2-core CPU with native bf16, about 3 min on one H100 / H200 GPU (README.md, "Set-up"). With the caches
already filled (a second run), the corpora are not encoded again.
"""

from __future__ import annotations

import argparse
import sys

from multipos.assets import assets_dir, built_assets_dir, cache_dir

__all__ = ["estimate_minutes", "main"]

#: Measured ``make train`` wall times (fresh clone, cold caches, three seeds), minutes.
MEASURED_MINUTES = {"cpu-fp32": 22, "cpu-bf16": 7, "gpu": 3}


def estimate_minutes(kind: str, warm: bool, seeds: int = 3) -> float:
    """Estimated minutes of ``make train`` on ``kind`` (``cpu-fp32`` | ``cpu-bf16`` | ``gpu``) for ``seeds`` seeds:
    the measured three-seed time split into preparing (about 60 %: encoding the corpora, mining, references; none
    when ``warm``, the caches already filled) and training (about 40 %, in proportion to the seeds)."""
    measured = MEASURED_MINUTES[kind]
    return (0.0 if warm else 0.6 * measured) + 0.4 * measured * seeds / 3


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m multipos.runs.plan", description=__doc__.split("\n\n")[0])
    ap.add_argument("--seeds", default="42,43,44")
    args = ap.parse_args(argv)
    import torch

    from multipos.hardware import native_bf16

    kind = "gpu" if torch.cuda.is_available() else "cpu-bf16" if native_bf16() else "cpu-fp32"
    seeds = len(args.seeds.split(","))
    warm = any((cache_dir() / "embeddings").glob("*")) if (cache_dir() / "embeddings").is_dir() else False
    missing = [n for n in ("data/nfcorpus", "data/trec-dl-2019", "data/trec-dl-2020", "models/all-MiniLM-L6-v2")
               if not (assets_dir() / n).is_dir() and not (built_assets_dir() / n).is_dir()]
    print("make train: query-side fine-tuning of all-MiniLM-L6-v2 on NFCorpus (JointLH, M=4, every corpus passage a "
          f"candidate), {seeds} seed(s); NFCorpus dev picks each checkpoint; NFCorpus test and TREC DL 2019/2020 are "
          "scored at the end next to BM25 and the zero-shot start, with paired t-tests.")
    if missing:
        print(f"  first builds {', '.join(missing)} from their public sources (python -m multipos.assets list)")
    how = {"gpu": "on a GPU", "cpu-bf16": "on a CPU with native bf16",
           "cpu-fp32": "on a CPU without native bf16 (fp32)"}[kind]
    print(f"  expected wall time {how}: about {estimate_minutes(kind, warm, seeds):.0f} min"
          f"{' (caches warm)' if warm else ' (the corpora are encoded once, then cached)'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
