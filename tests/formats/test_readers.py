"""Tests for the readers ``multipos.formats.types`` / ``beir`` / ``trec`` / ``tevatron`` (BEIR, TREC qrels/runs,
Tevatron
JSONL / HF datasets) and ``multipos.data.sources.TevatronSource``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from multipos.data.groups import TrainQuery
from multipos.data.sources import TevatronSource
from multipos.formats.beir import load_beir, read_corpus, read_queries
from multipos.formats.tevatron import load_tevatron_hf, read_tevatron
from multipos.formats.trec import read_qrels, read_run, write_run
from multipos.formats.types import Corpus, DataFormatError, Passage, iter_jsonl

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "tevatron_train.jsonl"

CORPUS = [
    {"_id": "d1", "title": "Statins", "text": "Statins lower LDL cholesterol."},
    {"_id": "d2", "title": "", "text": "Fiber reduces cholesterol."},
    {"_id": 3, "title": "Sleep", "text": "Melatonin regulates sleep."},  # int id → "3"
    {"_id": "d4", "text": "Calcium builds bone."},  # no title
]
QUERIES = [
    {"_id": "q1", "text": "cholesterol drugs"},
    {"_id": "q2", "text": "sleep hormone"},
    {"_id": 3, "text": "bone health"},
]


def write_jsonl(path: Path, rows, raw_lines=()):
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")
        for line in raw_lines:
            f.write(line + "\n")
    return path


@pytest.fixture
def beir(tmp_path) -> Path:
    root = tmp_path / "mini"
    write_jsonl(root / "corpus.jsonl", CORPUS)
    write_jsonl(root / "queries.jsonl", QUERIES)
    (root / "qrels").mkdir()
    (root / "qrels" / "test.tsv").write_text("query-id\tcorpus-id\tscore\nq1\td1\t2\nq1\td2\t1\nq2\t3\t1\n")
    (root / "qrels" / "dev.tsv").write_text("query-id\tcorpus-id\tscore\n3\td4\t1\n")
    (root / "qrels-graded").mkdir()
    (root / "qrels-graded" / "test.qrel").write_text("q1 0 d1 2\nq1 0 d2 1\n\nq1 0 d4 0\n")
    return root


def fixture_rows() -> list[dict]:
    return [json.loads(line) for line in FIXTURE.read_text().splitlines() if line.strip()]


# --------------------------------------------------------------------------------------------
# BEIR
# --------------------------------------------------------------------------------------------

def test_load_beir(beir):
    ds = load_beir(beir, "test")
    assert ds.name == "mini"
    assert isinstance(ds.corpus, Corpus)
    assert len(ds.corpus) == 4 and ds.corpus.ids == ["d1", "d2", "3", "d4"]
    assert "3" in ds.corpus and "d9" not in ds.corpus
    assert ds.corpus["d1"] == Passage("d1", "Statins", "Statins lower LDL cholesterol.")
    assert ds.corpus["d4"].title == ""
    assert ds.corpus["d1"].full_text() == "Statins Statins lower LDL cholesterol."
    assert ds.corpus["d2"].full_text() == "Fiber reduces cholesterol."  # empty title: text only
    assert ds.corpus.texts(["d4", "d1"]) == ["Calcium builds bone.", "Statins Statins lower LDL cholesterol."]
    # only the queries judged in this split
    assert ds.queries == {"q1": "cholesterol drugs", "q2": "sleep hormone"}
    assert ds.qrels == {"q1": {"d1": 2, "d2": 1}, "q2": {"3": 1}}
    assert all(isinstance(g, int) for docs in ds.qrels.values() for g in docs.values())

    dev = load_beir(beir, "dev")
    assert dev.queries == {"3": "bone health"} and dev.qrels == {"3": {"d4": 1}}


def test_load_beir_with_trec_qrels_file(beir):
    ds = load_beir(beir, "test", qrels_file="qrels-graded/test.qrel")
    assert ds.qrels == {"q1": {"d1": 2, "d2": 1, "d4": 0}}
    assert ds.queries == {"q1": "cholesterol drugs"}


def test_read_queries_and_corpus_direct(beir):
    assert read_queries(beir / "queries.jsonl") == {"q1": "cholesterol drugs", "q2": "sleep hormone",
                                                    "3": "bone health"}
    assert read_corpus(beir / "corpus.jsonl").ids == ["d1", "d2", "3", "d4"]


def test_load_beir_missing_split(beir):
    with pytest.raises(FileNotFoundError) as exc:
        load_beir(beir, "train")
    msg = str(exc.value)
    assert "'train'" in msg
    assert "test.tsv" in msg and "dev.tsv" in msg  # lists what is there


def test_load_beir_missing_folder(tmp_path):
    with pytest.raises(FileNotFoundError, match="nowhere"):
        load_beir(tmp_path / "nowhere", "test")


def test_load_beir_qrels_with_unknown_passage(beir):
    qpath = beir / "qrels" / "test.tsv"
    qpath.write_text("query-id\tcorpus-id\tscore\nq1\td1\t1\nq1\tghost-7\t1\n")
    with pytest.raises(DataFormatError) as exc:
        load_beir(beir, "test")
    msg = str(exc.value)
    assert str(qpath) in msg
    assert "ghost-7" in msg


def test_load_beir_qrels_with_unknown_query(beir):
    qpath = beir / "qrels" / "test.tsv"
    qpath.write_text("query-id\tcorpus-id\tscore\nq404\td1\t1\n")
    with pytest.raises(DataFormatError) as exc:
        load_beir(beir, "test")
    assert str(qpath) in str(exc.value) and "q404" in str(exc.value)


# --------------------------------------------------------------------------------------------
# JSONL errors
# --------------------------------------------------------------------------------------------

def test_malformed_json_names_file_and_line(tmp_path):
    path = write_jsonl(tmp_path / "corpus.jsonl", CORPUS[:1], raw_lines=["", '{"_id": "d2", "text": oops}'])
    with pytest.raises(DataFormatError) as exc:
        read_corpus(path)
    msg = str(exc.value)
    assert "corpus.jsonl" in msg
    assert f"{path}:3" in msg  # 1-based physical line number (line 2 is blank)
    assert isinstance(exc.value, ValueError)


def test_non_object_json_line(tmp_path):
    path = write_jsonl(tmp_path / "queries.jsonl", QUERIES[:2], raw_lines=['["q3", "text"]'])
    with pytest.raises(DataFormatError, match=r"queries\.jsonl:3"):
        read_queries(path)


def test_iter_jsonl_skips_blank_lines_and_numbers_physical_lines(tmp_path):
    path = write_jsonl(tmp_path / "x.jsonl", [{"a": 1}], raw_lines=["", "   ", '{"a": 2}'])
    assert list(iter_jsonl(path)) == [(1, {"a": 1}), (4, {"a": 2})]
    with pytest.raises(FileNotFoundError, match="missing.jsonl"):
        list(iter_jsonl(tmp_path / "missing.jsonl"))


@pytest.mark.parametrize("reader, rows, field", [
    (read_corpus, [CORPUS[0], {"_id": "d2", "title": "t"}], "text"),
    (read_corpus, [CORPUS[0], {"title": "t", "text": "x"}], "_id"),
    (read_queries, [QUERIES[0], {"text": "no id"}], "_id"),
    (read_queries, [QUERIES[0], {"_id": "q2"}], "text"),
])
def test_missing_field_is_named(tmp_path, reader, rows, field):
    path = write_jsonl(tmp_path / "data.jsonl", rows)
    with pytest.raises(DataFormatError) as exc:
        reader(path)
    msg = str(exc.value)
    assert repr(field) in msg
    assert f"{path}:2" in msg


def test_wrong_field_type_is_named(tmp_path):
    path = write_jsonl(tmp_path / "corpus.jsonl", [{"_id": "d1", "text": ["not", "a", "string"]}])
    with pytest.raises(DataFormatError, match="'text'"):
        read_corpus(path)


def test_duplicate_passage_id(tmp_path):
    path = write_jsonl(tmp_path / "corpus.jsonl", [CORPUS[0], CORPUS[1], CORPUS[0]])
    with pytest.raises(DataFormatError, match=r"corpus\.jsonl:3.*'d1'"):
        read_corpus(path)


# --------------------------------------------------------------------------------------------
# TREC qrels and runs
# --------------------------------------------------------------------------------------------

def test_read_trec_qrels(tmp_path):
    path = tmp_path / "dl19.qrels"
    path.write_text("1037798 0 7067274 3\n1037798 0 7067275 0\n\n104861 0 1017204 1.0\n104861 Q0 1017205 2\n")
    assert read_qrels(path) == {"1037798": {"7067274": 3, "7067275": 0}, "104861": {"1017204": 1, "1017205": 2}}


def test_read_qrels_errors(tmp_path):
    bad_cols = tmp_path / "bad.tsv"
    bad_cols.write_text("q1 0 d1 1\nq1 d2\n")
    with pytest.raises(DataFormatError, match=r"bad\.tsv:2.*columns"):
        read_qrels(bad_cols)
    bad_grade = tmp_path / "grade.tsv"
    bad_grade.write_text("query-id\tcorpus-id\tscore\nq1\td1\thigh\n")
    with pytest.raises(DataFormatError, match=r"grade\.tsv:2.*'high'"):
        read_qrels(bad_grade)
    with pytest.raises(FileNotFoundError, match="absent.tsv"):
        read_qrels(tmp_path / "absent.tsv")


def test_run_round_trip(tmp_path):
    run = {
        "q1": {"d1": 0.5, "d2": 2.25, "d3": -1.0, "d4": 10.125},
        "q2": {"d9": 0.0, "d8": 3.5},
    }
    path = tmp_path / "run.trec"
    write_run(run, path, tag="mytag")
    assert not list(tmp_path.glob("*.tmp"))
    lines = [line.split() for line in path.read_text().splitlines()]
    assert len(lines) == 6
    q1 = [p for p in lines if p[0] == "q1"]
    assert [p[2] for p in q1] == ["d4", "d2", "d1", "d3"]  # descending score
    assert [int(p[3]) for p in q1] == [1, 2, 3, 4]
    assert all(p[1] == "Q0" and p[5] == "mytag" and len(p) == 6 for p in lines)
    scores = [float(p[4]) for p in q1]
    assert scores == sorted(scores, reverse=True)
    back = read_run(path)
    assert back == run
    assert list(back["q1"]) == ["d4", "d2", "d1", "d3"]  # file (rank) order
    # overwrite in place
    write_run({"q3": {"d1": 1.0}}, path)
    assert read_run(path) == {"q3": {"d1": 1.0}}
    assert path.read_text().split()[-1] == "multipos"


def test_read_run_errors(tmp_path):
    path = tmp_path / "bad.run"
    path.write_text("q1 Q0 d1 1 2.0 tag\nq1 Q0 d2 2 tag\n")
    with pytest.raises(DataFormatError, match=r"bad\.run:2"):
        read_run(path)
    path.write_text("q1 Q0 d1 1 high tag\n")
    with pytest.raises(DataFormatError, match=r"bad\.run:1.*'high'"):
        read_run(path)


# --------------------------------------------------------------------------------------------
# Tevatron JSONL
# --------------------------------------------------------------------------------------------

def test_fixture_is_in_tevatron_schema():
    rows = fixture_rows()
    assert len(rows) == 4
    for r in rows:
        assert set(r) == {"query_id", "query", "positive_passages", "negative_passages"}
        assert len(r["positive_passages"]) >= 2
        for p in r["positive_passages"] + r["negative_passages"]:
            assert set(p) == {"docid", "title", "text"}


def test_read_tevatron_fixture():
    rows = fixture_rows()
    examples = read_tevatron(FIXTURE)
    assert [e.query_id for e in examples] == [r["query_id"] for r in rows]
    for ex, r in zip(examples, rows):
        assert ex.query == r["query"]
        assert [p.id for p in ex.positives] == [p["docid"] for p in r["positive_passages"]]
        assert [p.id for p in ex.negatives] == [p["docid"] for p in r["negative_passages"]]
        assert [(p.title, p.text) for p in ex.positives] == [(p["title"], p["text"]) for p in r["positive_passages"]]
    assert examples[0].positives[0] == Passage("d11", "Statins", "Statins lower LDL cholesterol in the blood.")
    assert examples[0].positives[2].full_text() == "Plant sterols modestly lower LDL."


def test_read_tevatron_accepts_int_ids_and_missing_negatives(tmp_path):
    path = write_jsonl(tmp_path / "t.jsonl", [{"query_id": 7, "query": "q", "positive_passages": [
        {"docid": 11, "text": "x"}]}])
    (ex,) = read_tevatron(path)
    assert ex.query_id == "7" and ex.positives == [Passage("11", "", "x")] and ex.negatives == []


@pytest.mark.parametrize("positives", [[], None])
def test_tevatron_line_without_positives(tmp_path, positives):
    bad = {"query_id": "q9", "query": "text", "negative_passages": [{"docid": "n", "title": "", "text": "t"}]}
    if positives is not None:
        bad["positive_passages"] = positives
    path = write_jsonl(tmp_path / "train.jsonl", fixture_rows()[:2] + [bad])
    with pytest.raises(DataFormatError) as exc:
        read_tevatron(path)
    msg = str(exc.value)
    assert f"{path}:3" in msg
    assert "positive_passages" in msg and "q9" in msg


@pytest.mark.parametrize("mutate, needle", [
    (lambda r: r.pop("query"), "'query'"),
    (lambda r: r.pop("query_id"), "'query_id'"),
    (lambda r: r["positive_passages"][1].pop("docid"), "positive_passages[1]"),
    (lambda r: r["negative_passages"][0].pop("text"), "negative_passages[0]"),
    (lambda r: r.__setitem__("positive_passages", "d11"), "'positive_passages'"),
    (lambda r: r["negative_passages"].__setitem__(0, "d90"), "negative_passages[0]"),
])
def test_tevatron_field_errors_name_line_and_field(tmp_path, mutate, needle):
    rows = fixture_rows()
    mutate(rows[1])
    path = write_jsonl(tmp_path / "train.jsonl", rows)
    with pytest.raises(DataFormatError) as exc:
        read_tevatron(path)
    msg = str(exc.value)
    assert f"{path}:2" in msg
    assert needle in msg


def test_tevatron_malformed_json(tmp_path):
    lines = FIXTURE.read_text().splitlines()
    lines[2] = lines[2][:-5]  # truncated line 3
    path = tmp_path / "broken.jsonl"
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(DataFormatError, match=r"broken\.jsonl:3: malformed JSON"):
        read_tevatron(path)


# --------------------------------------------------------------------------------------------
# TevatronSource
# --------------------------------------------------------------------------------------------

def _all_passages(rows):
    return {p["docid"]: p for r in rows for p in r["positive_passages"] + r["negative_passages"]}


def test_tevatron_source_heterogeneous():
    rows = fixture_rows()
    corpus, queries = TevatronSource(str(FIXTURE), gold_positives=1).load()
    passages = _all_passages(rows)
    assert set(corpus.ids) == set(passages)
    assert len(corpus) == len(passages)  # d90 appears in two lines, stored once
    for pid, p in passages.items():
        assert corpus[pid] == Passage(pid, p["title"], p["text"])
    assert len(queries) == 4 and all(isinstance(q, TrainQuery) for q in queries)
    for q, r in zip(queries, rows):
        pos = [p["docid"] for p in r["positive_passages"]]
        assert q.query_id == r["query_id"] and q.query == r["query"]
        assert q.gold == pos[:1]
        assert q.silver == pos[1:]
        assert q.negatives == [p["docid"] for p in r["negative_passages"]]
        assert q.judged == set(pos)
        assert q.positives("heterogeneous") == pos
        assert q.positives("homogeneous") == pos[1:]


def test_tevatron_source_homogeneous_and_max_queries():
    rows = fixture_rows()
    corpus, queries = TevatronSource(str(FIXTURE), gold_positives=0, max_queries=2).load()
    assert [q.query_id for q in queries] == [r["query_id"] for r in rows[:2]]
    for q, r in zip(queries, rows):
        assert q.gold == [] and q.silver == [p["docid"] for p in r["positive_passages"]]
        assert q.positives("heterogeneous") == []
    assert set(corpus.ids) == set(_all_passages(rows[:2]))


# --------------------------------------------------------------------------------------------
# Hugging Face datasets
# --------------------------------------------------------------------------------------------

def test_load_tevatron_hf_from_saved_dataset(tmp_path):
    datasets = pytest.importorskip("datasets")
    rows = fixture_rows()
    folder = tmp_path / "tev_ds"
    datasets.Dataset.from_list(rows).save_to_disk(str(folder))
    examples = load_tevatron_hf(str(folder))
    assert examples == read_tevatron(FIXTURE)

    # a DatasetDict folder: the split is selected
    dd_folder = tmp_path / "tev_dd"
    datasets.DatasetDict({"train": datasets.Dataset.from_list(rows[:3]),
                          "dev": datasets.Dataset.from_list(rows[3:])}).save_to_disk(str(dd_folder))
    assert [e.query_id for e in load_tevatron_hf(str(dd_folder), split="dev")] == [rows[3]["query_id"]]
    assert [e.query_id for e in load_tevatron_hf(str(dd_folder))] == [r["query_id"] for r in rows[:3]]

    # TevatronSource takes the same folder
    corpus, queries = TevatronSource(str(folder), gold_positives=1).load()
    assert [q.gold for q in queries] == [[r["positive_passages"][0]["docid"]] for r in rows]
    assert set(corpus.ids) == set(_all_passages(rows))


def test_load_tevatron_hf_bad_row_named(tmp_path):
    datasets = pytest.importorskip("datasets")
    rows = fixture_rows()
    rows[2]["positive_passages"] = []
    folder = tmp_path / "bad_ds"
    datasets.Dataset.from_list(rows).save_to_disk(str(folder))
    with pytest.raises(DataFormatError) as exc:
        load_tevatron_hf(str(folder))
    msg = str(exc.value)
    assert "row 2" in msg and "positive_passages" in msg and str(folder) in msg
