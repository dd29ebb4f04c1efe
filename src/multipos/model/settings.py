"""The settings a dual encoder is built with besides its weights — pooling, L2 normalisation, temperature, shared or
untied towers, query and passage prompts — and where each comes from when a checkpoint is loaded: the caller, the
checkpoint's ``multipos_encoder.json`` (written by :meth:`multipos.model.encoder.DualEncoder.save_pretrained`) or its
sentence-transformers files (:func:`multipos.model.export.read_settings`).
"""

from __future__ import annotations

import json
import logging
import math
from pathlib import Path

from multipos.assets import ENCODER_SETTINGS_FILE
from multipos.model.export import read_settings

log = logging.getLogger(__name__)

__all__ = ["DEFAULTS", "resolve_settings"]

#: Settings saved to ``multipos_encoder.json`` and their defaults when neither the checkpoint nor the caller sets them.
DEFAULTS = {"pooling": "cls", "normalize": False, "temperature": 1.0, "shared": True, "query_prompt": "",
            "passage_prompt": ""}
_CASTS = {"pooling": str, "normalize": bool, "temperature": float, "shared": bool, "query_prompt": str,
          "passage_prompt": str}


def _same(field: str, a, b) -> bool:
    if field == "temperature":
        return math.isclose(float(a), float(b), rel_tol=1e-9, abs_tol=0.0)
    return _CASTS[field](a) == _CASTS[field](b)


def resolve_settings(path: str | Path, given: dict, prefer_saved: bool) -> dict:
    """The settings of the encoder in checkpoint folder ``path`` → {field: value} for every field of
    :data:`DEFAULTS`, each cast to its type.

    ``given``: the caller's value of each field (None = unset). Per field: the value saved in ``path``'s
    ``multipos_encoder.json`` wins over a different given one when ``prefer_saved`` (the other way round without it;
    either way with a warning naming the field and the file); with nothing saved, the given value, else the
    checkpoint's sentence-transformers setting (of ``query_encoder/`` for an untied checkpoint), else the default.

    Raises ``KeyError`` when ``given`` lacks a field, ``ValueError`` when a value does not cast to its type.
    """
    saved_file = Path(path, ENCODER_SETTINGS_FILE)
    saved = json.loads(saved_file.read_text()) if saved_file.is_file() else {}
    untied = Path(path, "query_encoder")
    st = read_settings(untied if untied.is_dir() else path)
    out = {}
    for field, default in DEFAULTS.items():
        value, stored = given[field], saved.get(field)
        if stored is None:
            chosen = value if value is not None else st.get(field, default)
        elif value is None or _same(field, value, stored):
            chosen = stored
        elif prefer_saved:
            log.warning("model.%s=%s (config) differs from %s saved in %s: using the saved value; set "
                        "model.prefer_saved=false to force the config", field, value, stored, saved_file)
            chosen = stored
        else:
            log.warning("model.%s=%s (config) differs from %s saved in %s: using the config value "
                        "(model.prefer_saved=false)", field, value, stored, saved_file)
            chosen = value
        out[field] = _CASTS[field](chosen)
    return out
