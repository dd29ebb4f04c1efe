"""Memory and time arithmetic for exact and approximate search over the paper's large corpora; prints the
Markdown tables quoted in docs/gpu-and-scale-out.md (``python bench/corpus_arithmetic.py``; nothing is measured here).

Memory: embeddings N·d·b bytes (b = 4 for float32, 2 for float16); FAISS ``IndexFlatIP`` stores float32 (a GPU
flat index can store float16); ``IndexHNSWFlat`` adds its graph, ≈ 2·M int32 links per vector on level 0 plus
≈ M·4/(M−1) bytes on the upper levels; ``IndexIVFFlat`` adds an 8-byte id per vector and nlist·d·4 bytes of
centroids (nlist = :func:`multipos.retrieval.dense.default_nlist`). Shards per GPU:
:func:`multipos.retrieval.shards.shards_for_memory` with 85 % of the GPU's memory as the budget (the rest for the CUDA
context and search buffers).

Time: exact search costs Q·N·d multiply-adds; the rate is taken from the newest ``flat_search_s`` line in
``bench/results/search.jsonl`` of full size (queries·n·dim / seconds; a quick line only when there is none), so
the estimate is for the machine that ran it.
"""

from __future__ import annotations

import json
from pathlib import Path

CORPORA = {"MS MARCO passages": (8_841_823, 768, "dev", 6_980), "NQ / DPR Wikipedia": (21_015_324, 768, "test", 3_610)}
GPUS_GB = (16, 24, 40, 80, 141)
GB = 1e9


def measured_rate(results: Path = Path(__file__).resolve().parent / "results" / "search.jsonl"):
    """(multiply-adds per second of exact FAISS search, the result line it comes from), newest line first."""
    lines = [json.loads(line) for line in results.read_text().splitlines() if line.strip()] if results.is_file() else []
    timed = [r for r in lines if r.get("flat_search_s")]
    full = [r for r in timed if r.get("size", "full") == "full"]  # quick runs search too little to give a rate
    for r in reversed(full or timed):
        return r["queries"] * r["n"] * r["dim"] / r["flat_search_s"], r
    return None, None


def main() -> None:
    from multipos.retrieval.dense import default_nlist
    from multipos.retrieval.shards import shards_for_memory

    print("| corpus | embeddings fp32 | fp16 | flat index (fp32) | HNSW M=32 | IVF-Flat (nlist) |")
    print("|---|---|---|---|---|---|")
    for name, (n, d, _, _) in CORPORA.items():
        m = 32
        hnsw = n * (d * 4 + 2 * m * 4 + m * 4 / (m - 1))
        nlist = default_nlist(n)
        ivf = n * (d * 4 + 8) + nlist * d * 4
        print(f"| {name} ({n:,} × {d}) | {n * d * 4 / GB:.1f} GB | {n * d * 2 / GB:.1f} GB | {n * d * 4 / GB:.1f} GB "
              f"| {hnsw / GB:.1f} GB | {ivf / GB:.1f} GB ({nlist:,}) |")
    print()
    print("| corpus | " + " | ".join(f"{g} GB GPU fp32 / fp16" for g in GPUS_GB) + " |")
    print("|---|" + "---|" * len(GPUS_GB))
    for name, (n, d, _, _) in CORPORA.items():
        cells = [f"{shards_for_memory(n, d, 0.85 * g * GB)} / {shards_for_memory(n, d, 0.85 * g * GB, 2)}"
                 for g in GPUS_GB]
        print(f"| {name} | " + " | ".join(cells) + " |")
    rate, line = measured_rate()
    if rate is None:
        print("\nno flat search measurement in bench/results/search.jsonl: run make bench")
        return
    print(f"\nExact search, Q·N·d multiply-adds at {rate / 1e9:.0f} G/s (flat search of {line['queries']:,} × "
          f"{line['n']:,} × {line['dim']} in {line['flat_search_s']} s, {line.get('cpus')} CPUs, {line['time'][:10]}):")
    for name, (n, d, split, q) in CORPORA.items():
        secs = q * n * d / rate
        print(f"- {name}, {q:,} {split} queries: {q * n * d:.2e} multiply-adds ≈ {secs / 60:.0f} min")


if __name__ == "__main__":
    main()
