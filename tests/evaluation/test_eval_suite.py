"""The evaluation suite: set selection, BEIR folder lists with averages, qrels views (hybrid annotation),
self-hit removal, Acc@k, paper-scale set configs on fixtures, and bad-input handling."""

from __future__ import annotations

import json
import logging
import shutil
from dataclasses import replace
from pathlib import Path

import pytest
from hydra.utils import instantiate

from multipos.evaluation.metrics import evaluate_run
from multipos.evaluation.runner import add_average
from multipos.evaluation.sets import EvalSet, beir_sets
from multipos.formats.beir import load_beir
from multipos.formats.trec import read_qrels, read_run
from multipos.formats.types import DataFormatError
from tests.helpers import CONF, compose_cfg

#: the eval files, and one eval choice per benchmark file (multipos.config_resolvers.register_eval_sets)
EVAL_CONFIGS = sorted({p.stem for p in (Path(CONF) / "eval").glob("*.yaml") if p.stem not in ("settings", "beir")}
                      | {p.stem for p in (Path(CONF) / "benchmark").glob("*.yaml")})


# --- selecting sets ------------------------------------------------------------------------------------------

def test_comma_list_of_sets_becomes_a_hydra_list_selection():
    from multipos.evaluate import set_list_override

    argv = ["evaluate.py", "eval=nfcorpus_test,trec_dl19", "model=minilm", "eval.k=10"]
    assert set_list_override(argv) == ["evaluate.py", "eval=[nfcorpus_test,trec_dl19]", "model=minilm", "eval.k=10"]
    assert set_list_override(["e.py", "-m", "eval=a,b"]) == ["e.py", "-m", "eval=a,b"]  # a sweep stays a sweep
    assert set_list_override(["e.py", "eval=[a,b]", "eval.paths=[x,y]"]) == ["e.py", "eval=[a,b]", "eval.paths=[x,y]"]


def test_several_sets_in_one_evaluation():
    cfg = compose_cfg("evaluate", ["eval=[nfcorpus_test,trec_dl19,hybrid_annotation]"])
    assert list(cfg.eval.test_sets) == ["nfcorpus_test", "trec_dl19", "hybrid_annotation"]
    assert cfg.eval.k == 1000 and cfg.eval.references is False


@pytest.mark.parametrize("name", EVAL_CONFIGS)
def test_every_eval_config_instantiates(name):
    cfg = compose_cfg("evaluate", [f"eval={name}"])
    sets = [instantiate(s) for s in cfg.eval.test_sets.values()]
    if cfg.eval.get("validation"):  # training configs also name a dev set (dev_only has nothing else)
        sets.append(instantiate(cfg.eval.validation))
    assert sets and all(s.name and s.metrics for s in sets)
    if name == "nq_test":
        assert sets[0].metrics == ["acc@20", "acc@100"]
    if name == "msmarco_dev":
        assert {"mrr@10", "recall@100", "recall@1000"} <= set(sets[0].metrics) and sets[0].split == "dev"


# --- metrics -------------------------------------------------------------------------------------------------

def test_acc_at_k_is_hit_rate_against_qrels():
    qrels = {"q1": {"a": 1}, "q2": {"b": 2}, "q3": {"c": 1}}
    run = {"q1": {"a": 3.0, "x": 1.0}, "q2": {"x": 3.0, "y": 2.0, "b": 1.0}, "q3": {"x": 1.0}}
    res, _ = evaluate_run(qrels, run, ["acc@1", "acc@3"], relevance_threshold=2, per_query=True)
    # threshold 2: only q2 counts (its passage b at rank 3)
    assert res == {"acc@1": 0.0, "acc@3": 1.0}
    res = evaluate_run(qrels, run, ["acc@1", "acc@3"], relevance_threshold=1)
    assert res["acc@1"] == pytest.approx(1 / 3) and res["acc@3"] == pytest.approx(2 / 3)


def test_qrels_without_any_relevant_passage_fail_clearly():
    with pytest.raises(ValueError, match="grade >= 3"):
        evaluate_run({"q": {"a": 1}}, {"q": {"a": 1.0}}, ["mrr@10"], relevance_threshold=3)


def test_average_row_is_the_unweighted_mean():
    results = {"a": {"ndcg@10": 0.2, "recall@100": 0.5}, "b": {"ndcg@10": 0.4}}
    add_average(results, "beir_average")
    assert results["beir_average"] == {"ndcg@10": pytest.approx(0.3)}  # only metrics every set has
    single = add_average({"a": {"ndcg@10": 0.2}}, "avg")
    assert "avg" not in single
    with_views = add_average({"a": {"m": 0.2}, "a.gold": {"m": 0.9}, "b": {"m": 0.4}}, "avg", ["a", "b"])
    assert with_views["avg"] == {"m": pytest.approx(0.3)}  # views are not averaged in


