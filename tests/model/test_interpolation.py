"""WiSE-FT interpolation (multipos.model.interpolation): Eq. 1 on state dicts, its errors, and the setting
``wise_ft.alpha`` in train.py (the saved model and its evaluation) and evaluate.py."""

from __future__ import annotations

import json

import pytest
import torch
from transformers import AutoModel

from multipos.model.interpolation import interpolate_state
from multipos.runs.spec import run_key
from multipos.train import train
from tests.helpers import compose_cfg, tiny_overrides


def _states():
    g = torch.Generator().manual_seed(0)
    start = {"w": torch.randn(3, 4, generator=g), "b": torch.randn(4, generator=g), "ids": torch.arange(5),
             "same": torch.ones(2)}
    tuned = {"w": torch.randn(3, 4, generator=g), "b": torch.randn(4, generator=g), "ids": torch.arange(5),
             "same": torch.ones(2)}
    return tuned, start


@pytest.mark.parametrize("alpha", [0.0, 0.3, 0.5, 1.0])
def test_eq1_mixes_floating_weights_and_keeps_the_rest(alpha):
    tuned, start = _states()
    out = interpolate_state(tuned, start, alpha)
    for k in ("w", "b"):
        torch.testing.assert_close(out[k], (1 - alpha) * start[k] + alpha * tuned[k], rtol=0, atol=1e-6)
    assert torch.equal(out["ids"], tuned["ids"]) and out["ids"].dtype == torch.long
    assert torch.equal(out["same"], tuned["same"])  # equal tensors are copied, not recomputed (bit for bit)
    if alpha == 1.0:
        assert all(torch.equal(out[k], tuned[k]) for k in tuned)


def test_a_bf16_state_keeps_its_dtype():
    tuned, start = _states()
    out = interpolate_state({k: v.to(torch.bfloat16) if v.is_floating_point() else v for k, v in tuned.items()},
                            start, 0.5)
    assert out["w"].dtype == torch.bfloat16


@pytest.mark.parametrize("alpha", [-0.1, 1.5])
def test_alpha_outside_the_unit_interval_is_refused(alpha):
    tuned, start = _states()
    with pytest.raises(ValueError, match=r"wise_ft.alpha must lie in \[0, 1\]"):
        interpolate_state(tuned, start, alpha)


def test_different_architectures_are_named():
    tuned, start = _states()
    with pytest.raises(ValueError, match="only fine-tuned: \\['extra'\\]"):
        interpolate_state({**tuned, "extra": torch.zeros(1)}, start, 0.5, where="m")
    with pytest.raises(ValueError, match="tensor w has shape \\(3, 5\\)"):
        interpolate_state({**tuned, "w": torch.zeros(3, 5)}, start, 0.5, where="m")


def _weights(folder):
    return {k: v.clone() for k, v in AutoModel.from_pretrained(folder).state_dict().items()}


def test_train_py_saves_and_evaluates_the_interpolated_query_side_model(tiny_beir, tiny_bert, tmp_path):
    from multipos.evaluate import evaluate

    common = ["passages=frozen_index", "loss=jointlh", "passages.candidates=corpus", "module.optimizer.lr=1e-3",
              "model.hidden_dropout=0.0"]
    full, half = tmp_path / "full", tmp_path / "half"
    train(compose_cfg("train", [*common, *tiny_overrides(tiny_beir, tiny_bert, full)]))
    cfg_half = compose_cfg("train", [*common, "wise_ft.alpha=0.5", *tiny_overrides(tiny_beir, tiny_bert, half)])
    cfg_one = compose_cfg("train", [*common, "wise_ft.alpha=1.0", *tiny_overrides(tiny_beir, tiny_bert, half)])
    cfg_none = compose_cfg("train", [*common, *tiny_overrides(tiny_beir, tiny_bert, half)])
    assert run_key(cfg_one) == run_key(cfg_none) != run_key(cfg_half)  # alpha 1: hashes as before
    half_results = train(cfg_half)
    start, tuned = _weights(tiny_bert), _weights(full / "model" / "query_encoder")
    mixed = _weights(half / "model" / "query_encoder")
    moved = [k for k in start if not torch.equal(start[k], tuned[k])]
    assert moved
    for k in moved:  # the same training (deterministic), then Eq. 1 with alpha 0.5
        torch.testing.assert_close(mixed[k], 0.5 * start[k] + 0.5 * tuned[k], rtol=0, atol=1e-6)
    passage = _weights(half / "model" / "passage_encoder")
    assert all(torch.equal(passage[k], start[k]) for k in start)  # E_d stays the starting checkpoint, bit for bit
    assert json.loads((half / "run_info.json").read_text())["status"] == "complete"

    # evaluate.py: the fully trained model interpolated there scores what train.py's interpolated one scored
    sets = [f"eval.test_sets.nfcorpus_test.path={tiny_beir}", "eval.test_sets.nfcorpus_test.name=tiny_test",
            "eval=nfcorpus_test", "eval.bf16=false", "eval.k=20", "eval.passage_max_length=64"]
    cfg = compose_cfg("evaluate", [f"model.name_or_path={full / 'model'}", f"paths.output_dir={tmp_path / 'e'}",
                                   "wise_ft.alpha=0.5", f"wise_ft.start={tiny_bert}", *sets])
    assert evaluate(cfg)["tiny_test"] == pytest.approx(half_results["tiny_test"], abs=1e-5)
    cfg = compose_cfg("evaluate", [f"model.name_or_path={full / 'model'}", f"paths.output_dir={tmp_path / 'f'}",
                                   "wise_ft.alpha=0.5", *sets])
    with pytest.raises(ValueError, match="wise_ft.alpha=0.5 needs wise_ft.start"):
        evaluate(cfg)
