"""Encoding (length-sorted batches, device and precision) and the (memory-mapped) embedding cache, on the tiny
random BERT from ``conftest.py``."""

from __future__ import annotations

import contextlib
import hashlib
import logging
import struct

import numpy as np
import pytest
import torch

from multipos.retrieval import encoding
from multipos.retrieval.encoding import cached_encode, encode


def _ids(prefix: str, n: int) -> list[str]:
    return [f"{prefix}{i}" for i in range(n)]


# ------------------------------------------------------------------------------------- embedding cache


@pytest.fixture(scope="module")
def corpus():
    rng = np.random.default_rng(0)
    words = ["cholesterol", "statin", "artery", "heart", "tumor", "breast", "cancer", "sleep", "melatonin", "calcium",
             "bone"]
    texts = [" ".join(rng.choice(words, size=rng.integers(2, 30))) for _ in range(40)]
    return _ids("d", 40), texts


@pytest.fixture
def model(tiny_bert):
    from multipos.model.encoder import DualEncoder

    return DualEncoder(str(tiny_bert), pooling="mean", normalize=True, passage_max_length=64)


KW = {"batch_size": 8, "bf16": False, "progress": False}


def _cache_name(model, ids, texts, max_length=None, bf16=False) -> str:
    """The cache file name: model fingerprint, sha1 over ids *and texts*, max length, precision."""
    h = hashlib.sha1()
    for i, t in zip(ids, texts):
        ib, tb = i.encode(), t.encode()
        h.update(struct.pack("<QQ", len(ib), len(tb)) + ib + tb)
    precision = "bf16" if bf16 else "fp32"
    return f"{model.fingerprint()}-{h.hexdigest()[:16]}-{max_length or model.passage_max_length}-{precision}.npy"


def _crash_after(model, monkeypatch, calls: int):
    real = model.encode_passages
    count = [0]

    def flaky(tokens):
        count[0] += 1
        if count[0] > calls:
            raise KeyboardInterrupt("simulated crash")
        return real(tokens)

    monkeypatch.setattr(model, "encode_passages", flaky)


def test_encode_into_preallocated_output(model, corpus):
    _, texts = corpus
    ref = encode(model, texts, **KW)
    out = np.full((len(texts), model.hidden_size), np.nan, dtype=np.float32)
    assert encode(model, texts, out=out, **KW) is out
    np.testing.assert_array_equal(out, ref)
    with pytest.raises(ValueError, match="shape"):
        encode(model, texts, out=np.zeros((3, model.hidden_size), dtype=np.float32), **KW)


@pytest.mark.parametrize("threshold", [10, None])  # memmap path (40 > 10) and in-memory path
def test_cache_miss_then_hit(model, corpus, tmp_path, monkeypatch, threshold):
    ids, texts = corpus
    ref = encode(model, texts, **KW)
    emb = cached_encode(model, ids, texts, tmp_path, "t", memmap_threshold=threshold, **KW)
    np.testing.assert_array_equal(np.asarray(emb), ref)
    files = sorted(p.name for p in (tmp_path / "embeddings").iterdir())
    assert files == [_cache_name(model, ids, texts)]  # no temp files left
    np.testing.assert_array_equal(np.load(tmp_path / "embeddings" / files[0]), ref)
    _crash_after(model, monkeypatch, 0)  # a hit must not encode
    hit = cached_encode(model, ids, texts, tmp_path, "t", memmap_threshold=threshold, **KW)
    np.testing.assert_array_equal(np.asarray(hit), ref)
    assert isinstance(hit, np.memmap) == (threshold is not None)
    if threshold is not None:
        assert not hit.flags.writeable


@pytest.mark.parametrize("threshold", [10, None])
def test_crash_during_encoding_leaves_no_cache_file(model, corpus, tmp_path, monkeypatch, threshold):
    ids, texts = corpus
    _crash_after(model, monkeypatch, 2)  # 2 of 5 batches written
    with pytest.raises(KeyboardInterrupt):
        cached_encode(model, ids, texts, tmp_path, "t", memmap_threshold=threshold, **KW)
    assert list((tmp_path / "embeddings").iterdir()) == []
    monkeypatch.undo()
    emb = cached_encode(model, ids, texts, tmp_path, "t", memmap_threshold=threshold, **KW)
    np.testing.assert_array_equal(np.asarray(emb), encode(model, texts, **KW))


