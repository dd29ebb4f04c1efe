"""Sequence packing (multipos.model.packing): a packed training batch gives the padded batch's embeddings and
gradients; rows hold every text once; what cannot be packed stays padded; the setting names no run."""

from __future__ import annotations

import logging
import random

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from multipos.model.encoder import DualEncoder
from multipos.model.packing import check_pack_sequences, encode_packed, pack, packing_applies, plan_rows, pool_packed
from multipos.runs.spec import run_key
from tests.conftest import TOPICS
from tests.helpers import compose_cfg, tiny_overrides


def _texts(n: int, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    words = " ".join(TOPICS.values()).split()
    return [" ".join(rng.choices(words, k=rng.choice([1, 2, 3, 5, 9, 20]))) for _ in range(n)]


def _embeddings_and_grads(model: DualEncoder, tokens: dict, packing: int):
    model.zero_grad(set_to_none=True)
    model.pack_sequences = packing
    q = model.encode_queries(tokens)
    (q @ q.T).logsumexp(dim=1).mean().backward()
    return q.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("pooling", ["mean", "cls"])
def test_a_packed_batch_gives_the_padded_batch_s_embeddings_and_gradients(tiny_bert, pooling):
    model = DualEncoder(str(tiny_bert), pooling=pooling, normalize=True, temperature=0.05,
                        attention_dropout=0.0, hidden_dropout=0.0, query_max_length=32)
    model.train()
    tokens = dict(model.tokenize(_texts(70), kind="query"))
    assert tokens["attention_mask"][:, 0].all() and not tokens["attention_mask"].all()  # right-padded, ragged
    calls = []
    encoder_forward = model.query_encoder.forward
    model.query_encoder.forward = lambda *a, **k: calls.append(tuple(k["input_ids"].shape)) or encoder_forward(*a, **k)
    padded, padded_grads = _embeddings_and_grads(model, tokens, 0)
    packed, packed_grads = _embeddings_and_grads(model, tokens, 64)
    rows, width = calls[-1]
    assert calls[0] == tuple(tokens["input_ids"].shape) and width <= 64
    assert rows * width < tokens["input_ids"].numel()  # fewer tokens through the layers than the padded batch
    assert len(calls) == 4  # padded; then the one-time check (padded + packed), then the packed batch
    torch.testing.assert_close(packed, padded, rtol=0, atol=1e-5)
    assert padded_grads.keys() == packed_grads.keys() and len(padded_grads) > 10
    for name, grad in padded_grads.items():
        torch.testing.assert_close(packed_grads[name], grad, rtol=1e-4, atol=1e-6, msg=name)
    model.pack_sequences = 64
    calls.clear()
    model.encode_queries(tokens)
    assert len(calls) == 1  # checked once per encoder


def test_eager_attention_packs_with_an_additive_mask(tiny_bert):
    model = DualEncoder(str(tiny_bert), pooling="mean", attention_dropout=0.0, hidden_dropout=0.0)
    model.query_encoder.config._attn_implementation = "eager"
    model.train()
    tokens = dict(model.tokenize(_texts(20, seed=2), kind="query"))
    padded, padded_grads = _embeddings_and_grads(model, tokens, 0)
    packed, packed_grads = _embeddings_and_grads(model, tokens, 32)
    torch.testing.assert_close(packed, padded, rtol=0, atol=1e-5)
    for name, grad in padded_grads.items():
        torch.testing.assert_close(packed_grads[name], grad, rtol=1e-4, atol=1e-6, msg=name)


def test_the_real_encoder_packs_with_its_attention_implementation(tmp_path):
    from multipos.assets import assets_dir

    minilm = assets_dir() / "models" / "all-MiniLM-L6-v2"
    if not minilm.is_dir():
        pytest.skip("all-MiniLM-L6-v2 not in the assets")
    model = DualEncoder(str(minilm), pooling="mean", normalize=True, attention_dropout=0.0, hidden_dropout=0.0,
                        query_max_length=32)
    model.train()
    tokens = dict(model.tokenize(_texts(16, seed=3), kind="query"))
    padded, _ = _embeddings_and_grads(model, tokens, 0)
    packed, _ = _embeddings_and_grads(model, tokens, 128)
    torch.testing.assert_close(packed, padded, rtol=0, atol=1e-5)


def test_eval_mode_left_padding_and_lasttoken_pooling_stay_padded(tiny_bert):
    model = DualEncoder(str(tiny_bert), attention_dropout=0.0, hidden_dropout=0.0)
    model.pack_sequences = 128
    tokens = dict(model.tokenize(_texts(32), kind="query"))
    left = {k: torch.flip(v, dims=[1]) for k, v in tokens.items()}  # padding on the left now
    padded_call = lambda enc, t: torch.zeros(1)  # noqa: E731  (never reached)
    assert not packing_applies(model.query_encoder, left, "cls", padded_call)
    assert not packing_applies(model.query_encoder, tokens, "lasttoken", padded_call)
    with pytest.raises(ValueError, match="padded on the right"):
        pack(left, 128)
    model.eval()
    shapes = []
    forward = model.query_encoder.forward
    model.query_encoder.forward = lambda *a, **k: shapes.append(tuple(k["input_ids"].shape)) or forward(*a, **k)
    model.encode_queries(tokens)
    assert shapes == [tuple(tokens["input_ids"].shape)]  # evaluation batches are length-sorted already


def test_an_encoder_that_fails_the_check_keeps_padded_batches(tiny_bert, caplog):
    model = DualEncoder(str(tiny_bert), pooling="mean", attention_dropout=0.0, hidden_dropout=0.0)
    model.train()
    model.pack_sequences = 128
    encoder = model.query_encoder
    forward = encoder.forward

    def shifted_positions(*a, position_ids=None, **k):  # positions derived otherwise (as RoBERTa's offset ones)
        return forward(*a, position_ids=None if position_ids is None else position_ids + 2, **k)

    encoder.forward = shifted_positions
    tokens = dict(model.tokenize(_texts(24, seed=1), kind="query"))
    with caplog.at_level(logging.WARNING, logger="multipos.model.packing"):
        assert not packing_applies(encoder, tokens, "mean", model._pooled_padded)
    assert "keeps padded batches" in caplog.text and "differ" in caplog.text
    assert not packing_applies(encoder, tokens, "mean", model._pooled_padded)  # remembered
    assert encoder.training  # the check restores training mode


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(1, 40), min_size=1, max_size=80), st.integers(1, 96))
def test_rows_hold_every_text_once_and_stay_balanced(lengths, capacity):
    row, offset, rows, width = plan_rows(lengths, capacity)
    spans = sorted((row[i], offset[i], offset[i] + lengths[i]) for i in range(len(lengths)))
    for (r1, _, e1), (r2, s2, _) in zip(spans, spans[1:]):
        assert r1 != r2 or e1 <= s2  # no overlap within a row
    assert set(row) == set(range(rows)) and rows == min(len(lengths), -(-sum(lengths) // capacity))
    assert width == max(e for _, _, e in spans) <= sum(lengths) / rows + max(lengths)
    assert rows * width < sum(lengths) + rows * max(lengths) + 1  # slots close to the real tokens


def test_pack_and_pool_lay_out_the_texts_as_planned():
    ids = torch.tensor([[101, 5, 6, 102, 0], [101, 7, 102, 0, 0], [101, 8, 9, 10, 102]])
    tokens = {"input_ids": ids, "attention_mask": (ids > 0).long()}
    packed = pack(tokens, 8)
    assert packed.lengths.tolist() == [4, 3, 5]
    for i in range(3):
        r, o, n = int(packed.row[i]), int(packed.offset[i]), int(packed.lengths[i])
        assert packed.input_ids[r, o:o + n].tolist() == ids[i, :n].tolist()
        assert packed.position_ids[r, o:o + n].tolist() == list(range(n))
        assert (packed.segment[r, o:o + n] == i).all()
    mask = packed.attention_mask("bool", torch.float32)[:, 0]
    assert mask.shape == (packed.input_ids.shape[0], packed.input_ids.shape[1], packed.input_ids.shape[1])
    assert mask.any(dim=-1).all()  # no empty softmax row
    hidden = torch.randn(*packed.input_ids.shape, 4)
    means = pool_packed(hidden, packed, "mean")
    firsts = pool_packed(hidden, packed, "cls")
    for i in range(3):
        r, o, n = int(packed.row[i]), int(packed.offset[i]), int(packed.lengths[i])
        torch.testing.assert_close(means[i], hidden[r, o:o + n].mean(0))
        torch.testing.assert_close(firsts[i], hidden[r, o])
    additive = packed.attention_mask("additive", torch.float32)[:, 0]
    assert ((additive == 0) == mask).all()
    with pytest.raises(ValueError, match="cannot be packed"):
        pool_packed(hidden, packed, "lasttoken")


def test_bad_values_and_unpackable_encoders_fail_clearly(tiny_bert):
    assert check_pack_sequences(None) == 0 and check_pack_sequences(128.0) == 128 and check_pack_sequences(0) == 0
    for bad in (-1, 1.5, "128", True):
        with pytest.raises(ValueError, match="pack_sequences: tokens per packed row"):
            check_pack_sequences(bad)
    with pytest.raises(ValueError, match="capacity"):
        plan_rows([3], 0)
    model = DualEncoder(str(tiny_bert))
    model.query_encoder.config._attn_implementation = "flash_attention_2"
    tokens = dict(model.tokenize(_texts(8), kind="query"))
    with pytest.raises(ValueError, match="4D mask"):
        encode_packed(model.query_encoder, tokens, "cls", 64)


def test_the_setting_names_no_run_and_bad_values_fail_before_anything_is_written(tiny_beir, tiny_bert, tmp_path):
    from multipos.train import train

    base = tiny_overrides(tiny_beir, tiny_bert, tmp_path / "run")
    assert compose_cfg("train", base).pack_sequences == 128
    assert run_key(compose_cfg("train", [*base, "pack_sequences=null"])) == run_key(compose_cfg("train", base))
    with pytest.raises(ValueError, match="pack_sequences"):
        train(compose_cfg("train", [*base, "pack_sequences=-1"]))
    assert not (tmp_path / "run").exists()
