"""Where ``data.source.qrels_file`` is looked up: the dataset folder first, else the path itself (labels made by
``python annotate.py`` outside the dataset folder)."""

from __future__ import annotations

import shutil

import pytest

from multipos.data.sources import BeirGradedSource


def test_a_qrels_file_outside_the_dataset_folder_trains_as_it_is(tiny_beir, tmp_path, monkeypatch):
    (tmp_path / "annotations").mkdir()
    lines = (tiny_beir / "qrels-graded" / "train.s-3.qrel").read_text().splitlines()
    kept = lines[: len(lines) // 2]
    (tmp_path / "annotations" / "relevance.qrel").write_text("\n".join(kept) + "\n")
    monkeypatch.chdir(tmp_path)
    inside = BeirGradedSource(str(tiny_beir), "qrels-graded/train.s-3.qrel", negative_depth=5).load()[1]
    outside = BeirGradedSource(str(tiny_beir), "annotations/relevance.qrel", negative_depth=5).load()[1]
    assert 0 < len(outside) < len(inside)
    absolute = BeirGradedSource(str(tiny_beir), str(tmp_path / "annotations" / "relevance.qrel"), negative_depth=5)
    assert [q.query_id for q in absolute.load()[1]] == [q.query_id for q in outside]
    shutil.rmtree(tmp_path / "annotations")
    with pytest.raises(FileNotFoundError, match="data.source.qrels_file"):
        BeirGradedSource(str(tiny_beir), "annotations/relevance.qrel", negative_depth=5).load()