def test_leftover_or_wrong_files_are_not_cache_hits(model, corpus, tmp_path, caplog):
    ids, texts = corpus
    folder = tmp_path / "embeddings"
    folder.mkdir()
    name = _cache_name(model, ids, texts)
    key = name.removesuffix(".npy")
    np.save(folder / f"{key}.4242-deadbeef.tmp.npy", np.zeros((40, model.hidden_size), np.float32))  # killed run
    np.save(folder / name, np.zeros((39, model.hidden_size), np.float32))  # wrong corpus size
    with caplog.at_level(logging.WARNING, logger="multipos.retrieval.encoding"):
        emb = cached_encode(model, ids, texts, tmp_path, "t", memmap_threshold=10, **KW)
    np.testing.assert_array_equal(np.asarray(emb), encode(model, texts, **KW))
    assert "leftover partial" in caplog.text and "expected" in caplog.text
    assert np.load(folder / name).shape == (40, model.hidden_size)


def test_cache_key_covers_pooling_normalisation_max_length_and_precision(model, corpus, tiny_bert):
    from multipos.model.encoder import DualEncoder

    ids, texts = corpus
    other = DualEncoder(str(tiny_bert), pooling="mean", normalize=False, passage_max_length=64)
    assert other.fingerprint() != model.fingerprint()
    assert _cache_name(model, ids, texts) != _cache_name(model, ids, texts, max_length=32)
    assert encoding._cache_key(model, ids, texts, 32, bf16=False) + ".npy" == _cache_name(model, ids, texts, 32)
    assert (encoding._cache_key(model, ids, texts, 32, bf16=True) + ".npy"
            == _cache_name(model, ids, texts, 32, bf16=True))
    assert len({encoding._cache_key(model, ids, texts, m, b) for m in (None, 32) for b in (True, False)}) == 4
    # ids and texts are length-prefixed: moving a character across the id/text boundary changes the key
    assert encoding._cache_key(model, ["a"], ["bc"], None) != encoding._cache_key(model, ["ab"], ["c"], None)


def test_same_length_edit_is_re_encoded(model, corpus, tmp_path, monkeypatch):
    ids, texts = corpus
    row = next(i for i, t in enumerate(texts) if "heart" in t)
    edited = list(texts)
    edited[row] = texts[row].replace("heart", "tumor")  # same length, other words
    assert len(edited[row]) == len(texts[row]) and edited[row] != texts[row]
    old = cached_encode(model, ids, texts, tmp_path, "t", **KW)
    new = cached_encode(model, ids, edited, tmp_path, "t", **KW)
    np.testing.assert_array_equal(new, encode(model, edited, **KW))
    assert not np.allclose(new[row], old[row])
    assert len(list((tmp_path / "embeddings").glob("*.npy"))) == 2
    _crash_after(model, monkeypatch, 0)  # both are hits now
    np.testing.assert_array_equal(cached_encode(model, ids, edited, tmp_path, "t", **KW), new)
    np.testing.assert_array_equal(cached_encode(model, ids, texts, tmp_path, "t", **KW), old)


def test_bf16_and_fp32_embeddings_are_cached_apart(model, corpus, tmp_path):
    ids, texts = corpus
    fp32 = cached_encode(model, ids, texts, tmp_path, "t", **KW)
    bf16 = cached_encode(model, ids, texts, tmp_path, "t", **{**KW, "bf16": True})
    names = sorted(p.name for p in (tmp_path / "embeddings").iterdir())
    assert names == sorted([_cache_name(model, ids, texts), _cache_name(model, ids, texts, bf16=True)])
    np.testing.assert_array_equal(bf16, encode(model, texts, **{**KW, "bf16": True}))
    assert not np.array_equal(fp32, bf16)


