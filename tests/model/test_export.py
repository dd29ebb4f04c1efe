"""``DualEncoder.save_pretrained``: a Hugging Face + sentence-transformers folder, written atomically."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from multipos.model.encoder import DualEncoder
from multipos.retrieval.encoding import encode

st = pytest.importorskip("sentence_transformers")

TEXTS = ["heart cholesterol statin artery blood pressure cardiac " * 6, "sleep", "calcium bone osteoporosis fracture",
         "tumor breast cancer cells chemotherapy oncology diet fruit"]
KW = {"bf16": False, "progress": False, "batch_size": 3}


def _st_embed(folder, texts) -> np.ndarray:
    model = st.SentenceTransformer(str(folder), device="cpu")
    return model.encode(texts, batch_size=3, convert_to_numpy=True)


@pytest.mark.parametrize("pooling, normalize", [("cls", False), ("mean", True)])
def test_shared_folder_is_a_sentence_transformer(tiny_bert, tmp_path, pooling, normalize):
    from transformers import AutoModel, AutoTokenizer

    model = DualEncoder(str(tiny_bert), pooling=pooling, normalize=normalize, temperature=0.05, passage_max_length=12)
    path = tmp_path / "model"
    model.save_pretrained(path)
    modules = json.loads((path / "modules.json").read_text())
    assert [m["path"] for m in modules] == ["", "1_Pooling", *(["2_Normalize"] if normalize else [])]
    assert json.loads((path / "sentence_bert_config.json").read_text())["max_seq_length"] == 12
    pool_cfg = json.loads((path / "1_Pooling" / "config.json").read_text())
    assert pool_cfg["pooling_mode_cls_token"] is (pooling == "cls")
    assert pool_cfg["pooling_mode_mean_tokens"] is (pooling == "mean")
    st_cfg = json.loads((path / "config_sentence_transformers.json").read_text())
    assert st_cfg["similarity_fn_name"] == ("cosine" if normalize else "dot")

    loaded = st.SentenceTransformer(str(path), device="cpu")
    assert loaded.max_seq_length == 12 and loaded.similarity_fn_name == st_cfg["similarity_fn_name"]
    ours = encode(model, TEXTS, "passage", **KW)
    np.testing.assert_allclose(_st_embed(path, TEXTS), ours, atol=1e-5, rtol=0)
    # τ is not in the embeddings: multipos scores = sentence-transformers similarity / τ, same ranking
    q = encode(model, ["heart cholesterol"], "query", **KW)
    sim = loaded.similarity(torch.from_numpy(q), torch.from_numpy(ours)).numpy()
    np.testing.assert_allclose(sim / 0.05, model.score(torch.from_numpy(q), torch.from_numpy(ours)).numpy(),
                               rtol=1e-4, atol=1e-4)

    # the folder is a plain HF checkpoint too, and a multipos one
    hf = AutoModel.from_pretrained(str(path))
    tok = AutoTokenizer.from_pretrained(str(path))
    assert hf.config.hidden_size == model.hidden_size and tok.vocab_size == model.tokenizer.vocab_size
    again = DualEncoder(str(path), passage_max_length=12)  # lengths are constructor arguments, not saved
    assert (again.pooling, again.normalize, again.temperature) == (pooling, normalize, 0.05)
    np.testing.assert_allclose(encode(again, TEXTS, **KW), ours, atol=1e-6)


def test_untied_sides_are_sentence_transformers(tiny_bert, tmp_path):
    model = DualEncoder(str(tiny_bert), pooling="mean", normalize=True, shared=False, query_max_length=6,
                        passage_max_length=12)
    with torch.no_grad():
        model.passage_encoder.embeddings.word_embeddings.weight.mul_(-1.0)
    path = tmp_path / "model"
    model.save_pretrained(path)
    assert not (path / "config.json").exists() and not (path / "modules.json").exists()  # the parent is not a model
    assert json.loads((path / "query_encoder" / "sentence_bert_config.json").read_text())["max_seq_length"] == 6
    assert json.loads((path / "passage_encoder" / "sentence_bert_config.json").read_text())["max_seq_length"] == 12
    q_st = _st_embed(path / "query_encoder", TEXTS)
    p_st = _st_embed(path / "passage_encoder", TEXTS)
    np.testing.assert_allclose(q_st, encode(model, TEXTS, "query", **KW), atol=1e-5, rtol=0)
    np.testing.assert_allclose(p_st, encode(model, TEXTS, "passage", **KW), atol=1e-5, rtol=0)
    assert not np.allclose(q_st, p_st, atol=1e-3)
    again = DualEncoder(str(path), passage_max_length=12)
    assert again.shared is False
    np.testing.assert_allclose(encode(again, TEXTS, "passage", **KW), p_st, atol=1e-5, rtol=0)


@pytest.mark.assets
def test_minilm_export_matches_sentence_transformers(assets, tmp_path):
    src = assets / "models" / "all-MiniLM-L6-v2"
    model = DualEncoder(str(src), pooling="mean", normalize=True, temperature=0.05)
    model.save_pretrained(tmp_path / "model")
    ours = encode(model, TEXTS, "passage", **KW)
    np.testing.assert_allclose(_st_embed(tmp_path / "model", TEXTS), ours, atol=1e-5, rtol=0)
    short = TEXTS[1:]  # under 128 tokens: the original folder (max_seq_length 256) gives the same embeddings
    np.testing.assert_allclose(_st_embed(src, short), ours[1:], atol=1e-5, rtol=0)


def _weights(model: DualEncoder) -> torch.Tensor:
    return model.passage_encoder.embeddings.word_embeddings.weight.detach().clone()


def test_save_replaces_a_folder_atomically(tiny_bert, tmp_path, monkeypatch):
    path = tmp_path / "model"
    first = DualEncoder(str(tiny_bert), pooling="cls")
    first.save_pretrained(path)
    (path / "stale-file.txt").write_text("from an older save")
    second = DualEncoder(str(tiny_bert), pooling="mean", normalize=True)
    with torch.no_grad():
        second.passage_encoder.embeddings.word_embeddings.weight.add_(1.0)

    def crash(*args, **kwargs):
        raise KeyboardInterrupt("killed while writing the tokenizer")

    monkeypatch.setattr(second.tokenizer, "save_pretrained", crash)  # after the weights were written
    with pytest.raises(KeyboardInterrupt):
        second.save_pretrained(path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model"]  # no temp folder left behind
    kept = DualEncoder(str(path))  # still the complete first model, not a mix
    assert kept.pooling == "cls" and torch.equal(_weights(kept), _weights(first))

    monkeypatch.undo()
    second.save_pretrained(path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model"]
    assert not (path / "stale-file.txt").exists()  # the old folder was replaced, not merged into
    now = DualEncoder(str(path))
    assert now.pooling == "mean" and torch.equal(_weights(now), _weights(second))


def test_save_refuses_to_replace_a_folder_that_is_not_a_model(tiny_bert, tmp_path):
    (tmp_path / "notes.txt").write_text("not a model")
    with pytest.raises(FileExistsError, match="not a saved model"):
        DualEncoder(str(tiny_bert)).save_pretrained(tmp_path)
    assert (tmp_path / "notes.txt").read_text() == "not a model"


def test_query_side_runs_store_the_frozen_passage_encoder_once(tiny_bert, tmp_path):
    import os

    from multipos.assets import cache_dir

    saved = []
    for run in ("a", "b"):
        model = DualEncoder(str(tiny_bert), pooling="mean")
        model.freeze_passage_encoder()
        with torch.no_grad():
            next(model.query_encoder.parameters()).add_(0.1 if run == "a" else 0.2)  # trained query sides differ
        model.save_pretrained(tmp_path / run / "model")
        saved.append(tmp_path / run / "model")
    a, b = (m / "passage_encoder" / "model.safetensors" for m in saved)
    assert os.path.samefile(a, b) and os.stat(a).st_nlink >= 3  # both runs and the store: one copy on the disk
    assert any(os.path.samefile(a, f) for f in (cache_dir() / "frozen_passage_encoders").iterdir())
    assert not os.path.samefile(*(m / "query_encoder" / "model.safetensors" for m in saved))
    reloaded = DualEncoder(str(saved[1]))
    start = DualEncoder(str(tiny_bert))
    for (name, p), q in zip(reloaded.passage_encoder.state_dict().items(), start.query_encoder.state_dict().values()):
        torch.testing.assert_close(p, q, msg=name)


def test_share_identical_links_equal_files_and_leaves_others(tmp_path):
    import os

    from multipos import atomic

    store = tmp_path / "store"
    for name, data in (("x.bin", b"same"), ("y.bin", b"same"), ("z.bin", b"other")):
        atomic.write_bytes(tmp_path / name, data)
        assert atomic.share_identical(tmp_path / name, store)
    assert os.path.samefile(tmp_path / "x.bin", tmp_path / "y.bin")
    assert not os.path.samefile(tmp_path / "x.bin", tmp_path / "z.bin")
    assert sorted(p.read_bytes() for p in store.iterdir()) == [b"other", b"same"]
    assert (tmp_path / "y.bin").read_bytes() == b"same"
    assert not atomic.share_identical(tmp_path / "x.bin", tmp_path / "z.bin" / "not-a-folder")  # no store: left as is
    assert (tmp_path / "x.bin").read_bytes() == b"same"
