"""Row-sparse word-embedding gradients (multipos.training.embedding_gradients): the same dense gradient as the dense
backward, bit for bit with one backward pass a step and to float rounding with several; the model trains to the same
weights; removal restores the dense backward."""

from __future__ import annotations

import random

import pytest
import torch

from multipos.model.encoder import DualEncoder
from multipos.training.embedding_gradients import RowSparseEmbeddingGrads
from tests.conftest import TOPICS


def _texts(n: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    words = " ".join(TOPICS.values()).split()
    return [" ".join(rng.choices(words, k=rng.choice([1, 3, 8, 20]))) for _ in range(n)]


def _model(tiny_bert, packing: int = 0) -> DualEncoder:
    model = DualEncoder(str(tiny_bert), pooling="mean", normalize=True, temperature=0.05, attention_dropout=0.0,
                        hidden_dropout=0.0, query_max_length=32)
    model.freeze_passage_encoder()
    model.train()
    model.pack_sequences = packing
    return model


def _loss(model: DualEncoder, texts: list[str]) -> torch.Tensor:
    q = model.encode_queries(dict(model.tokenize(texts, kind="query")))
    return (q @ q.T / 0.05).logsumexp(dim=1).mean()


def _grads(model: DualEncoder) -> dict[str, torch.Tensor]:
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("packing", [0, 64])
def test_the_gradient_is_the_dense_backward_s_bit_for_bit_step_after_step(tiny_bert, packing):
    dense, sparse = _model(tiny_bert, packing), _model(tiny_bert, packing)
    hooks = RowSparseEmbeddingGrads([sparse.query_encoder, sparse.passage_encoder])
    assert len(hooks) == 1  # the frozen passage encoder's embeddings do not train
    weight = sparse.query_encoder.get_input_embeddings().weight
    for step in range(3):  # later steps zero only the rows the previous step wrote
        texts = _texts(12, seed=step)
        for model in (dense, sparse):
            model.zero_grad(set_to_none=True)
            _loss(model, texts).backward()
        g_dense, g_sparse = _grads(dense), _grads(sparse)
        assert g_dense.keys() == g_sparse.keys()
        for name, grad in g_dense.items():
            assert torch.equal(g_sparse[name], grad), name
        assert weight.grad.layout == torch.strided and weight.grad.count_nonzero() > 0
        used = set(sparse.tokenize(texts, kind="query")["input_ids"].flatten().tolist()) - {0}
        assert set(weight.grad.abs().sum(1).nonzero().flatten().tolist()) == used


def test_training_with_it_reaches_the_same_weights(tiny_bert):
    models = [_model(tiny_bert), _model(tiny_bert)]
    hooks = RowSparseEmbeddingGrads([models[1].query_encoder])
    opts = [torch.optim.AdamW([p for p in m.parameters() if p.requires_grad], lr=1e-3, fused=True) for m in models]
    for step in range(4):
        for model, opt in zip(models, opts):
            opt.zero_grad()
            _loss(model, _texts(10, seed=10 + step)).backward()
            torch.nn.utils.clip_grad_norm_([p for p in model.parameters() if p.requires_grad], 0.5)
            opt.step()
    for (name, a), b in zip(models[0].named_parameters(), models[1].parameters()):
        assert torch.equal(a, b), name
    hooks.remove()


def test_several_backward_passes_and_kept_gradients_add_up_to_the_dense_sum(tiny_bert):
    """GradCache-like chunks (two backward passes into one gradient) and zero_grad(set_to_none=False): the same
    sum, added row by row instead of matrix by matrix (float rounding apart)."""
    dense, sparse = _model(tiny_bert), _model(tiny_bert)
    RowSparseEmbeddingGrads([sparse.query_encoder])
    weight = sparse.query_encoder.get_input_embeddings().weight
    for set_to_none in (True, False, True):
        for model in (dense, sparse):
            model.zero_grad(set_to_none=set_to_none)
            _loss(model, _texts(6, seed=1)).backward()
            _loss(model, _texts(6, seed=2)).backward()
        expected = dense.query_encoder.get_input_embeddings().weight.grad
        torch.testing.assert_close(weight.grad, expected, rtol=1e-5, atol=1e-8)
        assert weight.grad.layout == torch.strided


def test_remove_restores_the_dense_backward(tiny_bert):
    model = _model(tiny_bert)
    embedding = model.query_encoder.get_input_embeddings()
    hooks = RowSparseEmbeddingGrads([model.query_encoder, model.query_encoder])
    assert len(hooks) == 1 and embedding.sparse
    hooks.remove()
    assert not embedding.sparse
    model.zero_grad(set_to_none=True)
    _loss(model, _texts(4, seed=3)).backward()
    assert embedding.weight.grad.layout == torch.strided


def test_an_embedding_it_cannot_handle_is_refused(tiny_bert):
    model = _model(tiny_bert)
    model.query_encoder.get_input_embeddings().max_norm = 1.0
    with pytest.raises(TypeError, match="max_norm"):
        RowSparseEmbeddingGrads([model.query_encoder])


def test_a_cpu_query_side_run_uses_it_and_trains_the_same_query_encoder(tiny_beir, tiny_bert, tmp_path, monkeypatch):
    from transformers import AutoModel

    import multipos.training.module as module
    from multipos.train import train
    from tests.helpers import compose_cfg, tiny_overrides

    made = []

    class Recording(RowSparseEmbeddingGrads):
        def __init__(self, encoders):
            super().__init__(encoders)
            made.append((self, len(self)))

    def run(out, use: bool):
        monkeypatch.setattr(module, "RowSparseEmbeddingGrads", Recording if use else lambda encoders: None)
        # a CPU run even where the suite trains on CUDA (MULTIPOS_TEST_ACCELERATOR=gpu)
        train(compose_cfg("train", ["passages=frozen_index", *tiny_overrides(
            tiny_beir, tiny_bert, out, "loss=jointlh", "trainer.max_epochs=2", "module.optimizer.lr=1e-3",
            "trainer.accelerator=cpu")]))
        return AutoModel.from_pretrained(out / "model" / "query_encoder").state_dict()

    dense, sparse = run(tmp_path / "dense", False), run(tmp_path / "sparse", True)
    assert [n for _, n in made] == [1] and len(made[0][0]) == 0  # one fit, one embedding; removed when fit ended
    assert dense.keys() == sparse.keys()
    for name, weight in dense.items():
        assert torch.equal(sparse[name], weight), name