@pytest.mark.parametrize("threshold", [10, None])
@pytest.mark.parametrize("keep", [0.0, 0.5])  # empty file, half a file
def test_truncated_cache_file_is_rebuilt(model, corpus, tmp_path, caplog, threshold, keep):
    ids, texts = corpus
    ref = np.asarray(cached_encode(model, ids, texts, tmp_path, "t", memmap_threshold=threshold, **KW)).copy()
    [path] = (tmp_path / "embeddings").iterdir()
    data = path.read_bytes()
    path.write_bytes(data[: int(len(data) * keep)])  # e.g. copied or written by a tool that was interrupted
    with caplog.at_level(logging.WARNING, logger="multipos.retrieval.encoding"):
        emb = cached_encode(model, ids, texts, tmp_path, "t", memmap_threshold=threshold, **KW)
    assert "unreadable" in caplog.text
    np.testing.assert_array_equal(np.asarray(emb), ref)
    assert path.read_bytes() == data  # rebuilt in place
    assert sorted(p.name for p in path.parent.iterdir()) == [path.name]


# --- where encoding runs: the trainer's accelerator, bf16 only where native --------------------------------

def test_encoding_device_none_keeps_the_model_where_it_is(model):
    assert encoding.encoding_device(model, None).type == "cpu"


