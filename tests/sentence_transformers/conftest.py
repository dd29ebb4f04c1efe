"""Fixtures of the sentence-transformers integration tests: a SentenceTransformer built from the tiny BERT, and the
tiny BEIR fixture's training queries (train and test qrels together: 8 queries, two per topic for three topics, whose
positives overlap) as multipos sources and as a multi-positive ``datasets.Dataset``."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

#: Grade weights of the soft-target objectives (data.source.grade_weights).
GRADE_WEIGHTS = {2: 1.0, 1: 0.5}


@pytest.fixture
def make_st(tiny_bert):
    """``make_st(dtype=torch.float32)`` → a fresh SentenceTransformer: the tiny BERT + mean pooling, on the CPU."""
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer.modules import Pooling, Transformer

    def make(dtype=torch.float32):
        transformer = Transformer(str(tiny_bert))
        model = SentenceTransformer(modules=[transformer, Pooling(transformer.get_embedding_dimension(), "mean")],
                                    device="cpu")
        return model.to(dtype)

    return make


@pytest.fixture(scope="session")
def train_qrels(tiny_beir, tmp_path_factory) -> Path:
    """The tiny BEIR fixture's train and test qrels in one graded file (absolute path)."""
    path = tmp_path_factory.mktemp("st_qrels") / "train_and_test.s-3.qrel"
    path.write_text("".join((tiny_beir / "qrels-graded" / f"{s}.s-3.qrel").read_text() for s in ("train", "test")))
    return path


def beir_source(tiny_beir: Path, qrels: Path):
    """The multipos source both sides read: given order, BM25 negatives, grade weights."""
    from multipos.data.sources import BeirGradedSource

    return BeirGradedSource(str(tiny_beir), str(qrels), ordering="given", negative_depth=20,
                            grade_weights=GRADE_WEIGHTS)


@pytest.fixture(scope="session")
def loaded(tiny_beir, train_qrels):
    """(corpus, TrainQuery list) of :func:`beir_source`."""
    return beir_source(tiny_beir, train_qrels).load()


@pytest.fixture(scope="session")
def rows(tiny_beir, train_qrels):
    """The same queries as a multi-positive dataset (:func:`multipos.sentence_transformers.to_dataset`)."""
    from multipos.sentence_transformers import to_dataset

    return to_dataset(beir_source(tiny_beir, train_qrels))


@pytest.fixture(autouse=True)
def _one_thread():
    """These tests' tensors are tiny (a 32-dim BERT): one torch thread runs them faster than several, which spend
    their time starting and waiting (8 times faster on the 2-core CPU with another job running); restored after."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
