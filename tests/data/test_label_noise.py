"""multipos.data.label_noise: a known share of positives replaced by false positives, recorded per query."""

from __future__ import annotations

import json

import pytest

from multipos.data.groups import TrainQuery
from multipos.data.label_noise import LabelNoise


def _queries():
    return [TrainQuery(f"q{i}", "text", gold=[f"g{i}"], silver=[f"s{i}a", f"s{i}b", f"s{i}c"],
                       negatives=[f"n{i}{k}" for k in range(10)], judged={f"j{i}"}, weights={f"g{i}": 1.0})
            for i in range(20)]


@pytest.mark.parametrize("kind", ["bm25", "random"])
def test_a_share_of_each_querys_positives_is_replaced_in_place_and_recorded(kind):
    queries, corpus = _queries(), [f"c{k}" for k in range(500)] + ["g0", "j0"]
    noise = LabelNoise(rate=0.5, kind=kind, seed=3)
    counts = noise.apply(queries, corpus)
    assert counts == {"queries": 20, "replaced": 40, "positives": 80, "short": 0}
    for i, q in enumerate(queries):
        rec = noise.record[q.query_id]
        original = [f"g{i}", f"s{i}a", f"s{i}b", f"s{i}c"]
        now = [*q.gold, *q.silver]
        assert len(rec["replaced"]) == 2 and set(rec["replaced"]) <= set(original)
        swap = dict(zip(rec["replaced"], rec["false_positives"]))
        assert [swap.get(o, o) for o in original] == now
        pool = {f"n{i}{k}" for k in range(10)} if kind == "bm25" else set(corpus) - {f"j{i}", *original}
        assert set(rec["false_positives"]) <= pool
        assert not set(rec["false_positives"]) & set(q.negatives)  # a false positive is no longer a negative
        assert set(rec["replaced"]) <= q.judged and set(rec["false_positives"]) <= q.judged  # neither is a negative
    again = _queries()
    LabelNoise(rate=0.5, kind=kind, seed=3).apply(again, corpus)
    assert [q.silver for q in again] == [q.silver for q in queries]  # seeded by (seed, query id)


def test_rate_zero_is_no_noise_and_bad_settings_name_the_field():
    assert LabelNoise.from_config(None) is None and LabelNoise.from_config({"rate": 0}) is None
    with pytest.raises(ValueError, match=r"label_noise\.rate"):
        LabelNoise(rate=1.5)
    with pytest.raises(ValueError, match=r"label_noise\.kind"):
        LabelNoise(rate=0.1, kind="llm")


def test_a_noisy_run_records_its_replacements_in_the_run_folder(tiny_beir, tiny_bert, tmp_path, monkeypatch):
    from multipos.train import train
    from tests.helpers import compose_cfg, tiny_overrides

    monkeypatch.setenv("MULTIPOS_CACHE", str(tmp_path / "cache"))
    out = tmp_path / "run"
    train(compose_cfg("train", tiny_overrides(tiny_beir, tiny_bert, out, "regime=all",
                                              "data.source.qrels_file=qrels-graded/train.s-3.qrel",
                                              "++data.source.label_noise={rate: 0.5, kind: random, seed: 0}")))
    record = json.loads((out / "label_noise.json").read_text())
    assert record["rate"] == 0.5 and record["kind"] == "random" and len(record["queries"]) == 5
    assert all(len(r["replaced"]) == 3 for r in record["queries"].values())  # 6 positives each
    info = json.loads((out / "run_info.json").read_text())
    assert info["stage_records"][0]["label_noise"]["replaced"] == 15


def test_no_false_positive_is_judged_relevant_in_any_split(tmp_path):
    from multipos.data.label_noise import judged_in_every_split

    (tmp_path / "qrels").mkdir()
    (tmp_path / "qrels-graded").mkdir()
    (tmp_path / "qrels" / "test.tsv").write_text("query-id\tcorpus-id\tscore\nt0\tc1\t1\nt0\tc2\t0\n")
    (tmp_path / "qrels-graded" / "train.s-4.qrel").write_text("q0 0 c3 1\n")
    texts = {"q0": "Same  Text", "t0": "same text", "q1": "other"}
    judged = judged_in_every_split(tmp_path, texts)
    assert judged["q0"] == {"c1", "c3"} and judged["t0"] == {"c1", "c3"} and judged["q1"] == set()
    corpus = [f"c{k}" for k in range(1, 5)]
    for exclude, allowed in (("every_split", {"c2", "c4"}), ("query", {"c1", "c2", "c3", "c4"})):
        seen = set()
        for seed in range(40):
            q = [TrainQuery("q0", "same text", gold=["g"], silver=[], negatives=["c1", "c2", "c3", "c4"], judged={"g"})]
            noise = LabelNoise(rate=1.0, kind="bm25", seed=seed, exclude=exclude)
            noise.apply(q, corpus, judged)
            seen |= set(noise.record["q0"]["false_positives"])
        assert seen == allowed, exclude
    assert LabelNoise(rate=0.1).exclude == "query"  # what a setting without the field computed
    with pytest.raises(ValueError, match=r"label_noise\.exclude"):
        LabelNoise(rate=0.1, exclude="nothing")


def test_a_rate_zero_run_has_the_spec_of_the_labels_as_published():
    from multipos.runs.spec import run_spec
    from tests.helpers import compose_cfg

    base = ["experiment=label_noise", "loss=singlelh", "seed=42"]
    clean = run_spec(compose_cfg("train", ["experiment=table2_homogeneous", "scale=cpu_query_side",
                                           "loss=singlelh", "seed=42"]))
    zero = [run_spec(compose_cfg("train", [*base, "data.source.label_noise.rate=0",
                                           f"data.source.label_noise.kind={k}"])) for k in ("bm25", "random")]
    noisy = run_spec(compose_cfg("train", [*base, "data.source.label_noise.rate=0.1"]))
    assert zero[0].key() == zero[1].key() == clean.key() != noisy.key()
