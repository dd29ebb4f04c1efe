"""Query-side fine-tuning end to end on the tiny fixtures (passages=frozen_index): only E_q trains, the corpus is
encoded once for the whole run, and the saved untied model loads in multipos and sentence-transformers."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from transformers import AutoModel

import multipos.retrieval.encoding as encoding
from multipos.model.encoder import DualEncoder
from multipos.train import train
from tests.helpers import compose_cfg, preempt_in_stage_two, tiny_overrides


def _run(tiny_beir, tiny_bert, out, *extra):
    return train(compose_cfg("train", ["passages=frozen_index", *tiny_overrides(tiny_beir, tiny_bert, out, *extra)]))


def _weights(folder):
    return {k: v.clone() for k, v in AutoModel.from_pretrained(folder).state_dict().items()}


@pytest.mark.parametrize("candidates,loss", [("group", "lsepair"), ("corpus", "jointlh"), ("corpus", "lsepair_maxn")])
def test_only_the_query_encoder_trains_and_the_corpus_is_encoded_once(tiny_beir, tiny_bert, tmp_path, monkeypatch,
                                                                      candidates, loss):
    monkeypatch.setenv("MULTIPOS_CACHE", str(tmp_path / "cache"))  # cold embedding cache
    calls = []
    real = encoding.encode
    monkeypatch.setattr(encoding, "encode", lambda model, texts, kind="passage", *a, **kw: (
        calls.append((kind, len(texts))), real(model, texts, kind, *a, **kw))[1])
    out = tmp_path / "run"
    results = _run(tiny_beir, tiny_bert, out, f"loss={loss}", f"passages.candidates={candidates}",
                   "passages.chunk_size=5", "trainer.max_epochs=2", "module.optimizer.lr=1e-3")
    # one corpus encoding for the index, the zero-shot reference, two dev retrievals and the final evaluation
    passage_calls = [n for kind, n in calls if kind == "passage"]
    assert len(passage_calls) == 1 and passage_calls[0] > 1
    assert len([kind for kind, _ in calls if kind == "query"]) >= 4  # references, 2 dev retrievals, final evaluation
    assert all(0.0 <= v <= 1.0 for v in results["tiny_test"].values())
    model = out / "model"
    assert json.loads((model / "multipos_encoder.json").read_text())["shared"] is False
    start, passage, query = _weights(tiny_bert), _weights(model / "passage_encoder"), _weights(model / "query_encoder")
    assert all(torch.equal(passage[k], start[k]) for k in start)
    assert any(not torch.equal(query[k], start[k]) for k in start)
    info = json.loads((out / "run_info.json").read_text())
    assert info["status"] == "complete"
    for row in ("zero-shot", "bm25"):  # per-query floor rows, for the paired test of the main job's summary
        assert set(json.loads((out / "references" / row / "per_query.tiny_test.json").read_text())) >= {"ndcg@10"}


def test_the_saved_model_loads_with_its_settings_in_multipos_and_sentence_transformers(tiny_beir, tiny_bert, tmp_path):
    st = pytest.importorskip("sentence_transformers")
    out = tmp_path / "run"
    _run(tiny_beir, tiny_bert, out, "loss=jointlh", "passages.candidates=corpus", "module.optimizer.lr=1e-3")
    loaded = DualEncoder(str(out / "model"), pooling="mean", normalize=True)  # the saved cls / no-L2 settings win
    assert (loaded.pooling, loaded.normalize, loaded.shared) == ("cls", False, False)
    texts = ["heart cholesterol statin", "sleep"]
    kw = {"bf16": False, "progress": False}
    for side, kind in (("query_encoder", "query"), ("passage_encoder", "passage")):
        ours = encoding.encode(loaded, texts, kind, **kw)
        theirs = st.SentenceTransformer(str(out / "model" / side), device="cpu").encode(texts, convert_to_numpy=True)
        np.testing.assert_allclose(theirs, ours, atol=1e-5, rtol=0)


def test_evaluate_py_scores_the_saved_query_side_model(tiny_beir, tiny_bert, tmp_path):
    from multipos.evaluate import evaluate

    out = tmp_path / "run"
    trained = _run(tiny_beir, tiny_bert, out, "loss=summarglh", "passages.candidates=corpus",
                   "module.optimizer.lr=1e-3")
    cfg = compose_cfg("evaluate", [f"model.name_or_path={out / 'model'}", "eval=nfcorpus_test",
                                   f"paths.output_dir={tmp_path / 'eval'}",
                                   f"eval.test_sets.nfcorpus_test.path={tiny_beir}",
                                   "eval.test_sets.nfcorpus_test.name=tiny_test", "eval.bf16=false", "eval.k=20",
                                   "eval.passage_max_length=64"])
    assert evaluate(cfg)["tiny_test"] == pytest.approx(trained["tiny_test"], abs=1e-6)


def test_grad_cache_trains_the_same_query_encoder(tiny_beir, tiny_bert, tmp_path):
    plain, cached = tmp_path / "plain", tmp_path / "cached"
    common = ("loss=jointlh", "passages.candidates=corpus", "module.optimizer.lr=1e-3", "model.hidden_dropout=0.0",
              "model.attention_dropout=0.0")
    _run(tiny_beir, tiny_bert, plain, *common)
    _run(tiny_beir, tiny_bert, cached, *common, "module.grad_cache_chunk_size=1")
    a, b = _weights(plain / "model" / "query_encoder"), _weights(cached / "model" / "query_encoder")
    for k in a:
        torch.testing.assert_close(a[k], b[k], rtol=1e-4, atol=1e-5)


def test_curriculum_stages_train_query_side(tiny_beir, tiny_bert, tmp_path):
    out = tmp_path / "run"
    _run(tiny_beir, tiny_bert, out, "loss=lsepair", "data=nfcorpus", "regime=curriculum",
         "passages.candidates=corpus")
    info = json.loads((out / "run_info.json").read_text())
    assert [r["regime"] for r in info["stage_records"]] == ["homogeneous", "gold"]
    start, passage = _weights(tiny_bert), _weights(out / "model" / "passage_encoder")
    assert all(torch.equal(passage[k], start[k]) for k in start)


def test_corpus_candidates_without_the_frozen_index_fail_before_writing(tiny_beir, tiny_bert, tmp_path):
    out = tmp_path / "run"
    cfg = compose_cfg("train", ["passages.candidates=corpus", *tiny_overrides(tiny_beir, tiny_bert, out)])
    with pytest.raises(ValueError, match="passages.candidates=corpus needs the frozen passage index"):
        train(cfg)
    assert not out.exists()
    cfg = compose_cfg("train", ["passages=frozen_index", "passages.candidates=everything",
                                *tiny_overrides(tiny_beir, tiny_bert, out)])
    with pytest.raises(ValueError, match="passages.candidates='everything'"):
        train(cfg)
    assert not out.exists()


def test_two_tower_config_hash_is_unchanged_by_the_passages_group(tiny_beir, tiny_bert, tmp_path):
    """Finished two-tower sweeps are still skipped: the default passages node is left out of the hash."""
    from multipos.runs.spec import run_key

    base = tiny_overrides(tiny_beir, tiny_bert, tmp_path / "run")
    with_default = compose_cfg("train", base)
    without = compose_cfg("train", [*base, "~passages"])
    assert run_key(with_default) == run_key(without)
    assert run_key(compose_cfg("train", ["passages=frozen_index", *base])) != run_key(with_default)


def test_checkpoints_leave_out_the_frozen_passage_encoder_and_a_killed_run_resumes_to_the_same_metrics(
        tiny_beir, tiny_bert, tmp_path, monkeypatch):
    """Query-side checkpoints hold E_q (and its AdamW moments) but not the frozen E_d, which the resumed run loads
    from its starting checkpoint: a curriculum run killed in stage 2 resumes (stage 1's kept checkpoint loaded,
    stage 2 from its step checkpoint) to the metrics of the uninterrupted run, bit for bit (CPU, fp32)."""
    from multipos.atomic import load_checkpoint
    from multipos.training.module import FROZEN_PASSAGE_KEY, RetrieverModule

    monkeypatch.setenv("MULTIPOS_CACHE", str(tmp_path / "cache"))
    extra = ("loss=jointlh", "data=nfcorpus", "regime=curriculum", "stages.gold.epochs=2",
             "callbacks.model_checkpoint.every_n_train_steps=1", "module.optimizer.lr=1e-3")
    expected = _run(tiny_beir, tiny_bert, tmp_path / "whole", *extra)
    out = tmp_path / "killed"
    real_step = preempt_in_stage_two(monkeypatch)
    with pytest.raises(RuntimeError, match="preempted in stage 2"):
        _run(tiny_beir, tiny_bert, out, *extra)
    saved = sorted((out / "checkpoints").rglob("*.ckpt"))
    assert saved
    for path in saved:
        state = load_checkpoint(path)
        assert FROZEN_PASSAGE_KEY in state
        assert any(k.startswith("model.query_encoder.") for k in state["state_dict"])
        assert not any(k.startswith("model.passage_encoder.") for k in state["state_dict"])
    monkeypatch.setattr(RetrieverModule, "training_step", real_step)
    assert _run(tiny_beir, tiny_bert, out, *extra) == expected


def test_a_checkpoint_without_its_frozen_passage_encoder_refuses_another_passage_encoder(tiny_bert):
    from multipos.training.module import drop_frozen_passage_encoder, restore_frozen_passage_encoder

    model = DualEncoder(str(tiny_bert))
    model.freeze_passage_encoder()
    checkpoint = {"state_dict": {f"model.{k}": v.clone() for k, v in model.state_dict().items()}}
    whole = dict(checkpoint["state_dict"])
    drop_frozen_passage_encoder(model, checkpoint)
    assert len(checkpoint["state_dict"]) < len(whole)
    restore_frozen_passage_encoder(model, checkpoint, source="a.ckpt")
    assert checkpoint["state_dict"].keys() == whole.keys()
    assert all(torch.equal(checkpoint["state_dict"][k], whole[k]) for k in whole)
    drop_frozen_passage_encoder(model, checkpoint)
    other = DualEncoder(str(tiny_bert))
    other.freeze_passage_encoder()
    with torch.no_grad():
        next(other.passage_encoder.parameters()).add_(1.0)
    with pytest.raises(ValueError, match="a.ckpt.*another one"):
        restore_frozen_passage_encoder(other, checkpoint, source="a.ckpt")
    with pytest.raises(ValueError, match="not frozen"):
        restore_frozen_passage_encoder(DualEncoder(str(tiny_bert)), checkpoint, source="a.ckpt")


def test_a_prepared_run_continues_to_the_metrics_of_a_run_trained_at_once(tiny_beir, tiny_bert, tmp_path, monkeypatch):
    """prepare_only=true (make train's first step) stops before training with the caches filled and run_info
    'prepared'; the same command without it trains in the same folder, encodes no passage, and ends where a run
    that never stopped ends."""
    monkeypatch.setenv("MULTIPOS_CACHE", str(tmp_path / "cache"))
    extra = ("loss=jointlh", "passages.candidates=corpus", "trainer.max_epochs=2", "module.optimizer.lr=1e-3")
    out = tmp_path / "prepared"
    assert _run(tiny_beir, tiny_bert, out, *extra, "prepare_only=true") is None  # cold caches
    info = json.loads((out / "run_info.json").read_text())
    assert info["status"] == "prepared" and info["wall_s"] > 0
    assert (out / "references.json").is_file() and not (out / "metrics.json").exists()
    assert not list(out.rglob("*.ckpt"))
    calls = []
    real = encoding.encode
    monkeypatch.setattr(encoding, "encode", lambda model, texts, kind="passage", *a, **kw: (
        calls.append(kind), real(model, texts, kind, *a, **kw))[1])
    continued = _run(tiny_beir, tiny_bert, out, *extra)
    assert "passage" not in calls and "query" in calls
    assert json.loads((out / "run_info.json").read_text())["status"] == "complete"
    assert continued == _run(tiny_beir, tiny_bert, tmp_path / "at_once", *extra)


def test_bf16_mixed_query_side_training_clips_with_the_fused_optimizer(tiny_beir, tiny_bert, tmp_path, monkeypatch):
    """Lightning refuses gradient clipping with a fused optimizer under mixed precision (an fp16 concern: the fused
    step unscales by itself); under bf16-mixed, which scales nothing, the module clips as fp32 training does."""
    monkeypatch.setenv("MULTIPOS_CACHE", str(tmp_path / "cache"))
    clipped = []
    real = torch.nn.utils.clip_grad_norm_
    monkeypatch.setattr(torch.nn.utils, "clip_grad_norm_",
                        lambda params, max_norm, *a, **kw: clipped.append(max_norm) or real(params, max_norm, *a, **kw))
    out = tmp_path / "run"
    results = _run(tiny_beir, tiny_bert, out, "loss=jointlh", "passages.candidates=corpus", "trainer.max_epochs=1",
                   "trainer.precision=bf16-mixed", "+module.optimizer.fused=true", "trainer.gradient_clip_val=0.5")
    assert clipped and set(clipped) == {0.5}
    assert all(0.0 <= v <= 1.0 for v in results["tiny_test"].values())
