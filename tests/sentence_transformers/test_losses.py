"""The sentence-transformers losses compute multipos's numbers: on one batch, loss and gradients equal those of
RetrieverModule.batch_loss (float64, 1e-6) for every objective, w.r.t. the embeddings and w.r.t. the encoder's
parameters; with one positive per query they are MultipleNegativesRankingLoss's; the cached loss is the plain one."""

from __future__ import annotations

import dataclasses

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from multipos.data.collate import Batch, GroupCollator
from multipos.data.groups import GroupBuilder, group_masks
from multipos.losses import HARDEST_NEGATIVE, OBJECTIVES, SINGLE_POSITIVE, SOFT_OBJECTIVES, ContrastiveLoss
from multipos.sentence_transformers import CachedMultiPositiveLoss, MultiPositiveDataCollator, MultiPositiveLoss
from multipos.training.module import RetrieverModule
from tests.sentence_transformers.conftest import GRADE_WEIGHTS

#: Every objective these losses train (margin_mse needs a teacher's scores: refused, test_errors).
NAMES = sorted((set(OBJECTIVES) | set(SOFT_OBJECTIVES)) - {"margin_mse"})
TAU = 0.2
TOL = {"rtol": 1e-6, "atol": 1e-6}


class Scorer(nn.Module):
    """The DualEncoder score, q · pᵀ / τ, kept in float64 (DualEncoder.score computes it in float32)."""

    temperature = TAU

    def score(self, q, p):
        return q @ p.T / self.temperature


def features(batch: dict) -> list[dict]:
    """The loss inputs the trainer makes of a collated batch (SentenceTransformerTrainer.collect_features)."""
    return [{k[len(p):]: v for k, v in batch.items() if k.startswith(p)} for p in ("query_", "passages_")]


@pytest.fixture(scope="module")
def data(loaded, rows):
    """(corpus, TrainQuery list, rows) with a variable number of positives: every other query keeps one."""
    corpus, queries = loaded
    out_q, out_r = [], []
    for i, (q, r) in enumerate(zip(queries, rows)):
        if i % 2 == 0:
            kept = q.gold[:1]
            q = dataclasses.replace(q, gold=kept, silver=[], judged=set(kept), weights={p: q.weights[p] for p in kept})
            r = {**r, "positives": r["positives"][:1], "grades": r["grades"][:1]}
        out_q.append(q)
        out_r.append(r)
    return corpus, out_q, out_r


def multipos_groups(queries, objective: str, group_size: int = 3, seed: int = 5):
    builder = GroupBuilder(group_size, 2, "random", SINGLE_POSITIVE.get(objective), "random", seed=seed)
    return [builder.build(q, q.positives("all"), 0) for q in queries]


def st_collator(preprocess, objective: str, group_size: int = 3, seed: int = 5, **kwargs):
    return MultiPositiveDataCollator(preprocess, max_positives=2, group_size=group_size, positive_selection="random",
                                     objective=objective, grade_weights=GRADE_WEIGHTS, seed=seed, epoch=0, **kwargs)


@pytest.mark.parametrize("objective", NAMES)
def test_embedding_gradients_equal_retriever_module(data, objective):
    """Random float64 embeddings of each text; cosine similarity × 1/τ against multipos's L2-normalised dot / τ."""
    corpus, queries, rows = data
    vocab: dict[str, int] = {}

    def ids(texts, **_):
        return {"input_ids": torch.tensor([[vocab.setdefault(t, len(vocab))] for t in texts])}

    batch = st_collator(ids, objective)(rows)
    groups = multipos_groups(queries, objective)
    assert {g.n_positives for g in groups} == ({1} if objective in SINGLE_POSITIVE else {1, 2})
    columns = [corpus[pid].full_text() for g in groups for pid in g.passage_ids]
    torch.manual_seed(0)
    table = torch.randn(len(vocab) + len(columns), 16, dtype=torch.float64)
    q = torch.randn(len(groups), 16, dtype=torch.float64)
    p = table[batch["passages_input_ids"][:, 0]]
    assert torch.equal(p, table[torch.tensor([vocab[t] for t in columns])])  # the same passages in the same columns

    q_st, p_st = q.clone().requires_grad_(), p.clone().requires_grad_()
    loss_st = MultiPositiveLoss(None, objective, temperature=TAU).compute_loss_from_embeddings([q_st, p_st],
                                                                                              batch["label"])
    loss_st.backward()

    positive_mask, negative_mask = group_masks(groups)
    mp_batch = Batch(None, None, positive_mask, negative_mask, [g.query_id for g in groups],
                     [pid for g in groups for pid in g.passage_ids], groups)
    module = RetrieverModule(Scorer(), ContrastiveLoss(objective))
    q_mp, p_mp = q.clone().requires_grad_(), p.clone().requires_grad_()
    loss_mp, _ = module.batch_loss(F.normalize(q_mp, dim=-1), F.normalize(p_mp, dim=-1), mp_batch)
    loss_mp.backward()

    assert loss_st.dtype == torch.float64
    torch.testing.assert_close(loss_st, loss_mp, **TOL)
    torch.testing.assert_close(q_st.grad, q_mp.grad, **TOL)
    torch.testing.assert_close(p_st.grad, p_mp.grad, **TOL)


