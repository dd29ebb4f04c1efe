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
