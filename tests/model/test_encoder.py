"""DualEncoder, RetrieverModule and the data module on the tiny random BERT."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
import torch

from multipos.data.datamodule import MultiPosDataModule
from multipos.data.sources import BeirGradedSource
from multipos.losses import ContrastiveLoss
from multipos.model.encoder import DualEncoder, pool
from multipos.training.module import OptimizerSettings, RetrieverModule


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
    module = RetrieverModule(model, ContrastiveLoss("lsepair"), optimizer=OptimizerSettings(lr=5e-3))
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
    from multipos.retrieval.encoding import encode

    given = BeirGradedSource(str(tiny_beir), "qrels-graded/train.s-3.qrel", negative_depth=20)
    teacher = BeirGradedSource(str(tiny_beir), "qrels-graded/train.s-3.qrel", negative_depth=20,
                               ordering="teacher", teacher=str(tiny_bert))
    corpus, by_file = given.load()
    _, by_teacher = teacher.load()
    # the tiny BERT has no saved settings nor sentence-transformers files: the teacher uses the defaults
    model = DualEncoder(str(tiny_bert), pooling="cls", normalize=False, passage_max_length=256)
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


# ----------------------------------------------------------------------------- saved settings, dtype, remote code

PRESETS = Path(__file__).resolve().parents[2] / "conf" / "model"


def _preset(name: str, checkpoint) -> DualEncoder:
    """``conf/model/<name>.yaml`` instantiated as under the jobs, on ``checkpoint``."""
    from hydra.utils import instantiate
    from omegaconf import OmegaConf

    cfg = OmegaConf.load(PRESETS / f"{name}.yaml")
    cfg.name_or_path = str(checkpoint)
    return instantiate(cfg)


def _tiny_variant(src, dst, seed: int, dtype: torch.dtype | None = None):
    """The tiny BERT's architecture and tokenizer with weights drawn from ``seed`` (saved in ``dtype``)."""
    from transformers import AutoTokenizer, BertConfig, BertModel

    torch.manual_seed(seed)
    model = BertModel(BertConfig.from_pretrained(src))
    if dtype is not None:
        model = model.to(dtype)
    model.save_pretrained(dst)
    AutoTokenizer.from_pretrained(src).save_pretrained(dst)
    return dst


def test_saved_settings_win_over_the_preset(tiny_bert, tmp_path, caplog):
    cls = DualEncoder(str(tiny_bert), pooling="cls", normalize=False, temperature=1.0)
    cls.save_pretrained(tmp_path / "m")
    with caplog.at_level(logging.WARNING, logger="multipos.model.encoder"):
        loaded = _preset("minilm", tmp_path / "m")  # mean, L2, τ 0.05 in the preset
    assert (loaded.pooling, loaded.normalize, loaded.temperature, loaded.shared) == ("cls", False, 1.0, True)
    saved = tmp_path / "m" / "multipos_encoder.json"
    assert f"model.pooling=mean (config) differs from cls saved in {saved}: using the saved value" in caplog.text
    assert "model.normalize=True (config) differs from False" in caplog.text
    assert "model.temperature=0.05 (config) differs from 1.0" in caplog.text
    assert "set model.prefer_saved=false to force the config" in caplog.text
    assert "model.shared" not in caplog.text  # equal values: no warning
    cls.eval(), loaded.eval()
    tokens = cls.tokenize(["calcium bone fracture", "sleep"])
    assert torch.allclose(loaded.encode_passages(tokens), cls.encode_passages(tokens), atol=1e-6)


def test_prefer_saved_false_forces_the_config(tiny_bert, tmp_path, caplog):
    DualEncoder(str(tiny_bert), pooling="cls", normalize=False).save_pretrained(tmp_path / "m")
    with caplog.at_level(logging.WARNING, logger="multipos.model.encoder"):
        forced = DualEncoder(str(tmp_path / "m"), pooling="mean", normalize=True, temperature=0.05, prefer_saved=False)
    assert (forced.pooling, forced.normalize, forced.temperature) == ("mean", True, 0.05)
    assert ("model.pooling=mean (config) differs from cls saved in" in caplog.text
            and "using the config value" in caplog.text)
    partial = DualEncoder(str(tmp_path / "m"), pooling="mean", prefer_saved=False)  # None still = saved
    assert (partial.pooling, partial.normalize) == ("mean", False)


