"""Length buckets (multipos.length_buckets): a training batch in length-sorted parts gives the padded batch's
embeddings and gradients; the part count follows the rule; the setting names no run."""

from __future__ import annotations

import random

import pytest
import torch

from multipos.length_buckets import MIN_ROWS, bucket_count, check_length_buckets, embed_in_length_buckets
from multipos.model import DualEncoder
from multipos.runs.keys import config_hash
from tests.conftest import TOPICS
from tests.helpers import compose_cfg, tiny_overrides


def _texts(n: int, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    words = " ".join(TOPICS.values()).split()
    return [" ".join(rng.choices(words, k=rng.choice([1, 2, 3, 5, 9, 20]))) for _ in range(n)]


def _embeddings_and_grads(model: DualEncoder, tokens: dict, buckets: int):
    model.zero_grad(set_to_none=True)
    model.length_buckets = buckets
    q = model.encode_queries(tokens)
    (q @ q.T).logsumexp(dim=1).mean().backward()
    return q.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("pooling", ["mean", "cls"])
def test_buckets_give_the_padded_batch_s_embeddings_and_gradients(tiny_bert, pooling):
    model = DualEncoder(str(tiny_bert), pooling=pooling, normalize=True, temperature=0.05,
                        attention_dropout=0.0, hidden_dropout=0.0, query_max_length=32)
    model.train()
    tokens = dict(model.tokenize(_texts(70), kind="query"))
    assert tokens["attention_mask"][:, 0].all() and not tokens["attention_mask"].all()  # right-padded, ragged
    calls = []
    encoder_forward = model.query_encoder.forward
    model.query_encoder.forward = lambda *a, **k: calls.append(k["input_ids"].shape) or encoder_forward(*a, **k)
    whole, whole_grads = _embeddings_and_grads(model, tokens, 1)
    parts, parts_grads = _embeddings_and_grads(model, tokens, 4)
    assert [c[0] for c in calls] == [70, 18, 18, 18, 16]  # 70 rows: 4 parts (torch.chunk sizes)
    assert sum(r * w for r, w in calls[1:]) < 70 * calls[0][1]  # fewer padded tokens than the whole batch
    torch.testing.assert_close(parts, whole, rtol=0, atol=1e-5)
    assert whole_grads.keys() == parts_grads.keys() and len(whole_grads) > 10
    for name, grad in whole_grads.items():
        torch.testing.assert_close(parts_grads[name], grad, rtol=1e-4, atol=1e-6, msg=name)


def test_eval_mode_and_left_padding_encode_the_batch_whole(tiny_bert):
    model = DualEncoder(str(tiny_bert), attention_dropout=0.0, hidden_dropout=0.0)
    model.length_buckets = 4
    tokens = dict(model.tokenize(_texts(64), kind="query"))
    seen = []
    left = {k: torch.flip(v, dims=[1]) for k, v in tokens.items()}  # padding on the left now
    embed = lambda part: seen.append(part["input_ids"].shape[0]) or part["input_ids"].float().sum(1, keepdim=True)  # noqa: E731
    embed_in_length_buckets(embed, left, 4)
    assert seen == [64]
    model.eval()
    shapes = []
    forward = model.query_encoder.forward
    model.query_encoder.forward = lambda *a, **k: shapes.append(k["input_ids"].shape[0]) or forward(*a, **k)
    model.encode_queries(tokens)
    assert shapes == [64]  # evaluation batches are length-sorted already (multipos.retrieval.encoding)


def test_bucket_count_rule_and_bad_values():
    cpu = torch.device("cpu")
    assert bucket_count(4, 64, cpu) == 4 and bucket_count(4, 48, cpu) == 3 and bucket_count(4, 2 * MIN_ROWS - 1, cpu) == 1
    assert bucket_count(8, 512, cpu) == 8 and bucket_count(1, 512, cpu) == 1
    assert bucket_count(4, 512, torch.device("meta")) == 1  # off the CPU: one padded batch
    assert check_length_buckets(None) == 1 and check_length_buckets(2.0) == 2
    for bad in (0, -1, 1.5, "4", True):
        with pytest.raises(ValueError, match="length_buckets: a whole number >= 1"):
            check_length_buckets(bad)


def test_the_setting_names_no_run_and_bad_values_fail_before_anything_is_written(tiny_beir, tiny_bert, tmp_path):
    from multipos.train import train

    base = tiny_overrides(tiny_beir, tiny_bert, tmp_path / "run")
    assert compose_cfg("train", base).length_buckets == 4
    assert config_hash(compose_cfg("train", [*base, "length_buckets=1"])) == config_hash(compose_cfg("train", base))
    with pytest.raises(ValueError, match="length_buckets"):
        train(compose_cfg("train", [*base, "length_buckets=0"]))
    assert not (tmp_path / "run").exists()
