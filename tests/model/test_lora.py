"""LoRA through ``peft`` (multipos.model.lora): only the adapters train, the export holds merged weights that embed as
the
adapter model does, and it works with query-side training, GradCache and resume."""

from __future__ import annotations

import json

import pytest
import torch

pytest.importorskip("peft")

from multipos.losses import ContrastiveLoss  # noqa: E402
from multipos.model.encoder import DualEncoder  # noqa: E402
from multipos.model.lora import LoraSettings  # noqa: E402
from multipos.retrieval.encoding import encode  # noqa: E402
from multipos.train import train  # noqa: E402
from tests.helpers import compose_cfg, tiny_overrides  # noqa: E402

LORA = {"r": 4, "alpha": 8, "dropout": 0.0, "target_modules": ["query", "value"]}
QUERIES = ["protein diet", "heart risk", "sleep study"]
PASSAGES = ["protein and diet in adults", "heart disease risk", "sleep and study", "exercise"]


def _lora_override(**extra) -> str:
    node = {**LORA, **extra}
    inner = ", ".join(f"{k}: [{', '.join(v)}]" if isinstance(v, list) else f"{k}: {v}" for k, v in node.items())
    return "model.lora={" + inner + "}"


@pytest.mark.parametrize("field,value,message", [("r", 0, "model.lora.r"), ("alpha", 0, "model.lora.alpha"),
                                                 ("dropout", 1.0, "model.lora.dropout"),
                                                 ("sides", "passage", "model.lora.sides"),
                                                 ("target_modules", [], "target_modules"),
                                                 ("rank", 4, "unknown fields")])
def test_bad_lora_settings_name_the_field(field, value, message):
    with pytest.raises(ValueError, match=message):
        LoraSettings.from_config({**LORA, field: value})


def test_only_adapters_train_the_loss_falls_and_the_merged_export_embeds_the_same(tiny_bert, tmp_path):
    torch.manual_seed(0)
    model = DualEncoder(str(tiny_bert), pooling="mean", normalize=True, temperature=0.05, lora=LORA)
    trainable = [n for n, p in model.named_parameters() if p.requires_grad]
    assert trainable and all("lora_" in n for n in trainable)
    base = {n: p.detach().clone() for n, p in model.named_parameters() if not p.requires_grad}
    adapters = {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}
    loss_fn = ContrastiveLoss("lsepair")
    q_tok, p_tok = model.tokenize(QUERIES, "query"), model.tokenize(PASSAGES, "passage")
    positives = torch.tensor([[1, 0, 0, 0], [0, 1, 0, 0], [0, 0, 1, 0]], dtype=torch.bool)
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=5e-2)
    losses = []
    for _ in range(15):
        scores = model.score(model.encode_queries(q_tok), model.encode_passages(p_tok))
        loss = loss_fn(scores, positives, ~positives)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < losses[0] * 0.8
    for n, p in model.named_parameters():
        if n in base:
            assert torch.equal(p, base[n]), f"{n}: a frozen base weight changed"
        else:
            assert not torch.equal(p, adapters[n]), f"{n}: an adapter did not change"
    model.eval()
    model.lora = LoraSettings.from_config({**LORA, "save_adapter": True})
    model.save_pretrained(tmp_path / "model")
    assert (tmp_path / "model" / "adapter" / "adapter_config.json").is_file()
    merged = DualEncoder(str(tmp_path / "model")).eval()  # a plain folder: no peft needed to load it
    assert not any("lora_" in n for n, _ in merged.named_parameters())
    for texts, kind in ((QUERIES, "query"), (PASSAGES, "passage")):
        torch.testing.assert_close(torch.as_tensor(encode(merged, texts, kind, progress=False, bf16=False)),
                                   torch.as_tensor(encode(model, texts, kind, progress=False, bf16=False)),
                                   atol=1e-5, rtol=1e-4)
    st = pytest.importorskip("sentence_transformers").SentenceTransformer(str(tmp_path / "model"), device="cpu")
    torch.testing.assert_close(torch.as_tensor(st.encode(PASSAGES)).float(),
                               torch.as_tensor(encode(model, PASSAGES, "passage", progress=False, bf16=False)).float(),
                               atol=1e-5, rtol=1e-4)


def test_query_side_lora_with_grad_cache_trains_query_adapters_only(tiny_beir, tiny_bert, tmp_path):
    out = tmp_path / "run"
    train(compose_cfg("train", ["passages=frozen_index", *tiny_overrides(
        tiny_beir, tiny_bert, out, "loss=jointlh", "passages.candidates=corpus", "module.optimizer.lr=1e-2",
        "module.grad_cache_chunk_size=1", _lora_override(sides="query"))]))
    settings = json.loads((out / "model" / "multipos_encoder.json").read_text())
    assert settings["shared"] is False
    start = DualEncoder(str(tiny_bert)).query_encoder.state_dict()
    trained = DualEncoder(str(out / "model"))
    passage = trained.passage_encoder.state_dict()
    assert all(torch.equal(passage[k], start[k]) for k in start)  # E_d: the starting weights, bit for bit
    query = trained.query_encoder.state_dict()
    changed = [k for k in start if not torch.equal(query[k], start[k])]
    # the merged update lands in the adapted layers only (query / value projections)
    assert changed and all(".query." in k or ".value." in k for k in changed)


def test_lora_resumes_after_an_interruption(tiny_beir, tiny_bert, tmp_path, monkeypatch):
    from multipos.training.module import RetrieverModule

    extra = ("loss=lsepair", "trainer.max_epochs=2", "callbacks.model_checkpoint.every_n_train_steps=1",
             _lora_override())
    expected = train(compose_cfg("train", tiny_overrides(tiny_beir, tiny_bert, tmp_path / "whole", *extra)))
    out = tmp_path / "killed"
    cfg = compose_cfg("train", tiny_overrides(tiny_beir, tiny_bert, out, *extra))
    real_step = RetrieverModule.training_step

    def dies(self, batch, batch_idx):
        if self.trainer.global_step == 3:
            raise RuntimeError("preempted")
        return real_step(self, batch, batch_idx)

    monkeypatch.setattr(RetrieverModule, "training_step", dies)
    with pytest.raises(RuntimeError, match="preempted"):
        train(cfg)
    monkeypatch.setattr(RetrieverModule, "training_step", real_step)
    assert train(cfg) == expected
    assert json.loads((out / "run_info.json").read_text())["resumed"]


def test_lora_with_weight_interpolation_is_refused(tiny_bert):
    from multipos.model.interpolation import interpolate_toward_start

    model = DualEncoder(str(tiny_bert), lora=LORA)
    with pytest.raises(ValueError, match="wise_ft.alpha < 1 with model.lora"):
        interpolate_toward_start(model, model.starting_point(str(tiny_bert)), 0.5)
