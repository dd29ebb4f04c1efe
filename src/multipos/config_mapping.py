"""Settings dataclasses built from a config mapping, with errors that name the config key."""

from __future__ import annotations

from typing import Mapping, TypeVar

T = TypeVar("T")

__all__ = ["dataclass_fields_only"]


def dataclass_fields_only(cls: type[T], node: Mapping | None, where: str) -> dict | None:
    """``node`` as a plain dict of ``cls``'s dataclass fields, or None when ``node`` is None or empty (the setting
    is off). Raises ValueError naming ``where`` (the config key, e.g. ``model.lora``) and the unknown fields."""
    if not node:
        return None
    node = dict(node)
    unknown = sorted(set(node) - set(cls.__dataclass_fields__))
    if unknown:
        raise ValueError(f"{where}: unknown fields {unknown}; allowed: {', '.join(cls.__dataclass_fields__)}")
    return node