# --- BEIR folder lists ---------------------------------------------------------------------------------------

def _copy_with_self_passage(src: Path, dst: Path, qid: str) -> Path:
    """A copy of a BEIR folder whose corpus also holds a passage with id ``qid`` (as ArguAna/Quora do)."""
    shutil.copytree(src, dst)
    with (dst / "corpus.jsonl").open("a") as f:
        f.write(json.dumps({"_id": qid, "title": "", "text": "the query itself"}) + "\n")
    return dst


def test_beir_list_scores_each_folder_and_the_average(tiny_beir, tmp_path):
    from multipos.evaluate import evaluate

    arguana = _copy_with_self_passage(tiny_beir, tmp_path / "arguana", "q-heart-1")
    scifact = _copy_with_self_passage(tiny_beir, tmp_path / "scifact", "q-heart-1")
    run = tmp_path / "run.trec"
    run.write_text("q-heart-1 Q0 q-heart-1 1 3.0 t\nq-heart-1 Q0 heart-0 2 2.0 t\nq-diet-1 Q0 bone-0 1 1.0 t\n")
    out = tmp_path / "eval"
    cfg = compose_cfg("evaluate", ["eval=beir", f"eval.paths=[{arguana},{scifact}]", "eval.metrics=[mrr@10,ndcg@10]",
                                   f"run_file={run}", f"paths.output_dir={out}"])
    results = evaluate(cfg)
    assert list(results) == ["arguana", "scifact", "beir_average"]
    # 3 test queries (q-heart-1, q-diet-1, q-bone-1); only q-heart-1 has a relevant hit.
    assert results["arguana"]["mrr@10"] == pytest.approx(1 / 3)       # self-hit removed: heart-0 at rank 1
    assert results["scifact"]["mrr@10"] == pytest.approx(1 / 3 / 2)   # kept: heart-0 at rank 2
    assert results["beir_average"]["mrr@10"] == pytest.approx((1 / 3 + 1 / 6) / 2)
    assert json.loads((out / "metrics.json").read_text()) == json.loads(json.dumps(results))
    per_q = json.loads((out / "per_query.arguana.json").read_text())
    assert per_q["mrr@10"]["q-heart-1"] == 1.0
    assert "q-heart-1" not in (out / "run.arguana.trec").read_text().split("Q0")[1]  # run written as scored


def test_beir_sets_rejects_empty_and_clashing_folders(tmp_path):
    with pytest.raises(ValueError, match="eval.paths is empty"):
        beir_sets([])
    with pytest.raises(ValueError, match="two folders are named 'scifact'"):
        beir_sets([tmp_path / "a" / "scifact", tmp_path / "b" / "scifact"])
    sets = beir_sets(["/data/quora", "/data/nq"])
    assert sets["quora"]["remove_self_hits"] and not sets["nq"]["remove_self_hits"]


# --- qrels views: hybrid annotation --------------------------------------------------------------------------

def test_views_score_one_run_against_gold_and_silver_labels(tiny_beir, caplog):
    es = EvalSet("hybrid", str(tiny_beir), split="test", qrels_file="qrels-graded/test.s-3.qrel",
                 metrics=["recall@100", "mrr@10"], views={"gold": {"grades": [2]}, "silver": {"grades": [1]}})
    data = es.load()
    # tiny_beir: each judged query has passages <topic>-0,1 at grade 2 and <topic>-2..5 at grade 1
    run = {q: {f"{q.split('-')[1]}-0": 2.0, f"{q.split('-')[1]}-2": 1.0} for q in data.queries}
    scored = es.score(run, data)
    assert list(scored) == ["hybrid", "hybrid.gold", "hybrid.silver"]
    assert scored["hybrid"][0]["recall@100"] == pytest.approx(2 / 6)
    assert scored["hybrid.gold"][0]["recall@100"] == pytest.approx(1 / 2)
    assert scored["hybrid.silver"][0]["recall@100"] == pytest.approx(1 / 4)
    assert scored["hybrid.silver"][0]["mrr@10"] == pytest.approx(1 / 2)  # silver hit at rank 2
    assert set(scored["hybrid.gold"][1]["mrr@10"]) == set(data.queries)

    # a query judged gold only: the silver view neither scores it nor reports it as a dropped run query
    gold_only = replace(data, qrels={**data.qrels, "q-heart-1": {"heart-0": 2}})
    with caplog.at_level(logging.WARNING):
        scored = es.score({**run, "q-heart-1": {"bone-0": 1.0}}, gold_only)
    assert "without qrels" not in caplog.text
    assert "q-heart-1" not in scored["hybrid.silver"][1]["recall@100"]
    assert scored["hybrid.gold"][1]["recall@100"]["q-heart-1"] == 0.0


