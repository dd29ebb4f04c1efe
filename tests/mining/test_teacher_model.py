"""multipos.mining.teacher_model: a sentence-transformers bi- or cross-encoder scores the training groups once."""

from __future__ import annotations

import json

import pytest

from multipos.data.sources import BeirGradedSource


@pytest.fixture(scope="module")
def tiny_teachers(tiny_bert, tmp_path_factory):
    """A tiny bi-encoder and a tiny cross-encoder built from the tiny BERT's config and vocabulary (random weights)."""
    import torch
    from sentence_transformers import SentenceTransformer, models
    from transformers import AutoConfig, AutoTokenizer, BertForSequenceClassification

    root = tmp_path_factory.mktemp("teachers")
    word = models.Transformer(str(tiny_bert), max_seq_length=64)
    bi = SentenceTransformer(modules=[word, models.Pooling(word.get_word_embedding_dimension(), "mean")])
    bi.save(str(root / "bi"))
    torch.manual_seed(0)
    config = AutoConfig.from_pretrained(tiny_bert, num_labels=1)
    BertForSequenceClassification(config).save_pretrained(root / "cross")
    AutoTokenizer.from_pretrained(tiny_bert).save_pretrained(root / "cross")
    return root


@pytest.mark.parametrize("kind", ["bi", "cross"])
def test_the_teacher_scores_positives_and_hard_negatives_once(tiny_beir, tiny_teachers, tmp_path, monkeypatch, kind):
    monkeypatch.setenv("MULTIPOS_CACHE", str(tmp_path / "cache"))
    settings = {"path": str(tiny_teachers / kind), "kind": kind, "temperature": 0.5, "negatives": 3}
    source = BeirGradedSource(str(tiny_beir), "qrels-graded/train.s-3.qrel", negative_depth=5, teacher_model=settings)
    prepared = source.prepare()
    queries = prepared.queries
    for q in queries:
        assert set(q.teacher_scores) == {*q.gold, *q.silver, *q.negatives[:3]}
        assert sum(q.weights.values()) == pytest.approx(1.0)
    counts = prepared.counts("teacher_scores")  # the step's report
    assert counts["scored_queries"] == 5 and counts["unscored_positives"] == 0
    cached = list((tmp_path / "cache" / "teacher_model").glob("*.json"))
    assert len(cached) == 1

    import sentence_transformers

    def no_model(*args, **kwargs):
        raise AssertionError("the teacher scored again")

    monkeypatch.setattr(sentence_transformers, "CrossEncoder", no_model)
    monkeypatch.setattr(sentence_transformers, "SentenceTransformer", no_model)
    _, again = BeirGradedSource(str(tiny_beir), "qrels-graded/train.s-3.qrel", negative_depth=5,
                                teacher_model=settings).load()
    assert [q.teacher_scores for q in again] == [q.teacher_scores for q in queries]
    assert json.loads(cached[0].read_text()) == {q.query_id: q.teacher_scores for q in queries}


def test_bad_teacher_settings_name_the_field(tiny_beir, tiny_teachers):
    with pytest.raises(ValueError, match=r"teacher_model\.kind"):
        BeirGradedSource(str(tiny_beir), "qrels/train.tsv", teacher_model={"path": str(tiny_teachers / "bi"),
                                                                            "kind": "listwise"})
    with pytest.raises(FileNotFoundError, match=r"teacher_model\.path"):
        BeirGradedSource(str(tiny_beir), "qrels/train.tsv", teacher_model={"path": "/nowhere"})
    with pytest.raises(ValueError, match=r"grade_weights and data\.source\.teacher_model each give"):
        BeirGradedSource(str(tiny_beir), "qrels/train.tsv", grade_weights={1: 1.0},
                         teacher_model={"path": str(tiny_teachers / "bi"), "kind": "bi"})
