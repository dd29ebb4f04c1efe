"""Positive-aware hard-negative filtering (multipos.mining.negative_filter): the rules on hand-made scores, and the
filter in the BM25 / dense miners and the ANCE-style refresh, its counts in run_info.json."""

from __future__ import annotations

import json

import numpy as np
import pytest

from multipos.mining.negative_filter import NegativeFilter, filter_negatives
from tests.helpers import compose_cfg, tiny_overrides

# one query along the first axis; passage scores are their first coordinate
P_EMB = np.array([[0.9, 0], [0.6, 0], [0.58, 0], [0.56, 0], [0.3, 0], [0.1, 0]], dtype=np.float32)
ROW = {p: i for i, p in enumerate(["p_first", "p_low", "n1", "n2", "n3", "n4"])}
Q = np.array([[1.0, 0.0]], dtype=np.float32)


def _run(rule, positives=("p_first", "p_low")):
    return filter_negatives({"q": ["n1", "n2", "n3", "n4"]}, {"q": list(positives)}, Q, {"q": 0}, P_EMB, ROW, rule)


@pytest.mark.parametrize("rule,kept", [
    (NegativeFilter(share=0.95), ["n2", "n3", "n4"]),                      # ceiling 0.95 x 0.6 = 0.57 (lowest positive)
    (NegativeFilter(share=0.95, reference="first"), ["n1", "n2", "n3", "n4"]),  # ceiling 0.855
    (NegativeFilter(margin=0.1), ["n3", "n4"]),                            # ceiling 0.6 - 0.1 = 0.5
    (NegativeFilter(share=0.95, margin=0.01), ["n2", "n3", "n4"]),          # the stricter: min(0.57, 0.59)
    (NegativeFilter(share=0.5), ["n3", "n4"]),                             # ceiling 0.3: a tie is kept
])
def test_rules_on_known_scores(rule, kept):
    pools, counts = _run(rule)
    assert pools == {"q": kept}
    assert counts == {"checked": 4, "dropped": 4 - len(kept), "queries_with_drops": int(len(kept) < 4)}


def test_a_query_without_positives_keeps_its_pool():
    pools, counts = _run(NegativeFilter(share=0.1), positives=())
    assert pools == {"q": ["n1", "n2", "n3", "n4"]} and counts["checked"] == 0


@pytest.mark.parametrize("node,message", [({}, None), ({"reference": "lowest"}, "needs share"),
                                          ({"share": 0}, "share must be in"), ({"share": 1.5}, "share must be in"),
                                          ({"margin": -1}, "margin must be"),
                                          ({"share": 0.9, "reference": "max"}, "reference"),
                                          ({"shares": 0.9}, "unknown fields")])
def test_settings_are_checked_and_name_the_field(node, message):
    if message is None:
        assert NegativeFilter.from_config(node) is None
        return
    with pytest.raises(ValueError, match=message):
        NegativeFilter.from_config(node)


@pytest.mark.parametrize("negatives", ["bm25", "dense"])
def test_training_filters_mined_negatives_and_records_the_counts(tiny_beir, tiny_bert, tmp_path, negatives):
    from multipos.train import train

    out = tmp_path / "run"
    train(compose_cfg("train", tiny_overrides(tiny_beir, tiny_bert, out, f"data.source.negatives={negatives}",
                                              "data.source.negative_filter={share: 0.6}", "eval.references=false")))
    record = json.loads((out / "run_info.json").read_text())["stage_records"][0]
    counts = record["negative_filter"]
    assert counts["share"] == 0.6 and counts["checked"] > 0 and 0 < counts["dropped"] <= counts["checked"]


def test_the_refresh_filters_with_the_weights_being_trained(tiny_beir, tiny_bert, tmp_path):
    from multipos.train import train

    out = tmp_path / "run"
    train(compose_cfg("train", tiny_overrides(
        tiny_beir, tiny_bert, out, "data.source.negatives=dense", "data.source.negative_refresh_epochs=1",
        "trainer.max_epochs=2", "data.source.negative_filter={margin: 0.0}", "eval.references=false",
        "eval.validation=null")))
    record = json.loads((out / "run_info.json").read_text())["stage_records"][0]
    assert [r["epoch"] for r in record["negative_filter_refresh"]] == [0]
    assert record["negative_filter_refresh"][0]["checked"] > 0
