"""How far a judge agrees with human relevance grades: ``python -m multipos.annotate.agreement <annotation folder>``.

Reads an annotation run's candidate pools (``pools.json``), its judge's relevance grades (``qrels/relevance.tsv``;
a pair without a grade is one whose answer stayed malformed, ``malformed.jsonl``) and time (``summary.json``), and the
human grades of the same queries (``qrels/<split>.tsv`` of the BEIR folder; an unjudged pooled passage counts as not
relevant). A pair is *relevant* for the humans at grade ≥ ``--human-threshold`` (NFCorpus: 1 = indirect link, 2 =
direct) and for the judge at grade ≥ ``--judge-threshold`` (the pipeline's ``stages.relevance_threshold``).

Reported, for the LLM judge and for a dense model used as a score-threshold judge on the same pairs: Cohen's κ
(Cohen 1960, ``sklearn.metrics.cohen_kappa_score``) between the two binary labels, precision and recall of the judge's
"relevant" against the humans', and seconds per 1,000 judgements. The dense judge's threshold on the cosine score is
the one with the highest κ on another split's pools (``--calibration-split``), so it is not tuned on the pairs it is
scored on.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Sequence

__all__ = ["binary_agreement", "best_threshold", "main"]


def _rate(x: float | None) -> float | None:
    return None if x is None else round(x, 4)


def binary_agreement(human: Sequence[bool], judge: Sequence[bool]) -> dict:
    """Agreement of two binary labelings of the same pairs → ``{"pairs", "kappa", "precision", "recall",
    "judge_relevant", "human_relevant"}`` (precision and recall of ``judge`` against ``human``; None where undefined;
    rates rounded to 4 decimals).
    Raises ValueError when the sequences differ in length or are empty."""
    from sklearn.metrics import cohen_kappa_score

    if len(human) != len(judge) or not human:
        raise ValueError(f"binary_agreement: {len(human)} human and {len(judge)} judge labels (equal, non-zero)")
    tp = sum(h and j for h, j in zip(human, judge))
    n_judge, n_human = sum(judge), sum(human)
    kappa = float(cohen_kappa_score(list(human), list(judge))) if len(set(human) | set(judge)) > 1 else None
    return {"pairs": len(human), "kappa": _rate(kappa), "precision": _rate(tp / n_judge if n_judge else None),
            "recall": _rate(tp / n_human if n_human else None), "judge_relevant": n_judge, "human_relevant": n_human}


def best_threshold(scores: Sequence[float], human: Sequence[bool]) -> float:
    """The score threshold (a judge says relevant at score ≥ it) with the highest Cohen's κ against ``human``, among
    the scores themselves. Raises ValueError for no scores."""
    if not scores:
        raise ValueError("best_threshold: no scores")
    best, best_kappa = None, -2.0
    for t in sorted(set(scores)):
        k = binary_agreement(human, [s >= t for s in scores])["kappa"]
        if k is not None and k > best_kappa:
            best, best_kappa = t, k
    return float(best if best is not None else max(scores))


def _pairs(pools: dict, qrels: dict, threshold: int) -> tuple[list[tuple[str, str]], list[bool]]:
    pairs = [(q, p) for q, ps in pools.items() for p in ps]
    return pairs, [qrels.get(q, {}).get(p, 0) >= threshold for q, p in pairs]


def _dense_scores(model_name: str, corpus, queries: dict, pairs: list[tuple[str, str]]) -> tuple[list[float], float]:
    """Cosine scores of ``pairs`` under a sentence-transformers model → (scores, seconds)."""
    from sentence_transformers import SentenceTransformer

    from multipos.assets import resolve_model

    model = SentenceTransformer(str(resolve_model(model_name)), device="cpu")
    start = time.time()
    qids = sorted({q for q, _ in pairs})
    pids = sorted({p for _, p in pairs})
    qe = dict(zip(qids, model.encode([queries[q] for q in qids], normalize_embeddings=True)))
    pe = dict(zip(pids, model.encode(corpus.texts(pids), normalize_embeddings=True)))
    scores = [float(qe[q] @ pe[p]) for q, p in pairs]
    return scores, time.time() - start


def main(argv: Sequence[str] | None = None) -> dict:
    from multipos.annotate.candidates import pool_candidates
    from multipos.annotate.job import load_queries
    from multipos.assets import cache_dir, resolve_dataset
    from multipos.formats.beir import read_corpus
    from multipos.formats.trec import read_qrels

    ap = argparse.ArgumentParser(prog="python -m multipos.annotate.agreement", description=__doc__.split("\n")[0])
    ap.add_argument("annotations", type=Path, help="an annotation run's folder (annotate.py's out)")
    ap.add_argument("--data", default="nfcorpus", help="the BEIR folder or dataset name annotated")
    ap.add_argument("--split", default="dev", help="the qrels split of the annotated queries")
    ap.add_argument("--human-threshold", type=int, default=1)
    ap.add_argument("--judge-threshold", type=int, default=2)
    ap.add_argument("--dense", default="all-MiniLM-L6-v2", help="the score-threshold judge")
    ap.add_argument("--calibration-split", default="train")
    ap.add_argument("--calibration-queries", type=int, default=50)
    ap.add_argument("--out", type=Path, help="also write the report (JSON) here")
    args = ap.parse_args(argv)

    folder = resolve_dataset(args.data)
    corpus = read_corpus(folder / "corpus.jsonl")
    qrels = read_qrels(folder / "qrels" / f"{args.split}.tsv")
    pools = json.loads((args.annotations / "pools.json").read_text())
    graded = read_qrels(args.annotations / "qrels" / "relevance.tsv") if (
        args.annotations / "qrels" / "relevance.tsv").is_file() else {}
    summary = json.loads((args.annotations / "summary.json").read_text())
    pairs, human = _pairs(pools, qrels, args.human_threshold)
    parsed = [i for i, (q, p) in enumerate(pairs) if p in graded.get(q, {})]
    stage = summary["stages"]["relevance"]
    report = {"data": args.data, "split": args.split, "queries": len(pools), "pairs": len(pairs),
              "llm": {**binary_agreement([human[i] for i in parsed],
                                         [graded[pairs[i][0]][pairs[i][1]] >= args.judge_threshold for i in parsed]),
                      "malformed": len(pairs) - len(parsed), "calls": stage.get("calls"),
                      "s_per_1000": round(1000 * stage["seconds"] / max(1, len(pairs)), 1)}}
    queries = load_queries(folder, None, args.split, None)
    scores, seconds = _dense_scores(args.dense, corpus, queries, pairs)
    calib_queries = load_queries(folder, None, args.calibration_split, args.calibration_queries)
    calib_pools = pool_candidates(corpus, calib_queries, [{"kind": "bm25", "depth": 5},
                                                          {"kind": "dense", "model": args.dense, "depth": 5}],
                                  cache_dir() / "embeddings")
    calib_pairs, calib_human = _pairs(calib_pools, read_qrels(folder / "qrels" / f"{args.calibration_split}.tsv"),
                                      args.human_threshold)
    calib_scores, _ = _dense_scores(args.dense, corpus, calib_queries, calib_pairs)
    threshold = best_threshold(calib_scores, calib_human)
    report["dense"] = {**binary_agreement(human, [s >= threshold for s in scores]), "model": args.dense,
                       "threshold": round(threshold, 4), "calibrated_on": f"{args.calibration_split} "
                       f"({len(calib_pools)} queries, {len(calib_pairs)} pairs)",
                       "s_per_1000": round(1000 * seconds / max(1, len(pairs)), 2)}
    text = json.dumps(report, indent=1)
    print(text)
    if args.out:
        from multipos import atomic

        atomic.write_text(args.out, text + "\n")
    return report


if __name__ == "__main__":
    main()