def test_view_from_its_own_qrels_file_and_merged_qrels(tiny_beir, tmp_path):
    folder = shutil.copytree(tiny_beir, tmp_path / "mixed")
    (folder / "qrels-llm").mkdir()
    (folder / "qrels-llm" / "test.tsv").write_text("query-id\tcorpus-id\tscore\n"
                                                   "q-heart-1\theart-7\t1\nq-heart-1\theart-0\t1\n")
    es = EvalSet("mixed", str(folder), split="test", qrels_file=["qrels/test.tsv", "qrels-llm/test.tsv"],
                 metrics=["recall@100"],
                 views={"human": {"qrels_file": "qrels/test.tsv"}, "llm": {"qrels_file": "qrels-llm/test.tsv"}})
    data = es.load()
    assert data.qrels["q-heart-1"]["heart-7"] == 1 and data.qrels["q-heart-1"]["heart-0"] == 2  # max grade kept
    scored = es.score({"q-heart-1": {"heart-7": 1.0}}, data)
    assert scored["mixed.llm"][0]["recall@100"] == pytest.approx(1 / 2)   # one query with 2 LLM positives
    assert scored["mixed.human"][0]["recall@100"] == 0.0
    with pytest.raises(ValueError, match="unknown keys"):
        EvalSet("x", str(folder), views={"v": {"grade": [1]}}).score({}, data)


def test_hybrid_annotation_on_real_nfcorpus_graded_qrels(assets):
    cfg = compose_cfg("evaluate", ["eval=hybrid_annotation", "eval.test_sets.hybrid_annotation.max_queries=40"])
    es = instantiate(cfg.eval.test_sets.hybrid_annotation)
    data = es.load()
    views = es.view_qrels(data)
    gold, silver = views["hybrid_annotation.gold"], views["hybrid_annotation.silver"]
    assert all(g == 2 for docs in gold.values() for g in docs.values())
    assert all(g == 1 for docs in silver.values() for g in docs.values())
    pairs = sum(map(len, data.qrels.values()))
    assert pairs == sum(map(len, gold.values())) + sum(map(len, silver.values()))


# --- paper-scale sets on fixtures ----------------------------------------------------------------------------

def test_msmarco_dev_config_on_a_beir_layout_fixture(tiny_beir, tmp_path, monkeypatch):
    from multipos.evaluate import evaluate

    assets = tmp_path / "assets"
    shutil.copytree(tiny_beir, assets / "data" / "msmarco-passage")
    monkeypatch.setenv("MULTIPOS_ASSETS", str(assets))
    run = tmp_path / "run.trec"
    run.write_text("q-sleep-1 Q0 sleep-1 1 2.0 t\nq-cancer-1 Q0 bone-1 1 2.0 t\nq-cancer-1 Q0 cancer-3 2 1.0 t\n")
    cfg = compose_cfg("evaluate", ["eval=msmarco_dev", f"run_file={run}", f"paths.output_dir={tmp_path / 'e'}"])
    res = evaluate(cfg)["msmarco_dev"]
    # dev queries in tiny_beir: q-cancer-1, q-sleep-1 (6 judged passages each)
    assert res["mrr@10"] == pytest.approx((1 + 1 / 2) / 2)
    assert res["recall@100"] == pytest.approx((1 / 6 + 1 / 6) / 2)


# --- bad input -----------------------------------------------------------------------------------------------

def test_run_file_repeated_passage_keeps_first_and_warns(tmp_path, caplog):
    path = tmp_path / "r.trec"
    path.write_text("q1 Q0 a 1 3.0 t\nq1 Q0 b 2 2.0 t\nq1 Q0 a 3 1.0 t\n")
    with caplog.at_level(logging.WARNING):
        run = read_run(path)
    assert run == {"q1": {"a": 3.0, "b": 2.0}}
    assert "dropped 1 repeated" in caplog.text and "line 3" in caplog.text
    with pytest.raises(FileNotFoundError, match="nope.trec"):
        read_run(tmp_path / "nope.trec")


def test_qrels_judging_a_pair_twice_differently_names_the_line(tmp_path, caplog):
    path = tmp_path / "q.tsv"
    path.write_text("q1 0 a 1\nq1 0 a 1\n")
    with caplog.at_level(logging.WARNING):
        assert read_qrels(path) == {"q1": {"a": 1}}
    assert "ignored 1 repeated" in caplog.text
    path.write_text("q1 0 a 1\nq1 0 b 2\nq1 0 a 2\n")
    with pytest.raises(DataFormatError, match=r"q.tsv:3: .*judged again with grade 2 \(first judged 1\)"):
        read_qrels(path)


