"""Teacher ordering of positives: the teacher's own settings, and a cache keyed by its weights."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
import torch

from multipos.data.preparation import teacher_order
from multipos.data.sources import BeirGradedSource
from multipos.formats.beir import read_corpus, read_queries
from multipos.model.encoder import DualEncoder
from multipos.retrieval.encoding import encode


@pytest.fixture
def cache(tmp_path, monkeypatch):
    folder = tmp_path / "cache"
    monkeypatch.setenv("MULTIPOS_CACHE", str(folder))
    return folder


def _queries(tiny_beir):
    """Training queries in file order (BM25 negatives mined into the test's cache)."""
    _, queries = BeirGradedSource(str(tiny_beir), "qrels-graded/train.s-3.qrel", negative_depth=5).load()
    return queries


def _teacher(tiny_bert, folder, seed: int):
    """A tiny BERT with weights drawn from ``seed``, written to ``folder`` (replacing what is there)."""
    from transformers import AutoTokenizer, BertConfig, BertModel

    shutil.rmtree(folder, ignore_errors=True)
    torch.manual_seed(seed)
    BertModel(BertConfig.from_pretrained(tiny_bert)).save_pretrained(folder)
    AutoTokenizer.from_pretrained(tiny_bert).save_pretrained(folder)
    return folder


def _entries(cache) -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted((cache / "teacher_scores").glob("*.json"))]


def _order(tiny_beir, queries, teacher, **kw):
    corpus = read_corpus(tiny_beir / "corpus.jsonl")
    texts = read_queries(tiny_beir / "queries.jsonl")
    teacher_order(queries, texts, corpus, str(teacher), "tiny", **kw)
    return corpus, texts


def _check_sorted(model, corpus, texts, queries):
    for q in queries:
        qe = encode(model, [texts[q.query_id]], "query", progress=False)[0]
        for tier in (q.gold, q.silver):
            scores = encode(model, corpus.texts(tier), "passage", progress=False) @ qe
            assert all(scores[i] >= scores[i + 1] - 1e-4 for i in range(len(scores) - 1))


def test_same_teacher_path_with_new_weights_is_a_cache_miss(tiny_beir, tiny_bert, tmp_path, cache):
    path = tmp_path / "teacher"  # e.g. outputs/.../model, retrained in place
    _teacher(tiny_bert, path, seed=1)
    first = _queries(tiny_beir)
    _order(tiny_beir, first, path)
    assert len(_entries(cache)) == 1
    _teacher(tiny_bert, path, seed=2)
    second = _queries(tiny_beir)
    corpus, texts = _order(tiny_beir, second, path)
    entries = _entries(cache)
    assert len(entries) == 2
    assert entries[0]["settings"]["teacher_weights"] != entries[1]["settings"]["teacher_weights"]
    assert entries[0]["value"] != entries[1]["value"]
    _check_sorted(DualEncoder(str(path), passage_max_length=256), corpus, texts, second)  # the new weights' order
    _order(tiny_beir, _queries(tiny_beir), path)
    assert len(_entries(cache)) == 2  # the same weights again: a hit


def test_teacher_uses_its_saved_settings(tiny_beir, tiny_bert, tmp_path, cache):
    saved = DualEncoder(str(_teacher(tiny_bert, tmp_path / "base", seed=3)), pooling="cls", normalize=False)
    saved.save_pretrained(tmp_path / "teacher")
    queries = _queries(tiny_beir)
    corpus, texts = _order(tiny_beir, queries, tmp_path / "teacher", pooling="mean", normalize=True)  # json wins
    [entry] = _entries(cache)
    assert (entry["settings"]["pooling"], entry["settings"]["normalize"]) == ("cls", False)
    _check_sorted(DualEncoder(str(tmp_path / "teacher"), passage_max_length=256), corpus, texts, queries)


@pytest.mark.parametrize("pooling, normalize", [("mean", True), ("cls", False)])
def test_plain_checkpoint_uses_the_callers_settings(tiny_beir, tiny_bert, cache, pooling, normalize):
    queries = _queries(tiny_beir)
    corpus, texts = _order(tiny_beir, queries, tiny_bert, pooling=pooling, normalize=normalize)
    [entry] = _entries(cache)
    assert (entry["settings"]["pooling"], entry["settings"]["normalize"]) == (pooling, normalize)
    model = DualEncoder(str(tiny_bert), pooling=pooling, normalize=normalize, passage_max_length=256)
    _check_sorted(model, corpus, texts, queries)
    scores = entry["value"][queries[0].query_id]
    qe = encode(model, [texts[queries[0].query_id]], "query", progress=False)[0]
    pids = [*queries[0].gold, *queries[0].silver]
    np.testing.assert_allclose([scores[p] for p in pids], encode(model, corpus.texts(pids), progress=False) @ qe,
                               atol=1e-2)  # encode runs in bf16 by default
