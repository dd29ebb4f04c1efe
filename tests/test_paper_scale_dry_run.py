"""The paper's own setting end to end on miniatures: fetch → convert → train two-tower → evaluate → render.

Every public file the paper-scale path reads is served on 127.0.0.1 in its published layout
(:mod:`tests.paper_miniature`: MS MARCO's tarball, TREC DL queries and NIST qrels, DPR's passages and NQ questions,
the 14 BEIR zips), and the hub repositories the training data come from (Zhang et al.'s annotation records,
Tevatron's MS MARCO groups) by a fake hub endpoint (:class:`tests.assets.fake_hub.FakeHub`, ``HF_ENDPOINT``).
Nothing is fetched beforehand: the jobs build each asset on first use. The commands are the documented ones
(docs/paper-scale.md) with ``scale=paper``; only the encoder is the tiny BERT of the fixtures and the trainer the CPU
one (``scale=paper_dryrun``: the paper scale with that encoder; ``trainer=cpu_fp32``; set in a config folder the test
adds to Hydra's search path, so no cell name changes). The scale's own recipe stays: G=8, M=4, batch 128,
3 epochs, lr 3e-5.
"""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from multipos.report.render import render_sweep
from tests.assets.fake_hub import FakeHub
from tests.assets.http_mirror import LocalServers
from tests.paper_miniature import PER_TOPIC, TOPICS, msmarco_members, publish_evaluation_sets

REPO = Path(__file__).resolve().parents[1]


def _hub_files() -> tuple[dict[str, bytes], dict[str, bytes]]:
    """Zhang et al.'s annotation records and Tevatron's MS MARCO groups for the miniature's training queries.

    Each training query's group: its human positive (qrels.train), then as negatives the other passages of its topic
    and two of another topic. The LLM marks the human positive and two further passages of its topic useful, in a
    ranking that puts one of those first."""
    members = msmarco_members()
    texts = dict(line.split("\t", 1) for line in members["collection.tsv"].splitlines())
    queries = dict(line.split("\t", 1) for line in members["queries.train.tsv"].splitlines())
    human = {line.split("\t")[0]: line.split("\t")[2] for line in members["qrels.train.tsv"].splitlines()}
    groups, records = [], []
    n = len(TOPICS) * PER_TOPIC
    for qid, query in queries.items():
        pos = int(human[qid])
        topic = pos // PER_TOPIC
        same = [topic * PER_TOPIC + k for k in range(PER_TOPIC) if topic * PER_TOPIC + k != pos]
        other = [(pos + PER_TOPIC + k) % n for k in (0, 1)]
        passage = lambda i: {"docid": str(i), "title": "", "text": texts[str(i)]}  # noqa: E731
        groups.append({"query_id": qid, "query": query, "positive_passages": [passage(pos)],
                       "negative_passages": [passage(i) for i in same + other]})
        candidates = [str(i) for i in [pos, *same, *other]]
        useful = {str(pos), str(same[0]), str(same[1])}
        records.append({"query_id": qid, "passages_ids": candidates,
                        "relevance_score": [int(c in useful or c == str(same[2])) for c in candidates],
                        "utility_score": [int(c in useful) for c in candidates],
                        "ranked_passage_ids": [str(same[1]), str(pos), str(same[0])]})
    annotations = {"msmarco/msmarco_utility_annotation.jsonl":
                   "".join(json.dumps(r) + "\n" for r in records).encode()}
    tevatron = {"train.jsonl.gz": gzip.compress("".join(json.dumps(g) + "\n" for g in groups).encode())}
    return annotations, tevatron


def _dry_run_configs(folder: Path, tiny_bert: Path) -> None:
    """``scale=paper_dryrun``: the paper scale with the tiny encoder; its out-of-domain sets are the paper's."""
    (folder / "scale").mkdir(parents=True)
    (folder / "eval").mkdir()
    (folder / "scale" / "paper_dryrun.yaml").write_text(f"""# @package _global_
defaults:
  - paper
  - _self_
model:
  name_or_path: {tiny_bert}
  query_max_length: 16
  passage_max_length: 32
eval:
  bf16: false
  k: 20
  batch_size: 32
  passage_max_length: 32
""")
    (folder / "eval" / "paper_dryrun_out_of_domain.yaml").write_text("defaults:\n  - paper_out_of_domain\n")


def _run(args: list[str], cwd: Path, env: dict, pins: Path) -> str:
    """Run ``python -m tests.paper_miniature PINS ARGS`` in ``cwd``: the child's registry is pinned to the
    miniatures' hashes, then it runs the script of ARGS."""
    p = subprocess.run([sys.executable, "-m", "tests.paper_miniature", str(pins), *args], cwd=cwd, env=env,
                       capture_output=True, text=True, timeout=900)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-6000:]
    return p.stdout + p.stderr


