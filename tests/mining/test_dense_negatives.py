"""Dense hard negatives (multipos.mining.dense_negatives): the exclusion rule, the dense top-k, the cache keyed by
weights
and corpus, and the ANCE-style refresh during training, including a run resumed mid-epoch."""

from __future__ import annotations

import copy
import hashlib
import json
import os
import shutil
from pathlib import Path
from types import SimpleNamespace

import lightning as L
import pytest
import torch

from multipos.data.sources import BeirGradedSource, TevatronSource
from multipos.formats.trec import read_qrels
from multipos.mining.dense_negatives import mine_dense_negatives
from multipos.model.encoder import DualEncoder
from multipos.retrieval import dense as retrieval
from multipos.retrieval import encoding
from multipos.training.callbacks import check_refresh_callback
from tests.helpers import compose_cfg, tiny_overrides

QRELS = "qrels-graded/train.s-3.qrel"
#: A grade-0 (judged non-relevant) passage of another topic per training query, added to the fixture's qrels.
GRADE0 = {"q-heart-0": "cancer-7", "q-cancer-0": "diet-7", "q-diet-0": "sleep-7", "q-sleep-0": "bone-7",
          "q-bone-0": "heart-7"}
ENCODER = {"pooling": "mean", "normalize": False}  # scores 1e-4 apart on the tiny BERT (CLS: 1e-7, float32 noise)


@pytest.fixture
def cache(tmp_path, monkeypatch):
    folder = tmp_path / "cache"
    monkeypatch.setenv("MULTIPOS_CACHE", str(folder))
    return folder


@pytest.fixture(scope="module")
def graded0(tiny_beir, tmp_path_factory):
    """The tiny BEIR folder with one grade-0 judgment per training query."""
    root = tmp_path_factory.mktemp("graded0") / "beir"
    shutil.copytree(tiny_beir, root)
    with (root / QRELS).open("a") as f:
        f.writelines(f"{q} 0 {p} 0\n" for q, p in GRADE0.items())
    return root


def _model(tiny_bert) -> DualEncoder:
    return DualEncoder(str(tiny_bert), **ENCODER)


def test_mined_negatives_exclude_every_judged_passage_and_are_the_dense_top_k(graded0, tiny_bert, cache):
    depth = 10
    corpus, queries = BeirGradedSource(str(graded0), QRELS, negative_depth=depth, negatives="dense",
                                       negative_model=str(tiny_bert), negative_encoder=ENCODER).load()
    _, bm25 = BeirGradedSource(str(graded0), QRELS, negative_depth=depth).load()
    qrels = read_qrels(graded0 / QRELS)
    assert {q.query_id for q in queries} == set(GRADE0)
    # the reference: every passage ranked by a direct retrieval with the same model, judged ones (grade 0 too) dropped
    model = _model(tiny_bert)
    q_emb = encoding.encode(model, [q.query for q in queries], "query", progress=False)
    p_emb = encoding.encode(model, corpus.texts(), "passage", progress=False)
    run = retrieval.search(q_emb, p_emb, [q.query_id for q in queries], corpus.ids, k=len(corpus))
    for q, b in zip(queries, bm25):
        judged = set(qrels[q.query_id])
        assert GRADE0[q.query_id] in judged and qrels[q.query_id][GRADE0[q.query_id]] == 0
        assert not judged & set(q.negatives) and not judged & set(b.negatives)  # the same rule for both miners
        expected = [p for p in run[q.query_id] if p not in judged][:depth]
        assert q.negatives == expected
        assert q.negatives != b.negatives[: len(q.negatives)]  # the dense miner is not BM25 under another name


def test_cache_hit_on_the_same_weights_and_corpus_miss_when_either_changes(tiny_beir, tiny_bert, cache, monkeypatch):
    corpus, queries = BeirGradedSource(str(tiny_beir), QRELS, negative_depth=5).load()
    texts = {q.query_id: q.query for q in queries}
    judged = {q.query_id: q.judged for q in queries}
    calls = []
    real_encode = encoding.encode
    monkeypatch.setattr(encoding, "encode", lambda *a, **kw: calls.append(a[2] if len(a) > 2 else kw.get("kind"))
                        or real_encode(*a, **kw))
    model = _model(tiny_bert)
    mine = lambda c=corpus: mine_dense_negatives(model, c, texts, judged, 5, bf16=False, progress=False)  # noqa: E731
    first = mine()
    assert sorted(calls) == ["passage", "query"]
    assert mine() == first and len(calls) == 2  # hit: nothing encoded
    files = sorted((cache / "negatives").glob("dense-*.npz"))
    assert len(files) == 1 and not list((cache / "negatives").glob("*.tmp-*"))
    with torch.no_grad():
        model.passage_encoder.embeddings.word_embeddings.weight.mul_(1.5)  # other weights: a miss
    changed = mine()
    assert len(calls) == 4 and len(list((cache / "negatives").glob("dense-*.npz"))) == 2
    assert changed != first
    edited = copy.deepcopy(corpus)
    pid = edited.ids[0]
    # same ids, one text edited
    edited.passages[pid] = type(edited[pid])(pid, edited[pid].title, edited[pid].text + " sleep")
    mine(edited)
    assert len(calls) == 6 and len(list((cache / "negatives").glob("dense-*.npz"))) == 3


