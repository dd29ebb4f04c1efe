"""Tevatron training data: JSONL (``query_id``, ``query``, ``positive_passages`` / ``negative_passages`` as lists of
{"docid", "title", "text"}), the schema of the paper's released data, from a file or a Hugging Face ``datasets``
dataset. Positive order is kept: it is the only quality signal the schema carries.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from multipos.formats.types import DataFormatError, Passage, get_field, iter_jsonl

__all__ = ["TevatronExample", "TEVATRON_SCHEMA", "parse_passages", "parse_tevatron", "read_tevatron",
           "load_tevatron_hf"]

#: The schema of one training line, in words (error messages and docs).
TEVATRON_SCHEMA = ('one JSON object a line: {"query_id", "query", "positive_passages": [{"docid", "title", "text"}, '
                   '...], "negative_passages": [...]}, positives in order (gold first)')


@dataclass
class TevatronExample:
    """One Tevatron training line: the query and its ordered positives and (hard) negatives."""

    query_id: str
    query: str
    positives: list[Passage]
    negatives: list[Passage]
    where: str = field(default="", compare=False, repr=False)  # "<file>:<line>" or "<name>[<split>] row <i>"


def parse_passages(obj: dict, key: str, where: str, allow_empty: bool = False) -> list[Passage]:
    """The passages of list field ``key`` of a Tevatron record (absent or null: none); DataFormatError naming ``where``,
    the field and the index for a passage that is not an object, lacks ``docid`` / ``text`` or (unless
    ``allow_empty``) has no text at all."""
    items = obj.get(key) or []  # HF datasets turn a missing list into None
    if not isinstance(items, list):
        raise DataFormatError(f"{where}: field {key!r} must be a list")
    out = []
    for k, p in enumerate(items):
        at = f"{where}: {key}[{k}]"
        if not isinstance(p, dict):
            raise DataFormatError(f"{at} must be an object with docid/title/text")
        pid = str(get_field(p, "docid", at, (str, int)))
        passage = Passage(pid, str(p.get("title") or ""), str(get_field(p, "text", at)))
        if not allow_empty and not passage.full_text().strip():
            raise DataFormatError(f"{at}: passage {pid!r} has an empty 'text' and no 'title'")
        out.append(passage)
    return out


def parse_tevatron(obj: dict, where: str) -> TevatronExample:
    """Validate one Tevatron record; raise DataFormatError naming ``where`` and the field: a missing or
    mistyped field, an empty ``query``, a missing or empty ``positive_passages`` list (a training line
    exists to carry positives), or a passage without text. ``negative_passages`` may be absent."""
    qid = str(get_field(obj, "query_id", where, (str, int)))
    query = get_field(obj, "query", where)
    if not query.strip():
        raise DataFormatError(f"{where}: query {qid!r} has an empty 'query' text")
    if obj.get("positive_passages") is None:  # absent (JSONL) or null (HF datasets without the column)
        raise DataFormatError(f"{where}: query {qid!r}: missing field 'positive_passages'")
    pos = parse_passages(obj, "positive_passages", where)
    if not pos:
        raise DataFormatError(f"{where}: query {qid!r} has an empty 'positive_passages' list")
    return TevatronExample(qid, query, pos, parse_passages(obj, "negative_passages", where), where)


def read_tevatron(path: str | os.PathLike) -> list[TevatronExample]:
    """Read a Tevatron training JSONL file (one query per line)."""
    return [parse_tevatron(obj, f"{path}:{n}") for n, obj in iter_jsonl(path)]


def load_tevatron_hf(name: str, split: str = "train", **kwargs) -> list[TevatronExample]:
    """Load a Tevatron-schema dataset with Hugging Face ``datasets`` (hub id or local path).

    A folder written by ``Dataset.save_to_disk`` is loaded with ``load_from_disk``. Needs the
    ``datasets`` package; raises ImportError with the install hint otherwise.
    """
    try:
        import datasets
    except ImportError:  # pragma: no cover - depends on the environment
        raise ImportError("reading HF datasets needs `pip install datasets` (extra: multipos[datasets])") from None
    local = Path(name)
    if local.is_dir() and any((local / f).exists() for f in ("dataset_dict.json", "state.json")):
        ds = datasets.load_from_disk(name)
        if isinstance(ds, datasets.DatasetDict):
            ds = ds[split]
    else:
        ds = datasets.load_dataset(name, split=split, **kwargs)
    return [parse_tevatron(dict(row), f"{name}[{split}] row {i}") for i, row in enumerate(ds)]
