"""The main job end to end on the tiny fixtures (tiny random BERT, tiny graded BEIR folder)."""

from __future__ import annotations

import json

import pytest
from transformers import AutoModel

from multipos.train import train
from tests.helpers import compose_cfg, tiny_overrides

METRICS = {"ndcg@10", "mrr@10", "recall@100", "recall@1000"}


@pytest.mark.parametrize("loss,data", [("lsepair", "nfcorpus_hetero"), ("rand1lh", "nfcorpus_homo"),
                                       ("jointlh", "nfcorpus_curriculum")])
def test_train_writes_metrics_runs_and_hf_model(tiny_beir, tiny_bert, tmp_path, loss, data):
    out = tmp_path / "run"
    cfg = compose_cfg("train", [f"loss={loss}", f"data={data}", *tiny_overrides(tiny_beir, tiny_bert, out)])
    results = train(cfg)

    metrics = json.loads((out / "metrics.json").read_text())
    assert set(metrics) == {"tiny_dev", "tiny_test"}
    assert METRICS <= set(metrics["tiny_test"])
    assert all(0.0 <= v <= 1.0 for v in metrics["tiny_test"].values())
    assert metrics == json.loads(json.dumps(results))
    refs = json.loads((out / "references.json").read_text())
    assert set(refs) == {"bm25", "zero-shot"} and "tiny_test" in refs["bm25"]
    run_lines = (out / "run.tiny_test.trec").read_text().splitlines()
    assert run_lines and all(len(line.split()) == 6 for line in run_lines)
    AutoModel.from_pretrained(out / "model")  # HF format
    # the CSV logger recorded the training loss per step
    csv = (out / "csv" / "metrics.csv").read_text()
    assert "train/loss" in csv and "val/ndcg@10" in csv
    if data == "nfcorpus_curriculum":
        assert (out / "checkpoints" / "stage2").is_dir()


def test_invalid_group_size_fails_before_writing(tiny_beir, tiny_bert, tmp_path):
    out = tmp_path / "run"
    out.mkdir()
    (out / "metrics.json").write_text('{"keep": 1}')
    cfg = compose_cfg("train", tiny_overrides(tiny_beir, tiny_bert, out, "data.group_size=1"))
    with pytest.raises(Exception, match="group_size"):
        train(cfg)
    assert (out / "metrics.json").read_text() == '{"keep": 1}'


def test_m_larger_than_g_is_rejected(tiny_beir, tiny_bert, tmp_path):
    cfg = compose_cfg("train", tiny_overrides(tiny_beir, tiny_bert, tmp_path / "r", "data.max_positives=9"))
    with pytest.raises(Exception, match="max_positives"):
        train(cfg)


def test_unknown_objective_lists_choices(tiny_beir, tiny_bert, tmp_path):
    with pytest.raises(Exception, match="lsepair"):
        cfg = compose_cfg("train", tiny_overrides(tiny_beir, tiny_bert, tmp_path / "r", "loss=nope"))
        train(cfg)
    cfg = compose_cfg("train", tiny_overrides(tiny_beir, tiny_bert, tmp_path / "r", "loss.name=nope"))
    with pytest.raises(Exception, match="allowed"):
        train(cfg)