def test_encoding_device_auto_stays_on_cpu_without_cuda(model, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert encoding.encoding_device(model, "auto").type == "cpu"


def test_encoding_device_auto_moves_a_cpu_model_to_cuda(model, monkeypatch):
    """After ``fit`` Lightning hands the model back on the CPU: final evaluation, the zero-shot reference and the
    teacher must encode on the GPU when there is one (issue: the GPU path)."""
    moved = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(type(model), "to", lambda self, device: moved.append(torch.device(device)) or self)
    encoding.encoding_device(model, "auto")
    assert moved == [torch.device("cuda")]
    moved.clear()
    encoding.encoding_device(model, None)  # retrieval validation during fit: never moves the model
    assert moved == []


@pytest.mark.parametrize("precision,expected", [("bf16-mixed", True), ("32-true", False)])
def test_bf16_none_means_native_only(model, corpus, monkeypatch, precision, expected):
    from multipos import hardware

    monkeypatch.setattr(hardware, "auto_precision", lambda: precision)
    seen = []
    monkeypatch.setattr(encoding, "autocast_context",
                        lambda device, bf16: seen.append(bf16) or contextlib.nullcontext())
    ids, texts = corpus
    encode(model, texts[:3], bf16=None, progress=False)
    assert seen and set(seen) == {expected}


def test_the_model_moves_to_the_encoding_device_outside_inference_mode(tiny_bert, monkeypatch):
    """On a GPU machine ``encode(device="auto")`` moves a CPU model to CUDA. Parameters re-created inside inference
    mode become inference tensors, and training the model afterwards fails ("Inference tensors cannot be saved for
    backward": query-side training on an H100, 2026-11-25). Here the move is a real re-creation of the parameters
    (to float64) standing in for the CUDA copy."""
    from torch import nn

    from multipos.model.encoder import DualEncoder

    model = DualEncoder(str(tiny_bert), pooling="mean")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(model, "to", lambda *a, **k: nn.Module.double(model))
    encode(model, ["statin heart", "bone"], bf16=False, progress=False)
    assert next(model.parameters()).dtype == torch.float64  # the stand-in move happened
    assert not any(p.is_inference() for p in model.parameters())
    model.encode_queries(dict(model.tokenize(["statin"], "query"))).sum().backward()  # trainable afterwards


# ------------------------------------------------------------------------------------- tokenising in windows


@pytest.mark.parametrize("side", ["right", "left"])
def test_trim_padding_gives_what_the_tokenizer_gives_the_batch_alone(model, corpus, side):
    _, texts = corpus
    model.tokenizer.padding_side = side
    try:
        window = model.tokenize(texts, kind="passage")
        for start in (0, 7, 33):
            rows = slice(start, start + 5)
            trimmed = encoding.trim_padding({k: v[rows] for k, v in window.items()}, side)
            alone = model.tokenize(texts[rows], kind="passage")
            assert trimmed.keys() == alone.keys()
            assert all(torch.equal(trimmed[k], alone[k]) for k in alone), start
    finally:
        model.tokenizer.padding_side = "right"
    with pytest.raises(ValueError, match="padding side"):
        encoding.trim_padding(window, "middle")


def test_encode_in_tokenizer_windows_equals_one_tokenizer_call_per_batch(model, corpus, monkeypatch):
    """encode() tokenises TOKENIZE_BATCHES batches per call and trims each batch's padding: the embeddings are the
    ones a tokenizer call per batch gives (bitwise, fp32 on the CPU), in input order, whatever the window."""
    _, texts = corpus
    order = np.argsort([-len(t) for t in texts], kind="stable")
    expected = np.zeros((len(texts), model.hidden_size), np.float32)
    model.eval()
    with torch.inference_mode():
        for start in range(0, len(texts), 4):
            idx = order[start:start + 4]
            expected[idx] = model.encode_passages(model.tokenize([texts[i] for i in idx], kind="passage")).numpy()
    for batches in (1, 3, 16):
        monkeypatch.setattr(encoding, "TOKENIZE_BATCHES", batches)
        got = encode(model, texts, "passage", batch_size=4, bf16=False, progress=False, device=None)
        np.testing.assert_array_equal(got, expected)


def test_batches_are_sorted_by_tokens_within_each_window(model, corpus, monkeypatch):
    """Characters predict token counts poorly; within a tokenised window the texts are re-sorted by tokens, so the
    rows reach the encoder longest first and each batch pads only to its own longest."""
    _, texts = corpus
    texts = [t if i % 3 else t.replace(" ", "") for i, t in enumerate(texts)]  # long in characters, few tokens
    lengths, real = [], model.encode_passages

    def spy(tokens):
        lengths.append(tokens["attention_mask"].sum(1).tolist())
        assert tokens["attention_mask"][:, -1].any()  # no all-padding column
        return real(tokens)

    monkeypatch.setattr(model, "encode_passages", spy)
    monkeypatch.setattr(encoding, "TOKENIZE_BATCHES", 100)  # one window
    encode(model, texts, "passage", batch_size=4, bf16=False, progress=False, device=None)
    rows = [n for batch in lengths for n in batch]
    assert len(rows) == len(texts) and rows == sorted(rows, reverse=True)
    by_chars = model.tokenize([texts[i] for i in np.argsort([-len(t) for t in texts], kind="stable")], kind="passage")
    assert by_chars["attention_mask"].sum(1).tolist() != rows  # the character order alone is not token order


@pytest.mark.parametrize("batches", [1, 3, 16])
def test_tokenising_the_next_window_in_a_thread_gives_the_same_embeddings(model, corpus, monkeypatch, caplog, batches):
    """``overlap=True`` (the default on CUDA) tokenises window k + 1 in a background thread while the model encodes
    window k: the embeddings are bitwise those of tokenising in turn (fp32 on the CPU), and every window after the
    first is tokenised in that thread; the log line says how long tokenising took and how long encoding waited."""
    import threading

    _, texts = corpus
    monkeypatch.setattr(encoding, "TOKENIZE_BATCHES", batches)
    in_turn = encode(model, texts, "passage", batch_size=4, bf16=False, progress=False, device=None, overlap=False)
    threads, real = [], model.tokenize

    def spy(*args, **kwargs):
        threads.append(threading.current_thread().name)
        return real(*args, **kwargs)

    monkeypatch.setattr(model, "tokenize", spy)
    with caplog.at_level(logging.INFO, logger="multipos.retrieval.encoding"):
        overlapped = encode(model, texts, "passage", batch_size=4, bf16=False, progress=False, device=None,
                            overlap=True)
    np.testing.assert_array_equal(overlapped, in_turn)
    windows = -(-len(texts) // (4 * batches))
    assert len(threads) == windows
    if windows > 1:
        assert all(name.startswith("multipos-tokenize") for name in threads)
        assert "in a background thread, waited for" in caplog.text
    else:  # one window: nothing to overlap, tokenised in turn
        assert "in turn with the model" in caplog.text


def test_overlap_defaults_to_cuda_only(model, corpus, caplog):
    _, texts = corpus
    with caplog.at_level(logging.INFO, logger="multipos.retrieval.encoding"):
        encode(model, texts, "passage", batch_size=4, bf16=False, progress=False, device=None)
    assert "in turn with the model" in caplog.text  # a CPU model: its cores already run the model
