"""Are the label-noise study's false positives false? ``python -m multipos.report.noise_audit``.

The study (``conf/experiment/label_noise.yaml``, :mod:`multipos.data.label_noise`) replaces a share ρ of each
training query's positives by passages no qrels file judges relevant for it. Unjudged is not irrelevant: NFCorpus's
judgments come from links, not from reading every passage. For each kind and rate of the study this command
rebuilds the false positives its runs trained on (the same seeded draw; the ordering of positives does not change
which passages are drawn, so it is read as given) and reports:

* ``judged elsewhere``: the share that ``exclude: query`` (the study's runs before 2026-12-02) would have drawn
  although some split's qrels judge them relevant for the query
  (:func:`~multipos.data.label_noise.judged_in_every_split`); ``exclude: every_split`` draws none of them;
* ``likely relevant``: the share that a second signal marks likely relevant — the passage is in both the BM25 top-k
  and the starting checkpoint's dense top-k for the query (two unrelated rankers agreeing at the top);
* the same share for the true positives they replaced, which calibrates the signal: a false positive is about as
  "likely relevant" as a true one only when the signal cannot tell them apart.

    python -m multipos.report.noise_audit --out experiments/results/label_noise_audit.md

The numbers are computed here, not copied; the file says which command and data wrote it.
"""

from __future__ import annotations

import argparse
import copy
import logging
import time
from collections.abc import Sequence

from multipos import atomic

__all__ = ["agreeing_top", "audit_rows", "format_audit", "main"]

log = logging.getLogger(__name__)


def agreeing_top(first: dict[str, dict[str, float]], second: dict[str, dict[str, float]], k: int) -> dict[str, set]:
    """{query id → passages in the top ``k`` of both runs} (runs: {query id → {passage id → score}}; ties broken by
    passage id)."""
    def top(run, qid):
        scores = run.get(qid, {})
        return {p for p, _ in sorted(scores.items(), key=lambda x: (-x[1], x[0]))[:k]}
    return {qid: top(first, qid) & top(second, qid) for qid in first.keys() & second.keys()}


def audit_rows(overrides: Sequence[str] = (), kinds: Sequence[str] = ("bm25", "random"),
               rates: Sequence[float] = (0.1, 0.25, 0.5), k: int = 10) -> tuple[list[dict], dict]:
    """The audit's rows, one per (kind, rate): ``kind, rate, injected, judged_elsewhere, likely_relevant,
    replaced_likely_relevant`` (counts of passages), and a dict describing the data and signal.

    ``overrides``: Hydra overrides composed after ``experiment=label_noise`` (e.g. another ``data=``). Raises what
    loading the study's data source raises (missing files, format errors naming file and line)."""
    from hydra.utils import instantiate

    from multipos.assets import resolve_dataset
    from multipos.config_resolvers import compose_train
    from multipos.data.label_noise import LabelNoise, judged_in_every_split
    from multipos.formats.beir import read_queries
    from multipos.formats.types import BeirDataset
    from multipos.mining.dense_negatives import load_encoder
    from multipos.retrieval.bm25 import bm25_run
    from multipos.retrieval.dense import dense_run

    cfg = compose_train(["experiment=label_noise", *overrides, "data.source.ordering=given"])
    seed = int(cfg.data.source.label_noise.seed)
    cfg.data.source.label_noise = None  # the labels as published: each draw below starts from them
    source = instantiate(cfg.data.source)
    corpus, queries = source.load()

    folder = resolve_dataset(source.path)
    texts = read_queries(folder / "queries.jsonl")
    elsewhere = judged_in_every_split(folder, texts)
    data = BeirDataset(corpus=corpus, queries={q.query_id: q.query for q in queries}, qrels={}, name="noise-audit")
    bm25 = bm25_run(data, k=k)
    model = load_encoder(cfg.data.source.negative_model, dict(cfg.data.source.negative_encoder))
    dense = dense_run(model, data, k=k, bf16=False, progress=False)
    likely = agreeing_top(bm25, dense, k)
    rows = []
    for kind in kinds:
        for rate in rates:
            for exclude in ("query", "every_split"):
                qs = copy.deepcopy(queries)
                noise = LabelNoise(rate=rate, kind=kind, seed=seed, exclude=exclude)
                noise.apply(qs, corpus.ids, elsewhere)
                injected = judged = hits = replaced_hits = replaced = 0
                for qid, rec in noise.record.items():
                    top = likely.get(qid, set())
                    injected += len(rec["false_positives"])
                    judged += sum(p in elsewhere.get(qid, set()) for p in rec["false_positives"])
                    hits += sum(p in top for p in rec["false_positives"])
                    replaced += len(rec["replaced"])
                    replaced_hits += sum(p in top for p in rec["replaced"])
                rows.append({"kind": kind, "rate": rate, "exclude": exclude, "injected": injected,
                             "judged_elsewhere": judged, "likely_relevant": hits, "replaced": replaced,
                             "replaced_likely_relevant": replaced_hits})
    about = {"data": f"{source.path} ({source.qrels_file}, {len(queries)} training queries)",
             "dense": f"{cfg.data.source.negative_model} ({model.pooling} pooling{', L2' if model.normalize else ''}, "
                      "fp32)", "k": k, "seed": seed}
    return rows, about


def _share(n: int, total: int) -> str:
    return f"{n / total:.2%} ({n})" if total else "n/a"


def format_audit(rows: Sequence[dict], about: dict, command: str) -> str:
    """The Markdown page of :func:`audit_rows`."""
    k = about["k"]
    lines = ["Table: are the label-noise study's false positives false? (shares of the drawn passages)", "",
             "| false positives | ρ | exclude | drawn | judged relevant in some split | likely relevant "
             f"(BM25 and dense top-{k} agree) | replaced true positives likely relevant |",
             "|:---|---:|:---|---:|---:|---:|---:|"]
    for r in rows:
        shares = (_share(r["judged_elsewhere"], r["injected"]), _share(r["likely_relevant"], r["injected"]),
                  _share(r["replaced_likely_relevant"], r["replaced"]))
        lines.append(f"| {r['kind']} | {r['rate']:g} | {r['exclude']} | {r['injected']} | " + " | ".join(shares) + " |")
    lines += ["", f"Data: {about['data']}; dense ranker: {about['dense']}; label-noise seed {about['seed']}. "
              "`exclude: every_split` is what the study's runs draw (conf/experiment/label_noise.yaml); `query` is "
              "the draw of its runs before 2026-12-02, kept here to show what changed. The last column calibrates "
              "the signal on the true positives each draw replaced.", "", f"Written by `{command}`."]
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m multipos.report.noise_audit", description=__doc__.split("\n")[0])
    parser.add_argument("--out", help="Markdown file to write (default: print)")
    parser.add_argument("--k", type=int, default=10, help="top-k of both rankers (default 10)")
    parser.add_argument("overrides", nargs="*", help="Hydra overrides after experiment=label_noise")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    start = time.time()
    rows, about = audit_rows(args.overrides, k=args.k)
    command = " ".join(["python -m multipos.report.noise_audit", *(["--out", args.out] if args.out else []),
                        *([f"--k {args.k}"] if args.k != 10 else []), *args.overrides])
    text = format_audit(rows, about, command)
    if args.out:
        atomic.write_text(args.out, text)
        log.info("wrote %s (%.0f s)", args.out, time.time() - start)
    else:
        print(text, end="")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
