"""Sequence packing: a training batch encoded without padding, several texts to a row.

A padded batch costs the encoder B × L_max tokens in every linear layer; NFCorpus training queries average 7 tokens
and a batch of 16 pads to about 17, so about 2.4 times the real tokens go through the layers. Packed, the texts of
a batch are laid end to end in rows of about ``capacity`` tokens (:func:`plan_rows`), each text
keeping its own position ids (0, 1, …) and attending only to itself through a block-diagonal attention mask
[R, 1, T, T]; the linear layers then see only the real tokens plus each row's tail. Pooling reads each text's own
span (``cls``: its first token; ``mean``: the mean over its tokens), so every embedding is the same function of its
text as in the padded batch, and the loss and its gradients equal the padded batch's up to floating-point summation
order (tested). Dropout draws other random masks than the padded batch would (another layout), from the same
distribution.

This is the padding-free layout of Hugging Face's ``DataCollatorWithFlattening`` (Hugging Face blog, "Improving
Hugging Face Training Efficiency Through Packing with Flash Attention 2", 2024), written for encoders whose attention
takes a prepared 4D mask (``sdpa``: boolean; ``eager``: additive) instead of a FlashAttention-2 kernel, so that it
runs on a CPU. It applies where the encoder takes ``position_ids`` and the result has been checked against the
padded batch once per encoder (:func:`packing_applies`: an architecture that derives positions otherwise, e.g.
RoBERTa's offset ones, fails that check and keeps padded batches, with a warning).

Measured by ``bench/bench_query_side.py --fp32`` on the 2-core AMD EPYC (2026-11-26, all-MiniLM-L6-v2, random
batches of NFCorpus training queries, forward + backward + fused AdamW, capacity 128): a query-side step 1.40x faster
at B = 16 (group candidates) and 1.98x at B = 64 (every corpus passage a candidate) than with one padded batch; the
retired length buckets (length-sorted parts, each padded to its own longest) gave nothing at B = 16, 1.34-1.41x at 64.
On an accelerator one padded batch stays the layout (packing is applied on the CPU only). Config:
``pack_sequences`` (conf/train.yaml; a speed setting that names no run, like ``threads``).
"""

from __future__ import annotations

import inspect
import logging
import weakref
from dataclasses import dataclass
from typing import Callable

import torch
from torch import Tensor, nn

log = logging.getLogger(__name__)

#: Poolings a packed row can serve (``lasttoken`` pools decoder embedders, whose causal attention packing would break).
PACKABLE_POOLINGS = ("cls", "mean")
#: Attention implementations that take a prepared 4D mask, and the kind of mask each takes.
_MASK_KINDS = {"sdpa": "bool", "eager": "additive"}
#: Largest difference, relative to the largest embedding entry, that the one-time check accepts (float32 rounding
#: of a different matrix layout is ~1e-6).
CHECK_TOLERANCE = 1e-4

_checked: "weakref.WeakKeyDictionary[nn.Module, bool]" = weakref.WeakKeyDictionary()


def check_pack_sequences(value) -> int:
    """``value`` (config ``pack_sequences``: tokens per packed row; None or 0 = padded batches) as an int.

    Raises ValueError unless None or a whole number >= 0."""
    if value is None:
        return 0
    if isinstance(value, bool) or not isinstance(value, (int, float)) or int(value) != value or value < 0:
        raise ValueError(f"pack_sequences: tokens per packed row, a whole number >= 0 (0 or null: padded batches), "
                         f"got {value!r}")
    return int(value)