def test_judged_query_with_empty_text_is_an_error(tiny_beir, tmp_path):
    folder = shutil.copytree(tiny_beir, tmp_path / "emptyq")
    lines = (folder / "queries.jsonl").read_text().splitlines()
    lines = [json.dumps({"_id": "q-heart-1", "text": "  "}) if '"q-heart-1"' in ln else ln for ln in lines]
    (folder / "queries.jsonl").write_text("\n".join(lines) + "\n")
    with pytest.raises(DataFormatError,
                       match=r"queries\.jsonl:2: query 'q-heart-1' has an empty 'text' \(1 used queries are empty"):
        load_beir(folder, "test")
    assert load_beir(folder, "dev").queries  # the empty query is not judged in dev: fine


def test_unknown_ids_in_a_run_are_dropped_with_their_count(tiny_beir, tmp_path, caplog):
    from multipos.evaluate import score_run_file

    run = tmp_path / "r.trec"
    run.write_text("q-heart-1 Q0 heart-0 1 2.0 t\nq-heart-1 Q0 ghost-1 2 1.0 t\nq-unjudged Q0 heart-0 1 1.0 t\n")
    with caplog.at_level(logging.WARNING):
        res = score_run_file(str(run), [EvalSet("t", str(tiny_beir), metrics=["mrr@10"])])
    assert res["t"]["mrr@10"] == pytest.approx(1 / 3)
    assert "dropping 1 passage ids" in caplog.text and "ghost-1" in caplog.text
    assert "dropping 1 run queries without qrels" in caplog.text


def test_nq_test_config_scores_answer_match_accuracy(tmp_path, monkeypatch):
    """nq_test over a DPR-format fixture (psgs_w100.tsv + nq-test.qa.csv) found through MULTIPOS_ASSETS."""
    from multipos.evaluate import evaluate

    assets = tmp_path / "assets"
    shutil.copytree(Path(__file__).resolve().parents[1] / "fixtures" / "dpr", assets / "data" / "nq-dpr")
    monkeypatch.setenv("MULTIPOS_ASSETS", str(assets))
    # q0 (Daei): answer passage 2 at rank 1; q2 (Paris): passage 6 at rank 3; q3 (Aaron): passage 1 at rank 2;
    # q4 ('cat'): passage 5 says "Category" — not an answer match; q1, q5: absent from the run.
    run = tmp_path / "run.trec"
    run.write_text("0 Q0 2 1 9 t\n2 Q0 1 1 9 t\n2 Q0 3 2 8 t\n2 Q0 6 3 7 t\n3 Q0 4 1 9 t\n3 Q0 1 2 8 t\n4 Q0 5 1 9 t\n")
    out = tmp_path / "e"
    cfg = compose_cfg("evaluate", ["eval=nq_test", "eval.test_sets.nq_test.metrics=[acc@1,acc@2,acc@20]",
                                   f"run_file={run}", f"paths.output_dir={out}"])
    res = evaluate(cfg)["nq_test"]
    assert res == pytest.approx({"acc@1": 1 / 6, "acc@2": 2 / 6, "acc@20": 3 / 6})
    per_q = json.loads((out / "per_query.nq_test.json").read_text())
    assert per_q["acc@20"] == {"0": 1.0, "1": 0.0, "2": 1.0, "3": 1.0, "4": 0.0, "5": 0.0}


def test_qa_set_rejects_qrels_metrics():
    from multipos.evaluation.sets import QAEvalSet

    with pytest.raises(ValueError, match="acc@k metrics only"):
        QAEvalSet("nq", "nq-dpr", metrics=["ndcg@10"])


def test_retrieval_validation_rejects_a_metric_the_dev_set_does_not_compute(tiny_beir):
    """Checked when the callback is built: under DDP rank 0 alone retrieves, and an error there mid-training
    would leave the other ranks waiting in the broadcast."""
    from multipos.training.callbacks import RetrievalValidation

    es = EvalSet("dev", str(tiny_beir), split="test", metrics=["ndcg@10", "recall@100"])
    with pytest.raises(ValueError, match=r"'mrr@10' \(callbacks.retrieval_validation.metric\) is not among dev's"):
        RetrievalValidation(es, metric="mrr@10")
    assert RetrievalValidation(es, metric="recall@100").metric == "recall@100"


def test_the_average_row_never_includes_the_validation_split(tmp_path):
    """eval=beir with a validation set from the same folder: ``beir_average`` averages the test sets only."""
    from multipos.evaluation.runner import Evaluation
    from multipos.evaluation.sets import EvalSet

    dev, a, b = (EvalSet(name=n, path=str(tmp_path), split="test") for n in ("my_dev", "a", "b"))
    evaluation = Evaluation(validation=dev, test_sets=[a, b], retrieval={}, average="beir_average")
    results = {"my_dev": {"ndcg@10": 0.9}, "a": {"ndcg@10": 0.2}, "b": {"ndcg@10": 0.4}}
    evaluation.write(tmp_path, results)
    assert results["beir_average"] == {"ndcg@10": pytest.approx(0.3)}