@pytest.fixture(scope="module")
def models(tiny_bert):
    """(SentenceTransformer, DualEncoder) of the same tiny BERT, float64, mean pooling, no normalisation, eval."""
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer.modules import Pooling, Transformer

    from multipos.model.encoder import DualEncoder

    transformer = Transformer(str(tiny_bert))
    st = SentenceTransformer(modules=[transformer, Pooling(transformer.get_embedding_dimension(), "mean")],
                             device="cpu").double().eval()
    de = DualEncoder(str(tiny_bert), pooling="mean", normalize=False, temperature=TAU).double().eval()
    de.score = Scorer().score
    return st, de


def st_grads(st) -> dict[str, torch.Tensor]:
    return {n.removeprefix("0.model."): p.grad for n, p in st.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("objective", NAMES)
def test_parameter_gradients_equal_retriever_module(models, data, objective):
    """The whole path: tokenisation, the encoder, the masks, the objective; gradients of every encoder weight."""
    from sentence_transformers.util import dot_score

    st, de = models
    st.zero_grad()
    de.zero_grad()
    corpus, queries, rows = data
    groups = multipos_groups(queries, objective)
    mp_batch = GroupCollator(de.tokenizer, corpus, query_max_length=16, passage_max_length=32)(groups)
    module = RetrieverModule(de, ContrastiveLoss(objective))
    loss_mp, _ = module.batch_loss(de.encode_queries(mp_batch.query), de.encode_passages(mp_batch.passages), mp_batch)
    loss_mp.backward()

    batch = st_collator(st.preprocess, objective, query_max_length=16, passage_max_length=32)(rows)
    loss_st = MultiPositiveLoss(st, objective, temperature=TAU, similarity_fct=dot_score)(features(batch),
                                                                                        batch["label"])
    loss_st.backward()

    torch.testing.assert_close(loss_st, loss_mp, **TOL)
    want = {n: p.grad for n, p in de.query_encoder.named_parameters() if p.grad is not None}
    got = st_grads(st)
    assert got.keys() == want.keys() and len(got) > 20
    for name in want:
        torch.testing.assert_close(got[name], want[name], **TOL, msg=lambda m, name=name: f"{name}: {m}")


def one_positive_rows(loaded):
    """One query per topic (no text in two rows), its first positive and its two BM25 negatives."""
    corpus, queries = loaded
    out, topics = [], set()
    for q in queries:
        topic = q.query_id.split("-")[1]
        if topic not in topics:
            topics.add(topic)
            out.append({"query": q.query, "positives": [corpus[q.gold[0]].full_text()],
                        "negatives": [corpus[n].full_text() for n in q.negatives[:2]], "grades": [1.0]})
    return out


@pytest.mark.parametrize("objective", sorted(set(NAMES) - HARDEST_NEGATIVE))
def test_one_positive_is_multiple_negatives_ranking_loss(make_st, loaded, objective):
    from sentence_transformers.sentence_transformer.losses import MultipleNegativesRankingLoss

    st = make_st(torch.float64).eval()
    rows = one_positive_rows(loaded)
    columns = {"anchor": [r["query"] for r in rows], "positive": [r["positives"][0] for r in rows],
               **{f"negative_{k}": [r["negatives"][k] for r in rows] for k in range(2)}}
    mnrl = MultipleNegativesRankingLoss(st, scale=1 / TAU)
    loss_mnrl = mnrl([st.preprocess(texts, max_length=32) for texts in columns.values()], None)
    loss_mnrl.backward()
    want = {n: g.clone() for n, g in st_grads(st).items()}
    st.zero_grad()

    batch = MultiPositiveDataCollator(st.preprocess, objective=objective, negative_selection="first",
                                      query_max_length=32, passage_max_length=32)(rows)
    loss = MultiPositiveLoss(st, objective, temperature=TAU)(features(batch), batch["label"])
    loss.backward()
    torch.testing.assert_close(loss, loss_mnrl, **TOL)
    got = st_grads(st)
    for name in want:
        torch.testing.assert_close(got[name], want[name], **TOL)


def _run(loss_fn, st, batch, seed: int, scale: float = 1.0):
    st.zero_grad()
    torch.manual_seed(seed)
    loss = loss_fn(features(batch), batch["label"])
    (loss * scale).backward()
    return loss.detach(), {n: g.clone() for n, g in st_grads(st).items()}


@pytest.mark.parametrize("objective", ["jointlh", "lsepair_maxn", "kl"])
def test_cached_equals_plain(make_st, rows, objective):
    st = make_st(torch.float64)
    batch = st_collator(st.preprocess, objective, group_size=4, query_max_length=16, passage_max_length=32)(list(rows))
    plain = MultiPositiveLoss(st, objective, temperature=TAU)
    cached = CachedMultiPositiveLoss(st, objective, temperature=TAU, mini_batch_size=3)
    st.eval()  # chunks of 3 rows: no dropout, the same function of the parameters
    loss, grads = _run(plain, st, batch, 0, scale=0.5)
    loss_c, grads_c = _run(cached, st, batch, 0, scale=0.5)  # the trainer's loss scaling reaches every chunk
    torch.testing.assert_close(loss_c, loss, rtol=1e-10, atol=1e-10)
    assert grads_c.keys() == grads.keys()
    for name in grads:
        torch.testing.assert_close(grads_c[name], grads[name], rtol=1e-9, atol=1e-10)
    with torch.no_grad():  # evaluation: no cache, the same value
        torch.testing.assert_close(cached(features(batch), batch["label"]), loss, rtol=1e-10, atol=1e-10)

    st.train()  # dropout: one chunk per side draws the plain loss's masks; the re-forward must replay them
    whole = CachedMultiPositiveLoss(st, objective, temperature=TAU, mini_batch_size=1000)
    loss, grads = _run(plain, st, batch, 1)
    loss_c, grads_c = _run(whole, st, batch, 1)
    assert not torch.equal(loss, _run(plain, st, batch, 2)[0])  # dropout is on
    torch.testing.assert_close(loss_c, loss, rtol=1e-10, atol=1e-10)
    for name in grads:
        torch.testing.assert_close(grads_c[name], grads[name], rtol=1e-9, atol=1e-10)


def test_errors(make_st, rows):
    st = make_st()
    with pytest.raises(ValueError, match="MarginMSELoss"):
        MultiPositiveLoss(st, "margin_mse")
    with pytest.raises(ValueError, match="unknown objective"):
        MultiPositiveLoss(st, "infonce")
    with pytest.raises(ValueError, match="temperature"):
        MultiPositiveLoss(st, temperature=0)
    multi = MultiPositiveDataCollator(st.preprocess, max_positives=2, group_size=3)(list(rows))
    with pytest.raises(ValueError, match="objective='singlelh'"):
        MultiPositiveLoss(st, "singlelh")(features(multi), multi["label"])
    ungraded = MultiPositiveDataCollator(st.preprocess, max_positives=2, group_size=3)(
        [{k: v for k, v in r.items() if k != "grades"} for r in rows])
    with pytest.raises(ValueError, match="'grades' column"):
        MultiPositiveLoss(st, "kl")(features(ungraded), ungraded["label"])
    with pytest.raises(ValueError, match="MultiPositiveDataCollator"):
        MultiPositiveLoss(st)(features(multi), None)
    loss = CachedMultiPositiveLoss(st, "lsepair", mini_batch_size=4)
    assert loss.get_config_dict() == {"objective": "lsepair", "temperature": 0.05, "similarity_fct": "cos_sim",
                                      "normalize_by_positives": False, "mini_batch_size": 4}
    assert "2602.12727" in loss.citation and "2101.06983" in loss.citation and loss.scale == 20.0
