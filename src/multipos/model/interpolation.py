"""Weight-space interpolation toward the starting checkpoint (WiSE-FT).

Fine-tuning on NFCorpus gains in domain and loses out of domain (TREC DL), the query-side recipe more than the
two-tower one (docs/query-side.md). WiSE-FT (Wortsman et al., "Robust fine-tuning of zero-shot
models", CVPR 2022, Eq. 1) trades along a line between the two models without training again:

    θ_α = (1 − α) · θ_0 + α · θ_1,        α ∈ [0, 1]

with θ_0 the starting (zero-shot) weights and θ_1 the fine-tuned ones: α = 1 is the fine-tuned model, α = 0 the
starting one. The setting is ``wise_ft.alpha`` (``conf/wise_ft/default.yaml``): ``train.py`` applies it to the
model it trained before saving and the final evaluation; ``evaluate.py`` to the model it evaluates (``init_from``,
starting from ``model.name_or_path``; or ``wise_ft.start=<starting checkpoint>`` for any saved model). Query-side
models keep E_d at θ_0, so only E_q moves and evaluation re-encodes queries only.
"""

from __future__ import annotations

import logging

import torch
from torch import nn

log = logging.getLogger(__name__)


def interpolate_state(finetuned: dict[str, torch.Tensor], start: dict[str, torch.Tensor], alpha: float,
                      where: str = "model") -> dict[str, torch.Tensor]:
    """WiSE-FT Eq. 1 on two state dicts: ``(1 − α)·start + α·finetuned`` for every floating-point tensor.

    Args:
        finetuned: θ_1, name → tensor (any shapes; each equal to its ``start`` counterpart).
        start: θ_0, the same names.
        alpha: α in [0, 1] (1 = ``finetuned`` unchanged, 0 = ``start``).
        where: what the state dicts belong to, for error messages.

    Returns a new state dict (dtype of ``finetuned``); integer / bool buffers (e.g. ``position_ids``) and tensors
    equal in both are taken from ``finetuned`` as they are (so an untouched encoder stays bit for bit the same:
    its corpus embeddings stay in the cache).

    Raises: ValueError for α outside [0, 1], names present in one dict only (the first few named), or a tensor
    whose shape differs between the two (named) — the checkpoints are not the same architecture.
    """
    alpha = float(alpha)
    if not 0.0 <= alpha <= 1.0:
        raise ValueError(f"wise_ft.alpha must lie in [0, 1] (1 = fine-tuned, 0 = starting weights), got {alpha}")
    only_ft, only_start = sorted(set(finetuned) - set(start)), sorted(set(start) - set(finetuned))
    if only_ft or only_start:
        raise ValueError(f"{where}: the fine-tuned and starting weights differ in their tensors (only fine-tuned: "
                         f"{only_ft[:3]}, only starting: {only_start[:3]}); wise_ft.start must be the checkpoint "
                         "the model was fine-tuned from")
    out = {}
    for name, theta1 in finetuned.items():
        theta0 = start[name]
        if theta1.shape != theta0.shape:
            raise ValueError(f"{where}: tensor {name} has shape {tuple(theta1.shape)} fine-tuned but "
                             f"{tuple(theta0.shape)} in wise_ft.start")
        if theta1.is_floating_point() and not torch.equal(theta1, theta0):
            mixed = (1.0 - alpha) * theta0.to(torch.float32) + alpha * theta1.to(torch.float32)
            out[name] = mixed.to(theta1.dtype)
        else:
            out[name] = theta1.clone()
    return out


def interpolate_encoder(encoder: nn.Module, start: nn.Module, alpha: float, where: str) -> None:
    """Replace ``encoder``'s weights in place by :func:`interpolate_state` of its and ``start``'s state dicts."""
    encoder.load_state_dict(interpolate_state(encoder.state_dict(), start.state_dict(), alpha, where))


def interpolate_toward_start(model, start, alpha: float) -> None:
    """Apply WiSE-FT (Eq. 1 of Wortsman et al. 2022) to a :class:`~multipos.model.encoder.DualEncoder` in place.

    Both sides move toward the starting encoder ``start`` (a DualEncoder holding θ0, e.g.
    ``model.starting_point(<checkpoint>)``: :meth:`~multipos.model.encoder.DualEncoder.starting_point`): E_q always, E_d
    when untied (for a query-side model E_d *is* the starting checkpoint, so it stays bit for bit the same and its
    cached corpus embeddings stay valid). A shared encoder is interpolated once. ``alpha == 1`` does nothing.

    Raises: ValueError as :func:`interpolate_state`, and for a model with LoRA adapters.
    """
    if float(alpha) == 1.0:
        return
    from multipos.model.lora import has_adapters

    if has_adapters(model.query_encoder):
        raise ValueError("wise_ft.alpha < 1 with model.lora: interpolation needs full weights; LoRA's update is "
                         "already a scaled low-rank step (lower model.lora.alpha instead)")
    interpolate_encoder(model.query_encoder, start.query_encoder, alpha, f"{model.name_or_path} (query encoder)")
    if not model.shared:
        interpolate_encoder(model.passage_encoder, start.query_encoder, alpha,
                            f"{model.name_or_path} (passage encoder)")
    log.info("WiSE-FT: weights = %.3g x fine-tuned + %.3g x %s (Wortsman et al. 2022, Eq. 1)",
             alpha, 1 - float(alpha), start.name_or_path)
