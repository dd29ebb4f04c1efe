"""LoRA adapters on an encoder through ``peft`` (Hu et al. 2022, "LoRA: Low-Rank Adaptation of Large Language
Models"): W x + (alpha / r) · B A x with A [r, d_in], B [d_out, r] trained and W frozen (their Eq. 3).

``model.lora`` (``conf/lora``) sets rank ``r``, ``alpha``, ``dropout`` and ``target_modules`` (the names of the linear
layers that get adapters: ``query``/``value`` in BERT-family encoders, ``q_proj``/``v_proj`` in Llama/Qwen-style
decoders), and which encoder gets them: ``sides: both`` (the shared encoder, or both untied ones) or ``query`` (the
query encoder only; with query-side fine-tuning the passage encoder is frozen anyway). A saved model holds merged
weights (W + (alpha / r) · B A: a plain Hugging Face / sentence-transformers folder, :func:`merged_copy`), and with
``save_adapter: true`` also the adapter alone (``<side>/adapter/``, a ``peft`` folder).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from pathlib import Path

from torch import nn

from multipos.config_mapping import dataclass_fields_only

__all__ = ["LoraSettings", "add_adapters", "has_adapters", "merged_copy", "save_adapter"]

SIDES = ("both", "query")


@dataclass(frozen=True)
class LoraSettings:
    """``model.lora``: rank ``r`` ≥ 1, ``alpha`` > 0 (the update is scaled by alpha / r), ``dropout`` in [0, 1) on
    the adapter input, ``target_modules`` (module names, suffix match as in ``peft``), ``sides`` (``both`` |
    ``query``), ``save_adapter`` (also write the adapter alone next to the merged weights).

    Raises ValueError naming the ``model.lora`` field for a value out of range or an unknown side.
    """

    r: int = 8
    alpha: float = 16.0
    dropout: float = 0.0
    target_modules: tuple[str, ...] = field(default_factory=lambda: ("query", "value"))
    sides: str = "both"
    save_adapter: bool = False

    def __post_init__(self):
        if int(self.r) < 1:
            raise ValueError(f"model.lora.r must be >= 1, got {self.r}")
        if float(self.alpha) <= 0:
            raise ValueError(f"model.lora.alpha must be > 0, got {self.alpha}")
        if not 0.0 <= float(self.dropout) < 1.0:
            raise ValueError(f"model.lora.dropout must be in [0, 1), got {self.dropout}")
        if not self.target_modules:
            raise ValueError("model.lora.target_modules is empty: name the linear layers that get adapters")
        if self.sides not in SIDES:
            raise ValueError(f"model.lora.sides={self.sides!r}; allowed: {', '.join(SIDES)}")

    @classmethod
    def from_config(cls, node) -> "LoraSettings | None":
        """Settings from a ``model.lora`` mapping (None or an empty mapping: no LoRA). Raises ValueError naming an
        unknown field."""
        node = dataclass_fields_only(cls, node, "model.lora")
        if node is None:
            return None
        if "target_modules" in node:
            node["target_modules"] = tuple(str(m) for m in node["target_modules"])
        return cls(**node)


def add_adapters(encoder: nn.Module, settings: LoraSettings) -> nn.Module:
    """``encoder`` wrapped by ``peft`` with fresh LoRA adapters (B = 0, so the output is unchanged at first); every
    weight outside the adapters is frozen. Raises ImportError with the install hint when ``peft`` is missing, and
    ValueError naming ``model.lora.target_modules`` when no module of ``encoder`` matches them."""
    try:
        from peft import LoraConfig, get_peft_model
    except ImportError:  # pragma: no cover - depends on the environment
        raise ImportError("model.lora needs `pip install peft`") from None
    config = LoraConfig(r=int(settings.r), lora_alpha=float(settings.alpha), lora_dropout=float(settings.dropout),
                        target_modules=list(settings.target_modules), bias="none")
    try:
        return get_peft_model(encoder, config)
    except ValueError as e:
        raise ValueError(f"model.lora.target_modules={list(settings.target_modules)}: {e}") from None


def has_adapters(encoder: nn.Module) -> bool:
    """True for an encoder wrapped by :func:`add_adapters`."""
    return hasattr(encoder, "peft_config")


def merged_copy(encoder: nn.Module) -> nn.Module:
    """A plain ``transformers`` model with W + (alpha / r) · B A in place of each adapted weight; ``encoder`` itself
    keeps its adapters (the merge runs on a copy). An encoder without adapters is returned as it is."""
    if not has_adapters(encoder):
        return encoder
    return copy.deepcopy(encoder).merge_and_unload()


def save_adapter(encoder: nn.Module, folder: Path) -> None:
    """Write the adapter weights and their ``peft`` config alone to ``folder`` (loadable with
    ``peft.PeftModel.from_pretrained(<base model>, folder)``)."""
    encoder.save_pretrained(folder)
