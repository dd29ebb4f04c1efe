"""DualEncoder, RetrieverModule and the data module on the tiny random BERT."""

from __future__ import annotations

import json

import pytest
import torch

from multipos.data import MultiPosDataModule
from multipos.losses import ContrastiveLoss
from multipos.model import DualEncoder, pool
from multipos.module import RetrieverModule
from multipos.sources import BeirGradedSource


def test_pool_cls_and_mean():
    hidden = torch.tensor([[[1.0, 2.0], [3.0, 4.0], [100.0, 100.0]]])
    mask = torch.tensor([[1, 1, 0]])
    assert torch.equal(pool(hidden, mask, "cls"), torch.tensor([[1.0, 2.0]]))
    assert torch.allclose(pool(hidden, mask, "mean"), torch.tensor([[2.0, 3.0]]))  # padding excluded
    with pytest.raises(ValueError, match="pooling"):
        pool(hidden, mask, "max")


def test_encoder_normalises_and_scales(tiny_bert):
    model = DualEncoder(str(tiny_bert), pooling="mean", normalize=True, temperature=0.05)
    assert model.training  # from_pretrained returns eval mode; we must train with dropout
    model.eval()
    q = model.encode_queries(model.tokenize(["heart cholesterol"], "query"))
    p = model.encode_passages(model.tokenize(["heart study", "sleep night rest"]))
    assert q.shape == (1, 32) and p.shape == (2, 32)
    assert torch.allclose(q.norm(dim=-1), torch.ones(1), atol=1e-5)
    assert torch.allclose(model.score(q, p), q @ p.T / 0.05, atol=1e-4)


@pytest.mark.parametrize("shared", [True, False])
def test_save_and_reload_round_trip(tiny_bert, tmp_path, shared):
    model = DualEncoder(str(tiny_bert), pooling="cls", normalize=False, temperature=1.0, shared=shared)
    if not shared:
        assert model.query_encoder is not model.passage_encoder
        with torch.no_grad():
            model.passage_encoder.embeddings.word_embeddings.weight.add_(1.0)
    model.save_pretrained(tmp_path / "m")
    meta = json.loads((tmp_path / "m" / "multipos_encoder.json").read_text())
    assert meta["shared"] is shared and meta["pooling"] == "cls"
    again = DualEncoder(str(tmp_path / "m"))  # pooling/normalize/shared restored from the file
    assert again.shared is shared and again.pooling == "cls"
    model.eval(), again.eval()
    tokens = model.tokenize(["calcium bone"])
    assert torch.allclose(model.encode_passages(tokens), again.encode_passages(tokens), atol=1e-5)
    assert torch.allclose(model.encode_queries(tokens), again.encode_queries(tokens), atol=1e-5)


def test_invalid_temperature_and_pooling(tiny_bert):
    with pytest.raises(ValueError, match="temperature"):
        DualEncoder(str(tiny_bert), temperature=0.0)
    with pytest.raises(ValueError, match="pooling"):
        DualEncoder(str(tiny_bert), pooling="max")


def _datamodule(tiny_beir, tiny_bert, **kw):
    source = BeirGradedSource(str(tiny_beir), "qrels-graded/train.s-3.qrel", negative_depth=20)
    args = dict(regime="heterogeneous", group_size=4, max_positives=2, batch_size=3)
    args.update(kw)
    return MultiPosDataModule(source, str(tiny_bert), **args)


def test_datamodule_batches_have_group_masks(tiny_beir, tiny_bert):
    dm = _datamodule(tiny_beir, tiny_bert)
    dm.setup()
    batch = next(iter(dm.train_dataloader()))
    assert batch.query["input_ids"].shape[0] == 3
    assert batch.passages["input_ids"].shape[0] == 3 * 4
    assert batch.positive_mask.shape == batch.negative_mask.shape == (3, 12)
    assert batch.positive_mask.sum(1).tolist() == [2, 2, 2]  # M = 2 positives per group
    assert not (batch.positive_mask & batch.negative_mask).any()


def test_datamodule_single_positive_and_regimes(tiny_beir, tiny_bert):
    dm = _datamodule(tiny_beir, tiny_bert)
    dm.set_stage("gold", "first")
    dm.setup()
    batch = next(iter(dm.train_dataloader()))
    assert batch.positive_mask.sum(1).tolist() == [1, 1, 1]
    with pytest.raises(ValueError, match="regime"):
        _datamodule(tiny_beir, tiny_bert, regime="mixed")
    with pytest.raises(ValueError, match="group_size"):
        _datamodule(tiny_beir, tiny_bert, group_size=1)


def test_training_step_reduces_loss(tiny_beir, tiny_bert):
    """A few optimiser steps on one batch lower the LSEPair loss (the model learns)."""
    torch.manual_seed(0)
    dm = _datamodule(tiny_beir, tiny_bert, batch_size=4)
    dm.setup()
    batch = next(iter(dm.train_dataloader()))
    model = DualEncoder(str(tiny_bert), pooling="cls", normalize=False, temperature=1.0)
    model.eval()  # no dropout: a deterministic descent check
    module = RetrieverModule(model, ContrastiveLoss("lsepair"), lr=5e-3)
    opt = torch.optim.AdamW(module.parameters(), lr=5e-3)
    losses = []
    for _ in range(8):
        loss = module.loss(module(batch), batch.positive_mask, batch.negative_mask)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < 0.9 * losses[0]


def test_teacher_ordering_sorts_positives_by_teacher_score(tiny_beir, tiny_bert):
    from multipos.retrieval import encode

    given = BeirGradedSource(str(tiny_beir), "qrels-graded/train.s-3.qrel", negative_depth=20)
    teacher = BeirGradedSource(str(tiny_beir), "qrels-graded/train.s-3.qrel", negative_depth=20,
                               ordering="teacher", teacher=str(tiny_bert))
    corpus, by_file = given.load()
    _, by_teacher = teacher.load()
    model = DualEncoder(str(tiny_bert), pooling="mean", normalize=True, passage_max_length=256)
    for q0, q1 in zip(by_file, by_teacher):
        assert sorted(q0.silver) == sorted(q1.silver) and sorted(q0.gold) == sorted(q1.gold)
        qe = encode(model, [q1.query], "query", progress=False)[0]
        pe = encode(model, corpus.texts(q1.silver), "passage", progress=False)
        scores = pe @ qe
        assert all(scores[i] >= scores[i + 1] - 1e-4 for i in range(len(scores) - 1))
    with pytest.raises(ValueError, match="ordering"):
        BeirGradedSource(str(tiny_beir), "x", ordering="bm25")


def test_dropout_overrides_reach_the_encoder(tiny_bert):
    model = DualEncoder(str(tiny_bert), attention_dropout=0.0, hidden_dropout=0.2)
    assert model.query_encoder.config.attention_probs_dropout_prob == 0.0
    assert model.query_encoder.config.hidden_dropout_prob == 0.2