@dataclass(frozen=True)
class PackedBatch:
    """A batch of B texts laid out in R rows of T tokens.

    ``input_ids``, ``position_ids``, ``token_type_ids``, ``segment`` [R, T] (``segment``: the text each token belongs
    to, -1 for a row's unused tail); ``row``, ``offset``, ``lengths`` [B]: where each text starts and how many
    tokens it has."""

    input_ids: Tensor
    position_ids: Tensor
    token_type_ids: Tensor
    segment: Tensor
    row: Tensor
    offset: Tensor
    lengths: Tensor

    def attention_mask(self, kind: str, dtype: torch.dtype) -> Tensor:
        """Block-diagonal mask [R, 1, T, T]: a token attends to the tokens of its own text; a tail token to itself
        (so that no softmax row is empty). ``kind`` ``bool`` (True = attend) or ``additive`` (0 / dtype's minimum)."""
        seg = self.segment
        allowed = seg[:, :, None] == seg[:, None, :]
        tail = seg < 0
        allowed &= ~(tail[:, :, None] & tail[:, None, :])  # tail tokens do not see each other …
        eye = torch.eye(seg.shape[1], dtype=torch.bool, device=seg.device)
        allowed |= eye & tail[:, :, None]  # … only themselves
        if kind == "bool":
            return allowed[:, None]
        zero = torch.zeros((), dtype=dtype, device=seg.device)
        return torch.where(allowed, zero, torch.finfo(dtype).min)[:, None]


