"""The tokenizer side of an encoder: the EOS rule last-token pooling needs, and the check that a tokenizer belongs to
its checkpoint. (Prompts are text put before a query or passage:
:meth:`multipos.model.encoder.DualEncoder.tokenize`.)"""

from __future__ import annotations

import json

from torch import nn

__all__ = ["ensure_eos", "check_tokenizer"]


def ensure_eos(tokenizer) -> bool:
    """Make a fast ``tokenizer`` end every sequence with its EOS token, as last-token pooling needs (decoder
    embedders such as Qwen3-Embedding pool the EOS state; many decoder tokenizers do not append it). The rule is set
    in the tokenizer's post-processor, so it is saved with the tokenizer and sentence-transformers tokenises the same
    way. Returns True when it changed the tokenizer, False when EOS is already appended.

    Raises ValueError for a tokenizer without an EOS token, or a slow (Python) tokenizer that does not append one.
    """
    eos, eos_id = tokenizer.eos_token, tokenizer.eos_token_id
    if eos is None or eos_id is None:
        raise ValueError("model.pooling=lasttoken needs a tokenizer with an EOS token (tokenizer.eos_token is None)")
    ids = tokenizer("a")["input_ids"]
    if ids and ids[-1] == eos_id:
        return False
    if not getattr(tokenizer, "is_fast", False):
        raise ValueError("model.pooling=lasttoken: the tokenizer does not append its EOS token and is not a fast "
                         "tokenizer whose post-processor could")
    from tokenizers import processors

    backend = tokenizer.backend_tokenizer
    spec = json.loads(backend.to_str()).get("post_processor") or {}
    if spec.get("type") == "TemplateProcessing":  # e.g. one that adds BOS: kept, EOS appended at the end
        single, pair = _template(spec["single"]), _template(spec["pair"])
        special = [(name, int(tok["ids"][0])) for name, tok in spec.get("special_tokens", {}).items()]
        backend.post_processor = processors.TemplateProcessing(
            single=f"{single} {eos}:0", pair=f"{pair} {eos}:1", special_tokens=[*special, (eos, eos_id)])
    else:  # none, or one that adds no token (byte-level offsets): EOS after whatever it does
        append = processors.TemplateProcessing(single=f"$A:0 {eos}:0", pair=f"$A:0 {eos}:0 $B:1 {eos}:1",
                                               special_tokens=[(eos, eos_id)])
        backend.post_processor = append if backend.post_processor is None else processors.Sequence(
            [backend.post_processor, append])
    return True


def _template(pieces: list[dict]) -> str:
    """A ``tokenizers`` TemplateProcessing template (its JSON pieces) as the string form, e.g. ``"<s>:0 $A:0"``."""
    out = []
    for piece in pieces:
        if "SpecialToken" in piece:
            out.append(f"{piece['SpecialToken']['id']}:{piece['SpecialToken']['type_id']}")
        else:
            out.append(f"${piece['Sequence']['id']}:{piece['Sequence']['type_id']}")
    return " ".join(out)


def check_tokenizer(tokenizer, encoder: nn.Module, where: str) -> None:
    """Raise ValueError when ``tokenizer`` has more tokens than ``encoder``'s input embedding rows (a tokenizer
    of another checkpoint: its larger ids would fail in the embedding lookup); ``where`` names its source."""
    rows = encoder.get_input_embeddings().num_embeddings
    if len(tokenizer) > rows:
        raise ValueError(f"{where}: the tokenizer has {len(tokenizer)} tokens but the model's embedding matrix has "
                         f"{rows} rows (config.json vocab_size): the tokenizer does not belong to this checkpoint")