def test_bad_negative_settings_name_the_field(tiny_beir, tiny_bert, cache, tmp_path):
    with pytest.raises(ValueError, match="data.source.negatives"):
        BeirGradedSource(str(tiny_beir), QRELS, negatives="splade")
    with pytest.raises(ValueError, match="negative_refresh_epochs"):
        BeirGradedSource(str(tiny_beir), QRELS, negatives="dense", negative_model="m", negative_refresh_epochs=0)
    with pytest.raises(ValueError, match="negative_model"):
        TevatronSource(str(tmp_path / "x.jsonl"), negatives="dense")
    with pytest.raises(ValueError, match="negative_encoder"):
        BeirGradedSource(str(tiny_beir), QRELS, negatives="dense", negative_model=str(tiny_bert),
                         negative_encoder={"pool": "cls"}).load()
    with pytest.raises(ValueError, match="callbacks.negative_refresh"):  # callbacks=none would drop the refresh
        check_refresh_callback(SimpleNamespace(callbacks=[]), SimpleNamespace(negative_refresh_epochs=2))


class PoolRecorder(L.Callback):
    """Test callback (``+callbacks.pool_recorder``): per (epoch, query) the hard negatives of each group trained on,
    the pools in use at each batch, and a copy of the model at each epoch end; raises at ``CRASH`` (epoch, batch)."""

    CRASH: tuple[int, int] | None = None
    runs: list[dict] = []

    def __init__(self):
        self.record = {"groups": {}, "pools": {}, "models": {}}
        PoolRecorder.runs.append(self.record)

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        epoch = trainer.current_epoch
        if PoolRecorder.CRASH == (epoch, batch_idx):
            raise RuntimeError("simulated crash")
        pools = trainer.datamodule.dataset.pools
        self.record["pools"].setdefault(epoch, set()).add(json.dumps(pools, sort_keys=True) if pools else "source")
        size = len(batch.passage_ids) // len(batch.query_ids)  # G: group i is columns i·G .. (i+1)·G, positives first
        for i, qid in enumerate(batch.query_ids):
            n_pos = int(batch.positive_mask[i].sum())
            self.record["groups"][(epoch, qid)] = batch.passage_ids[i * size + n_pos : (i + 1) * size]

    def on_train_epoch_end(self, trainer, pl_module):
        self.record["models"][trainer.current_epoch] = copy.deepcopy(pl_module.model).cpu()


