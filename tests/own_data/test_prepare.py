"""multipos.own_data.prepare: splits, positive tiers and lengths of a user's data, and its bad input."""

from __future__ import annotations

import json
import shutil

import pytest

from multipos.formats.types import DataFormatError
from multipos.own_data.prepare import length_for, positive_tiers, prepare


def _beir_copy(tiny_beir, tmp_path, drop_dev=False, binary=False):
    folder = tmp_path / "mydata"
    shutil.copytree(tiny_beir, folder)
    if drop_dev:
        (folder / "qrels" / "dev.tsv").unlink()
    if binary:
        for split in ("train", "dev", "test"):
            path = folder / "qrels" / f"{split}.tsv"
            if path.exists():
                path.write_text(path.read_text().replace("\t2\n", "\t1\n"))
    return folder


def test_graded_qrels_take_the_top_grade_as_gold_and_keep_the_given_dev_split(tiny_beir, tmp_path):
    p = prepare(_beir_copy(tiny_beir, tmp_path), tmp_path / "out")
    assert (p.gold_grade, p.silver_grade, p.regime, p.dev, p.test) == (2, 1, "all", "given", "given")
    assert p.counts["gold_labels"] == 10 and p.counts["silver_labels"] == 20  # 5 train queries: 2 gold, 4 silver
    assert (p.folder / "qrels" / "dev.tsv").read_text() == (tiny_beir / "qrels" / "dev.tsv").read_text()
    assert json.loads((p.folder / "prepared.json").read_text())["gold_grade"] == 2
    assert f"data_path='{p.folder}'" in p.overrides()


def test_binary_qrels_need_no_setting_and_a_missing_dev_split_is_held_out_of_train(tiny_beir, tmp_path, caplog):
    folder = _beir_copy(tiny_beir, tmp_path, drop_dev=True, binary=True)
    with caplog.at_level("INFO"):
        p = prepare(folder, tmp_path / "out", dev_fraction=0.2)
    assert (p.gold_grade, p.silver_grade) == (1, 1) and p.counts["silver_labels"] == 0
    assert p.dev == "held out" and p.counts["dev_queries"] == 1 and p.counts["train_queries"] == 4
    train = {line.split("\t")[0] for line in (p.folder / "qrels" / "train.tsv").read_text().splitlines()[1:]}
    dev = {line.split("\t")[0] for line in (p.folder / "qrels" / "dev.tsv").read_text().splitlines()[1:]}
    assert train and dev and not train & dev
    assert "binary qrels" in caplog.text and "held out to pick the checkpoint" in caplog.text


def test_explicit_tiers_and_their_errors():
    assert positive_tiers({1, 2, 3}, gold_grades=[2, 3], silver_grades=[1])[:2] == (2, 1)
    gold, silver, note = positive_tiers({1, 2, 3}, gold_grades=[3])
    assert (gold, silver) == (3, 3) and "grades [1, 2] are not used" in note
    with pytest.raises(ValueError, match="gold_grades"):
        positive_tiers({1, 2, 3}, gold_grades=[2])
    with pytest.raises(ValueError, match="silver_grades"):
        positive_tiers({1, 2, 3}, gold_grades=[3], silver_grades=[1])
    with pytest.raises(ValueError, match="no query has a positive"):
        positive_tiers(set())


def test_lengths_are_the_99th_percentile_capped_and_say_what_they_truncate():
    assert length_for(list(range(1, 101)), 512) == (104, 0.0)
    assert length_for([10] * 98 + [600, 700], 512) == (512, 0.02)


def test_a_tevatron_file_gets_held_out_dev_and_test_splits(tmp_path):
    lines = [{"query_id": f"q{i}", "query": f"query {i}",
              "positive_passages": [{"docid": f"p{i}a", "title": "", "text": f"a {i}"},
                                    {"docid": f"p{i}b", "title": "", "text": f"b {i}"}],
              "negative_passages": [{"docid": f"n{i}", "title": "", "text": f"n {i}"}]} for i in range(20)]
    path = tmp_path / "train.jsonl"
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    p = prepare(path, tmp_path / "out", gold_positives=1)
    assert (p.dev, p.test) == ("held out", "held out") and p.counts["passages"] == 60
    assert p.counts["test_queries"] == 4 and p.counts["dev_queries"] == 2 and p.counts["train_queries"] == 14
    assert (p.gold_grade, p.silver_grade) == (2, 1)
    corpus = [json.loads(x) for x in (p.folder / "corpus.jsonl").read_text().splitlines()]
    assert {"_id": "p0a", "title": "", "text": "a 0"} in corpus


@pytest.mark.parametrize("damage, needle", [
    (lambda f: (f / "qrels" / "train.tsv").write_text("query-id\tcorpus-id\tscore\nq\t\t1\n"),
     r"train\.tsv:2: expected 3 \(BEIR\) or 4 \(TREC\) columns"),
    (lambda f: (f / "qrels" / "train.tsv").write_text("q-heart-0\theart-0\thigh\n"),
     r"train\.tsv:1: relevance grade 'high' is not a number"),
    (lambda f: (f / "corpus.jsonl").write_text('{"id": "x", "text": "t"}\n'), r"corpus\.jsonl:1: .*_id"),
    (lambda f: (f / "qrels" / "test.tsv").unlink(), r"qrels/test\.tsv: no test split"),
])
def test_bad_input_names_the_file_line_and_field_and_writes_nothing(tiny_beir, tmp_path, damage, needle):
    folder = _beir_copy(tiny_beir, tmp_path)
    damage(folder)
    with pytest.raises((DataFormatError, FileNotFoundError), match=needle):
        prepare(folder, tmp_path / "out")
    assert not (tmp_path / "out").exists()