def test_the_paper_setting_runs_end_to_end_from_published_layouts(tiny_bert, tmp_path):
    pins = tmp_path / "pins.json"
    pins.write_text(json.dumps(publish_evaluation_sets(tmp_path / "mirror")))
    extra = tmp_path / "conf"
    _dry_run_configs(extra, tiny_bert)
    annotations, tevatron = _hub_files()
    search = f"hydra.searchpath=[file://{extra}]"
    with LocalServers() as serve, FakeHub() as hub:
        hub.publish("hengranZhang/Utility_focused_annotation", annotations)
        hub.publish("Tevatron/msmarco-passage", tevatron)
        env = {**os.environ, "MULTIPOS_ASSETS": str(tmp_path / "assets"), "MULTIPOS_CACHE": str(tmp_path / "cache"),
               "MULTIPOS_MIRROR": serve(tmp_path / "mirror"), "HF_ENDPOINT": hub.url, "HF_HUB_OFFLINE": "0",
               "MULTIPOS_DOWNLOAD_RETRIES": "0", "PYTHONPATH": str(REPO), "WANDB_MODE": "offline"}
        common = ["scale=paper_dryrun", "trainer=cpu_fp32", search, "trainer.enable_progress_bar=false"]
        # Table 4's cell (two-tower JointLH, heterogeneous) and Table 2's (homogeneous), as docs/paper-scale.md says
        for study in ("table4_heterogeneous", "table2_homogeneous"):
            _run([str(REPO / "train.py"), "-m", f"experiment={study}", *common, "hydra.sweeper.params.loss=jointlh"],
                 tmp_path, env, pins)
        # Table 3: Table 2's model on the 14 BEIR sets
        _run([str(REPO / "evaluate.py"), "-m", "experiment=table3_ood", "scale=paper_dryrun", search,
              "hydra.sweeper.params.objective=jointlh"], tmp_path, env, pins)
        # NQ test (Acc@20 by answer match over DPR's passages) of the Table 4 model
        cell = tmp_path / "multirun" / "table4_heterogeneous-paper" / "loss=jointlh,seed=42"
        _run([str(REPO / "evaluate.py"), "scale=paper_dryrun", search, "eval=nq_test", f"init_from='{cell / 'model'}'",
              f"paths.output_dir={tmp_path / 'nq'}"], tmp_path, env, pins)
    out = tmp_path / "results"
    for study in ("table4_heterogeneous", "table2_homogeneous", "table3_ood"):  # python -m multipos.report.render
        render_sweep(tmp_path / "multirun" / f"{study}-paper", out)

    built = tmp_path / "assets" / "data"
    prepared = json.loads((tmp_path / "cache" / "assets" / "data" / "msmarco-multipos" / "prepared.json").read_text()) \
        if not (built / "msmarco-multipos").is_dir() else json.loads((built / "msmarco-multipos" / "prepared.json")
                                                                      .read_text())
    assert prepared  # the counts of what each regime kept sit beside the data
    metrics = json.loads((cell / "metrics.json").read_text())
    metrics.update(json.loads((tmp_path / "nq" / "metrics.json").read_text()))
    for name, metric in (("msmarco_dev", "mrr@10"), ("trec_dl19_full", "ndcg@10"), ("trec_dl20_full", "ndcg@10"),
                         ("nq_test", "acc@20")):
        assert 0.0 <= metrics[name][metric] <= 1.0, (name, metrics[name])
    ood = json.loads((tmp_path / "multirun" / "table3_ood-paper" / "objective=jointlh,seed=42" / "metrics.json")
                     .read_text())
    assert {"beir_average", "cqadupstack", "scifact", "cqadupstack-gis"} <= set(ood)
    beir = [s for s in ood if s not in ("beir_average",) and not s.startswith("cqadupstack-")]
    assert len(beir) == 14
    assert ood["beir_average"]["ndcg@10"] == pytest.approx(sum(ood[s]["ndcg@10"] for s in beir) / 14)
    table2 = (out / "table2_homogeneous_paper.md").read_text()  # Table 2's columns
    assert "| objective | msmarco_dev MRR@10 | msmarco_dev R@1000 | trec_dl19_full nDCG@10 | trec_dl20_full nDCG@10 |" \
        in table2 and "| jointlh |" in table2
    assert "| jointlh |" in (out / "table4_heterogeneous_paper.md").read_text()
    table3 = (out / "table3_ood_paper.md").read_text()  # Table 3's: the 14 sets (CQADupStack one), their average
    header = next(line for line in table3.splitlines() if line.startswith("| objective"))
    assert header.count("nDCG@10") == 15 and "cqadupstack nDCG@10 | beir_average nDCG@10 |" in header
    assert "| BM25 |" in table3 and "| zero-shot |" in table3 and "| jointlh |" in table3
