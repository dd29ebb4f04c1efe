"""to_dataset turns multipos's BEIR and Tevatron data into multi-positive rows; check_dataset names a bad row's index
and column; mine_negatives mines with sentence-transformers and never keeps a positive of the row."""

from __future__ import annotations

import pytest
from datasets import Dataset

from multipos.formats.trec import read_qrels
from multipos.sentence_transformers import check_dataset, mine_negatives, to_dataset
from tests.helpers import REPO

QRELS = "qrels-graded/train.s-3.qrel"


def test_beir_folder(tiny_beir, loaded, rows):
    corpus, queries = loaded
    assert rows.column_names == ["query", "positives", "negatives", "grades", "query_id"] and len(rows) == 8
    qrels = read_qrels(tiny_beir / QRELS)
    for q, row in zip(queries, rows):
        assert row["query_id"] == q.query_id and row["query"] == q.query
        assert row["positives"] == [corpus[p].full_text() for p in q.positives("all")]
        assert row["negatives"] == [corpus[n].full_text() for n in q.negatives] and row["negatives"]
        assert not set(row["negatives"]) & set(row["positives"])
        if q.query_id in qrels:
            assert row["grades"] == [qrels[q.query_id][p] for p in q.positives("all")]
    gold = to_dataset(tiny_beir, QRELS, regime="gold", negative_depth=20)
    assert len(gold) == 5 and all(g == [2.0, 2.0] for g in gold["grades"])


def test_tevatron_file():
    path = REPO / "tests" / "fixtures" / "tevatron_train.jsonl"
    rows = to_dataset(path, gold_positives=1)
    assert rows[0]["query"] == "what lowers ldl cholesterol" and rows[0]["grades"] == [2.0, 1.0, 1.0]
    assert rows[0]["positives"][0] == "Statins Statins lower LDL cholesterol in the blood."
    assert rows[1]["negatives"][1] == "HDL HDL is called good cholesterol."
    assert len(to_dataset(path, regime="homogeneous", gold_positives=1)[0]["positives"]) == 2


@pytest.mark.parametrize("bad,column", [
    ({"positives": []}, "positives"), ({"positives": None}, "positives"), ({"grades": [1, "x"]}, "grades"),
    ({"grades": [1, 2, 3]}, "grades"), ({"grades": [float("nan"), 1]}, "grades"), ({"negatives": "a"}, "negatives"),
    ({"query": None}, "query")])
def test_bad_rows_name_index_and_column(bad, column):
    good = {"query": "q", "positives": ["a", "b"], "negatives": ["c"], "grades": [2, 1]}
    with pytest.raises(ValueError, match=f"row 2, column '{column}'"):
        check_dataset([good, good, {**good, **bad}])
    with pytest.raises(ValueError, match="lacks column"):
        check_dataset(Dataset.from_dict({"anchor": ["q"], "positive": ["a"]}))
    with pytest.raises(ValueError, match="row 0, column 'grades': grade 1"):
        check_dataset([good], grade_weights={2: 1.0})


def test_mine_negatives_keeps_positives_out(make_st, rows, loaded):
    corpus, _ = loaded
    mined = mine_negatives(rows.remove_columns("negatives"), make_st(), num_negatives=3, corpus=corpus.texts())
    assert mined.column_names[:4] == ["query", "positives", "grades", "query_id"]
    for row in mined:
        assert 0 < len(row["negatives"]) <= 3 and not set(row["negatives"]) & set(row["positives"])


def test_mine_negatives_removes_a_mined_positive(monkeypatch):
    """Whatever the miner returns, a positive of the row never stays a negative; ``append`` keeps the old ones."""
    import sentence_transformers.util

    def fake(pairs, model, anchor_column_name, positive_column_name, corpus, num_negatives, output_format, **kw):
        assert output_format == "labeled-list" and pairs["anchor"] == ["q1", "q1", "q2"] and "n0" in corpus
        return Dataset.from_dict({"anchor": ["q1", "q2"], "positive": [["a", "b", "x"], ["c", "a", "y"]],
                                  "labels": [[1, 0, 0], [1, 0, 0]]})

    monkeypatch.setattr(sentence_transformers.util, "mine_hard_negatives", fake)
    data = Dataset.from_dict({"query": ["q1", "q2"], "positives": [["a", "b"], ["c"]], "negatives": [["n0"], []]})
    assert mine_negatives(data, None)["negatives"] == [["x"], ["a", "y"]]
    assert mine_negatives(data, None, append=True)["negatives"] == [["n0", "x"], ["a", "y"]]
