"""bench/bench_encoding_paths.py counts the encoder's work as the formula in its docstring says."""

from __future__ import annotations

import pytest

from tests.helpers import load_bench


def _bench():
    return load_bench("bench/bench_encoding_paths.py", "bench_encoding_paths")


def test_the_flop_count_pads_each_length_sorted_batch_to_its_longest(tiny_bert):
    from multipos.model.encoder import DualEncoder

    model = DualEncoder(str(tiny_bert), pooling="mean", normalize=True)
    cfg = model.passage_encoder.config
    h, f, layers = cfg.hidden_size, cfg.intermediate_size, cfg.num_hidden_layers
    texts = ["a"] * 64 + ["a b c d e f g h i j"] * 2  # the two long texts share a batch with 62 short ones
    lengths = sorted(model.tokenize(texts, kind="passage", max_length=256)["attention_mask"].sum(1).tolist())[::-1]
    long_n, short_n = lengths[0], lengths[-1]
    assert long_n > short_n

    def per_row(n):
        return n * layers * (8 * h * h + 4 * h * f + 4 * n * h)

    expected = (64 * per_row(long_n) + 2 * per_row(short_n)) / 1e9
    assert _bench().encoder_flops(model, texts) == pytest.approx(expected)


def test_an_unknown_path_is_refused_by_name(capsys):
    with pytest.raises(SystemExit):
        _bench().main(["--paths", "fp32,int4"])
    assert "int4" in capsys.readouterr().err


def test_each_set_is_counted_once_and_only_fp32_rows_carry_the_rate(monkeypatch):
    import multipos.hardware
    import multipos.model.encoder

    bench = _bench()
    counted, records = [], []
    monkeypatch.setattr(multipos.model.encoder, "DualEncoder", lambda *a, **k: type("M", (), {"eval": lambda s: s})())
    monkeypatch.setattr(multipos.hardware, "cpu_bf16", lambda: True)
    monkeypatch.setattr(bench, "matmul_rate", lambda: 100.0)
    monkeypatch.setattr(bench, "encoder_flops", lambda model, texts: counted.append(len(texts)) or 50.0)
    per_query = {"fp32": {"q1": 0.5, "q2": 0.7}, "bf16": {"q1": 0.5, "q2": 0.6}}
    monkeypatch.setattr(bench, "score", lambda model, name, bf16=False: (
        2.0 if bf16 else 5.0, 0.55 if bf16 else 0.6, per_query["bf16" if bf16 else "fp32"], ["t"] * 10))
    monkeypatch.setattr(bench, "append_result", lambda path, record: records.append(record))
    bench.main(["--trained", "m", "--sets", "trec_dl19,trec_dl20", "--paths", "fp32,bf16"])
    assert counted == [10, 10]  # one count per set, shared by both models
    rows = records[0]["rows"]
    fp32 = [r for r in rows if r["path"] == "fp32"]
    assert len(fp32) == 4 and all(r["gflop_per_s"] == 10.0 and r["of_fp32_matmul_rate"] == 0.1 for r in fp32)
    assert all("gflop_per_s" not in r and "p_vs_fp32" in r for r in rows if r["path"] == "bf16")
    assert records[0]["within_tolerance"] is None and records[0]["per_path"]["bf16"]["max_ndcg_gap"] == 0.05


def test_the_onnxruntime_copy_encodes_as_the_model_does(tiny_bert, tmp_path):
    pytest.importorskip("onnxruntime")
    pytest.importorskip("onnx")
    import numpy as np

    from multipos.model.encoder import DualEncoder
    from multipos.retrieval.encoding import encode

    model = DualEncoder(str(tiny_bert), pooling="mean", normalize=True).eval()
    texts = ["a b c", "a longer passage about the thing", "x", "y z y z y z y z y z y z"] * 5
    copy = _bench().onnxruntime_copy(model, tmp_path)
    assert copy.passage_encoder is copy.query_encoder  # a shared encoder is exported once
    assert sorted(p.name for p in tmp_path.iterdir()) == ["query_encoder.onnx"]
    for kind in ("passage", "query"):
        ours = encode(copy, texts, kind=kind, batch_size=8, bf16=False, progress=False, device=None)
        ref = encode(model, texts, kind=kind, batch_size=8, bf16=False, progress=False, device=None)
        np.testing.assert_allclose(ours, ref, atol=1e-5)
    assert not hasattr(model.query_encoder, "session")  # the original keeps its torch encoder