def _sha(path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_training_refuses_a_refresh_period_without_its_callback(tiny_beir, tiny_bert, tmp_path, cache):
    """``callbacks=none`` drops ``callbacks.negative_refresh``: the stage stops before training instead of training
    on pools that never refresh (the check runs where the stage's Trainer is built, :mod:`multipos.training.fit`)."""
    from multipos.train import train

    extra = ["data.source.negatives=dense", "data.source.negative_refresh_epochs=1", "trainer.max_epochs=2",
             "eval.references=false", "eval.validation=null", "callbacks=none"]
    with pytest.raises(ValueError, match="callbacks.negative_refresh callback"):
        train(compose_cfg("train", tiny_overrides(tiny_beir, tiny_bert, tmp_path / "run", *extra)))


def test_refresh_every_k_epochs_and_a_resumed_run_trains_on_the_same_pools(tiny_beir, tiny_bert, tmp_path, cache):
    from multipos.train import train

    extra = ["data.source.negatives=dense", "data.source.negative_refresh_epochs=2", "trainer.max_epochs=5",
             "eval.references=false", "eval.validation=null", "callbacks.model_checkpoint.every_n_train_steps=1",
             "+callbacks.pool_recorder={_target_: tests.mining.test_dense_negatives.PoolRecorder}"]
    PoolRecorder.runs.clear()
    full = tmp_path / "full"
    train(compose_cfg("train", tiny_overrides(tiny_beir, tiny_bert, full, *extra)))
    rec = PoolRecorder.runs[-1]
    # one pool per epoch; epochs 0-1 the source's (starting checkpoint), 2-3 mined after epoch 1, 4 after epoch 3
    assert all(len(p) == 1 for p in rec["pools"].values()) and sorted(rec["pools"]) == [0, 1, 2, 3, 4]
    pools = [next(iter(rec["pools"][e])) for e in range(5)]
    assert pools[0] == pools[1] == "source" and pools[2] == pools[3] != pools[4] != "source"
    corpus, queries = BeirGradedSource(str(tiny_beir), QRELS, negative_depth=20).load()
    texts = {q.query_id: q.query for q in queries}
    judged = {q.query_id: q.judged for q in queries}
    for epoch, mined_after in ((2, 1), (4, 3)):  # the pools are the dense top-20 of the weights at that epoch's end
        expected = mine_dense_negatives(rec["models"][mined_after], corpus, texts, judged, 20, cache=False,
                                        progress=False)
        assert json.loads(pools[epoch]) == expected
        for (e, qid), negatives in rec["groups"].items():
            if e == epoch:
                assert set(negatives) <= set(expected[qid])

    broken = tmp_path / "broken"
    cfg = compose_cfg("train", tiny_overrides(tiny_beir, tiny_bert, broken, *extra))
    PoolRecorder.CRASH = (3, 1)  # mid-epoch 3, after the refresh of epoch 1 and the checkpoint of step (3, 0)
    try:
        with pytest.raises(RuntimeError, match="simulated crash"):
            train(cfg)
    finally:
        PoolRecorder.CRASH = None
    crashed = PoolRecorder.runs[-1]  # it trained batch (3, 0) on the pools its step checkpoint holds
    train(cfg)  # resumes from the step checkpoint: its pools come from the checkpoint
    resumed = PoolRecorder.runs[-1]
    assert min(resumed["groups"])[0] == 3  # the resumed run started in epoch 3
    assert resumed["pools"][3] == crashed["pools"][3]  # the interrupted run's pools, not mined again
    expected = mine_dense_negatives(resumed["models"][3], corpus, texts, judged, 20, cache=False, progress=False)
    assert json.loads(next(iter(resumed["pools"][4]))) == expected  # and its own refresh after epoch 3
    if os.environ.get("MULTIPOS_TEST_ACCELERATOR", "cpu") != "cpu":
        # on CUDA two runs of this job were not bitwise equal (H200, 2026-11-26: near-tied passages swapped places
        # in the pools mined after epoch 1; cause not isolated), so the uninterrupted run is no reference there
        return
    assert resumed["pools"][3] == {pools[3]} and resumed["pools"][4] == {pools[4]}
    for key, negatives in resumed["groups"].items():
        assert rec["groups"][key] == negatives
    assert json.loads((broken / "metrics.json").read_text()) == json.loads((full / "metrics.json").read_text())
    assert _sha(broken / "model" / "model.safetensors") == _sha(full / "model" / "model.safetensors")


def test_dataloader_workers_build_groups_from_the_refreshed_pools(tiny_beir, tiny_bert, tmp_path, cache):
    """Persistent DataLoader workers hold a copy of the dataset: with a refresh the loader is rebuilt every epoch."""
    from multipos.train import train

    PoolRecorder.runs.clear()
    train(compose_cfg("train", tiny_overrides(
        tiny_beir, tiny_bert, tmp_path / "run", "data.source.negatives=dense", "data.source.negative_refresh_epochs=1",
        "data.num_workers=1", "data.negative_selection=first", "trainer.max_epochs=2", "module.optimizer.lr=0.01",
        "eval.references=false", "eval.validation=null",
        "+callbacks.pool_recorder={_target_: tests.mining.test_dense_negatives.PoolRecorder}")))
    rec = PoolRecorder.runs[-1]
    refreshed = json.loads(next(iter(rec["pools"][1])))
    _, queries = BeirGradedSource(str(tiny_beir), QRELS, negative_depth=20, negatives="dense",
                                  negative_model=str(tiny_bert),
                                  negative_encoder={"pooling": "cls", "normalize": False}).load()
    # the starting checkpoint's pools (as tiny_overrides configures it)
    source = {q.query_id: q.negatives for q in queries}
    assert {epoch for epoch, _ in rec["groups"]} == {0, 1}
    for (epoch, qid), negatives in rec["groups"].items():  # first-ranked negatives of the epoch's pool
        assert negatives == (source if epoch == 0 else refreshed)[qid][: len(negatives)]
    assert any(refreshed[q][:2] != source[q][:2] for q in refreshed)


@pytest.mark.parametrize("negatives", ["bm25", "dense"])
def test_tevatron_source_mines_over_a_negative_corpus_without_its_positives(tiny_beir, tiny_bert, cache, negatives):
    fixture = Path(__file__).resolve().parents[1] / "fixtures" / "tevatron_train.jsonl"
    given = {q.query_id: q for q in TevatronSource(str(fixture)).load()[1]}
    corpus, queries = TevatronSource(str(fixture), negatives=negatives, negative_depth=5, negative_model=str(tiny_bert),
                                     negative_encoder=ENCODER, negative_corpus=str(tiny_beir / "corpus.jsonl")).load()
    assert "heart-0" in corpus and set(p for q in given.values() for p in (*q.judged, *q.negatives)) <= set(corpus.ids)
    for q in queries:
        assert q.judged == given[q.query_id].judged and len(q.negatives) == 5
        assert not set(q.negatives) & q.judged and set(q.negatives) <= set(corpus.ids)
