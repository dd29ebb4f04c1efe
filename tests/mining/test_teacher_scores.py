"""multipos.mining.teacher_scores: a teacher's scores from a TREC run or JSONL as soft targets, and their bad input."""

from __future__ import annotations

import json
import math

import pytest

from multipos.data.groups import TrainQuery
from multipos.formats.types import DataFormatError
from multipos.mining.teacher_scores import TeacherScores, read_teacher_scores


def test_the_three_formats_read_to_the_same_table(tmp_path):
    (tmp_path / "run.trec").write_text("q1 Q0 a 1 2.5 ce\nq1 Q0 b 2 0.5 ce\nq2 Q0 c 1 1.0 ce\n")
    (tmp_path / "scores.jsonl").write_text(json.dumps({"query_id": "q1", "scores": {"a": 2.5, "b": 0.5}}) + "\n"
                                           + json.dumps({"query_id": "q2", "scores": {"c": 1.0}}) + "\n")
    (tmp_path / "tevatron.jsonl").write_text(json.dumps(
        {"query_id": "q1", "query": "x", "positive_passages": [{"docid": "a", "text": "t", "score": 2.5}],
         "negative_passages": [{"docid": "b", "text": "t", "score": 0.5}]}) + "\n" + json.dumps(
        {"query_id": "q2", "query": "y", "positive_passages": [{"docid": "c", "text": "t", "score": 1.0}]}) + "\n")
    tables = [read_teacher_scores(tmp_path / f) for f in ("run.trec", "scores.jsonl", "tevatron.jsonl")]
    assert tables[0] == tables[1] == tables[2] == {"q1": {"a": 2.5, "b": 0.5}, "q2": {"c": 1.0}}


@pytest.mark.parametrize("line, needle", [
    ({"scores": {"a": 1}}, r"s\.jsonl:1: missing field 'query_id'"),
    ({"query_id": "q", "scores": {"a": "high"}}, r"s\.jsonl:1: scores\['a'\]: score 'high' is not a finite number"),
    ({"query_id": "q", "positive_passages": [{"docid": "a", "text": "t"}]},
     r"s\.jsonl:1: positive_passages\[0\]: missing field 'score'"),
    ({"query_id": "q", "query": "x"}, r"s\.jsonl:1: no field 'scores' and no scored passages"),
])
def test_bad_input_names_file_line_and_field(tmp_path, line, needle):
    (tmp_path / "s.jsonl").write_text(json.dumps(line) + "\n")
    with pytest.raises(DataFormatError, match=needle):
        read_teacher_scores(tmp_path / "s.jsonl")


def test_queries_get_raw_scores_and_tempered_softmax_weights(tmp_path):
    (tmp_path / "run.trec").write_text("q1 Q0 a 1 2.0 ce\nq1 Q0 b 2 0.0 ce\nq1 Q0 n 3 -1.0 ce\n")
    q = TrainQuery("q1", "x", gold=["a"], silver=["b", "c"], negatives=["n"])
    counts = TeacherScores(str(tmp_path / "run.trec"), temperature=2.0).apply([q, TrainQuery("q9", "y", gold=["z"])])
    assert q.teacher_scores == {"a": 2.0, "b": 0.0, "n": -1.0}
    z = math.exp(1.0) + math.exp(0.0) + math.exp(-0.5)
    assert q.weights == pytest.approx({"a": math.exp(1.0) / z, "b": 1 / z, "n": math.exp(-0.5) / z})
    assert counts == {"queries": 2, "scored_queries": 1, "positives": 4, "unscored_positives": 2}
    with pytest.raises(ValueError, match="temperature"):
        TeacherScores("x", temperature=0)