@pytest.mark.parametrize("preset", ["minilm", "bert_base"])
def test_untied_checkpoint_stays_untied_under_a_shared_preset(tiny_bert, tmp_path, preset):
    model = DualEncoder(str(tiny_bert), pooling="cls", normalize=False, shared=False)
    with torch.no_grad():
        model.passage_encoder.embeddings.word_embeddings.weight.add_(1.0)
    model.save_pretrained(tmp_path / "m")
    loaded = _preset(preset, tmp_path / "m")  # shared: true in the preset
    assert loaded.shared is False and loaded.query_encoder is not loaded.passage_encoder
    for mine, theirs in ((loaded.query_encoder, model.query_encoder), (loaded.passage_encoder, model.passage_encoder)):
        want = theirs.state_dict()
        for name, t in mine.state_dict().items():
            assert torch.equal(t, want[name]), name
    assert not torch.equal(loaded.query_encoder.embeddings.word_embeddings.weight,
                           loaded.passage_encoder.embeddings.word_embeddings.weight)


def test_sentence_transformers_files_give_default_settings(assets):
    model = DualEncoder(str(assets / "models" / "all-MiniLM-L6-v2"))  # its modules.json: mean pooling + Normalize
    assert (model.pooling, model.normalize) == ("mean", True)
    assert DualEncoder(str(assets / "models" / "all-MiniLM-L6-v2"), pooling="cls").pooling == "cls"  # argument wins


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_checkpoint_loads_as_float32(tiny_bert, tmp_path, dtype):
    from transformers import AutoModel

    path = _tiny_variant(tiny_bert, tmp_path / "half", seed=1, dtype=dtype)
    assert next(AutoModel.from_pretrained(str(path)).parameters()).dtype == dtype  # saved in half precision
    model = DualEncoder(str(path), pooling="mean", normalize=True, temperature=0.05)
    assert {p.dtype for p in model.parameters()} == {torch.float32}
    q = model.encode_queries(model.tokenize(["heart cholesterol", "sleep night"], "query"))
    p = model.encode_passages(model.tokenize(["heart study", "sleep night rest", "bone calcium", "diet fruit"]))
    scores = model.score(q, p)
    positive = torch.tensor([[1, 1, 0, 0], [0, 0, 1, 1]], dtype=torch.bool)
    loss = ContrastiveLoss("lsepair")(scores, positive, ~positive)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    before = model.query_encoder.embeddings.word_embeddings.weight.detach().clone()
    loss.backward()
    opt.step()
    assert torch.isfinite(loss)
    assert not torch.equal(before, model.query_encoder.embeddings.word_embeddings.weight)


def test_trust_remote_code_is_off_unless_configured(tiny_bert, monkeypatch):
    import multipos.model.encoder as model_module

    seen = []
    for cls_name in ("AutoModel", "AutoTokenizer"):
        cls = getattr(model_module, cls_name)
        real = cls.from_pretrained

        def spy(*args, _real=real, _name=cls_name, **kwargs):
            seen.append((_name, kwargs.get("trust_remote_code", "missing")))
            return _real(*args, **kwargs)

        monkeypatch.setattr(cls, "from_pretrained", spy)
    DualEncoder(str(tiny_bert), shared=False)
    assert seen == [("AutoModel", False), ("AutoModel", False), ("AutoTokenizer", False)]
    seen.clear()
    DualEncoder(str(tiny_bert), trust_remote_code=True)
    assert seen == [("AutoModel", True), ("AutoTokenizer", True)]
    for preset in ("minilm", "bert_base"):
        from omegaconf import OmegaConf

        cfg = OmegaConf.load(PRESETS / f"{preset}.yaml")
        assert cfg.trust_remote_code is False and cfg.prefer_saved is True