def plan_rows(lengths: list[int], capacity: int) -> tuple[list[int], list[int], int, int]:
    """Balanced rows: R = ⌈Σ lengths / capacity⌉ rows (at most one per text), each text, longest first, to the row
    with the fewest tokens so far (longest-processing-time greedy), so that R × T, the token slots the encoder
    computes, stays close to the real tokens. A row holds at most Σ lengths / R + the longest text tokens.

    Returns (row of each text, its offset in the row, row count R, row width T = the fullest row's tokens). Raises
    ValueError for capacity < 1 or an empty batch."""
    if capacity < 1:
        raise ValueError(f"pack_sequences: capacity must be >= 1, got {capacity}")
    if not lengths:
        raise ValueError("pack_sequences: an empty batch has nothing to pack")
    rows = min(len(lengths), -(-sum(lengths) // capacity))
    used = [0] * rows
    row, offset = [0] * len(lengths), [0] * len(lengths)
    for i in sorted(range(len(lengths)), key=lambda i: -lengths[i]):
        r = min(range(rows), key=used.__getitem__)
        row[i], offset[i] = r, used[r]
        used[r] += lengths[i]
    return row, offset, rows, max(used)


def right_padded(attention_mask: Tensor) -> bool:
    """True when every row of ``attention_mask`` [B, L] is ones then zeros, the first token attended."""
    m = attention_mask.to(torch.long)
    return bool(m[:, 0].all()) and bool((m[:, 1:] <= m[:, :-1]).all())


def pack(tokens: dict[str, Tensor], capacity: int) -> PackedBatch:
    """Lay a right-padded tokenizer batch (``input_ids``, ``attention_mask`` [B, L]; ``token_type_ids`` kept when
    given) out in rows (:func:`plan_rows`). Raises ValueError for a batch that is not right-padded."""
    mask = tokens["attention_mask"]
    if not right_padded(mask):
        raise ValueError("pack_sequences: the batch must be padded on the right (attention_mask ones, then zeros)")
    lengths = mask.sum(dim=1)
    row, offset, rows, width = plan_rows(lengths.tolist(), capacity)
    device = mask.device
    row_t = torch.tensor(row, dtype=torch.long, device=device)
    off_t = torch.tensor(offset, dtype=torch.long, device=device)
    keep = mask.bool()  # [B, L]
    text, pos = keep.nonzero(as_tuple=True)  # every real token: its text and its position in the text
    r, c = row_t[text], off_t[text] + pos
    input_ids = torch.zeros(rows, width, dtype=tokens["input_ids"].dtype, device=device)
    input_ids[r, c] = tokens["input_ids"][keep]
    position_ids = torch.zeros(rows, width, dtype=torch.long, device=device)
    position_ids[r, c] = pos
    token_type_ids = torch.zeros(rows, width, dtype=torch.long, device=device)
    if "token_type_ids" in tokens:
        token_type_ids[r, c] = tokens["token_type_ids"][keep].to(torch.long)
    segment = torch.full((rows, width), -1, dtype=torch.long, device=device)
    segment[r, c] = text
    return PackedBatch(input_ids, position_ids, token_type_ids, segment, row_t, off_t, lengths.to(torch.long))


def pool_packed(hidden: Tensor, packed: PackedBatch, pooling: str) -> Tensor:
    """Pool token states [R, T, H] of a packed batch into [B, H] in the batch's order: ``cls`` = each text's first
    token, ``mean`` = the mean over its tokens. Raises ValueError for another pooling."""
    if pooling == "cls":
        return hidden[packed.row, packed.offset]
    if pooling == "mean":
        real = packed.segment >= 0
        sums = hidden.new_zeros(packed.lengths.shape[0], hidden.shape[-1]).index_add(
            0, packed.segment[real], hidden[real])
        return sums / packed.lengths.to(hidden.dtype)[:, None]
    raise ValueError(f"pack_sequences: pooling {pooling!r} cannot be packed; "
                     f"packable: {', '.join(PACKABLE_POOLINGS)}")


def _mask_kind(encoder: nn.Module) -> str | None:
    impl = getattr(getattr(encoder, "config", None), "_attn_implementation", None)
    return _MASK_KINDS.get(impl)


def _takes_positions(encoder: nn.Module) -> bool:
    try:
        params = inspect.signature(encoder.forward).parameters
    except (TypeError, ValueError):
        return False
    return "position_ids" in params or any(p.kind is p.VAR_KEYWORD for p in params.values())


def encode_packed(encoder: nn.Module, tokens: dict[str, Tensor], pooling: str, capacity: int) -> Tensor:
    """Pooled embeddings [B, H] of a right-padded batch ([B, L]) encoded packed (:func:`pack`, :func:`pool_packed`).

    Raises ValueError for an encoder without a 4D-mask attention implementation (``sdpa`` or ``eager``), a batch not
    padded on the right, or a pooling other than ``cls`` / ``mean`` (:func:`pool_packed`)."""
    kind = _mask_kind(encoder)
    if kind is None:
        raise ValueError("pack_sequences: the encoder's attention implementation takes no 4D mask (sdpa or eager)")
    packed = pack(tokens, capacity)
    dtype = next(encoder.parameters()).dtype
    kwargs = {"input_ids": packed.input_ids, "position_ids": packed.position_ids,
              "attention_mask": packed.attention_mask(kind, dtype)}
    if "token_type_ids" in inspect.signature(encoder.forward).parameters:
        kwargs["token_type_ids"] = packed.token_type_ids  # explicit: rows may be longer than any one text
    return pool_packed(encoder(**kwargs).last_hidden_state, packed, pooling)


def packing_applies(encoder: nn.Module, tokens: dict[str, Tensor], pooling: str,
                    padded: Callable[[nn.Module, dict[str, Tensor]], Tensor]) -> bool:
    """Whether this batch may be encoded packed: on the CPU, a packable pooling, a right-padded batch with some
    padding to save, and an encoder that takes ``position_ids`` and a 4D mask and whose packed embeddings matched
    ``padded(encoder, tokens)`` (pooled, [B, H]) the first time it was asked — checked once per encoder, in eval
    mode without autocast or gradients, within :data:`CHECK_TOLERANCE` of the largest entry; a failed check logs a
    warning and keeps that encoder on padded batches."""
    mask = tokens["attention_mask"]
    if mask.device.type != "cpu" or pooling not in PACKABLE_POOLINGS or bool(mask.all()) or not right_padded(mask):
        return False
    known = _checked.get(encoder)
    if known is not None:
        return known
    ok, why = False, ""
    if _mask_kind(encoder) is None:
        why = f"attention implementation {getattr(encoder.config, '_attn_implementation', None)!r} takes no 4D mask"
    elif not _takes_positions(encoder):
        why = "its forward takes no position_ids"
    else:
        was_training = encoder.training
        encoder.eval()
        try:
            with torch.no_grad(), torch.autocast("cpu", enabled=False):
                want = padded(encoder, tokens).float()
                got = encode_packed(encoder, tokens, pooling, 8).float()  # small rows: several texts share one
            err = float((got - want).abs().max())
            scale = max(1.0, float(want.abs().max()))
            ok = err <= CHECK_TOLERANCE * scale
            why = f"packed embeddings differ from the padded ones by {err:.2e}"
        except Exception as exc:  # an architecture that rejects the layout keeps padded batches
            why = f"{type(exc).__name__}: {exc}"
        finally:
            encoder.train(was_training)
    if not ok:
        log.warning("pack_sequences: %s keeps padded batches (%s)", type(encoder).__name__, why)
    _checked[encoder] = ok
    return ok
