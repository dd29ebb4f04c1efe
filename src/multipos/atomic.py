"""Atomic writes: every output file and folder of a run goes through these helpers.

A file is written to a temporary sibling and moved over the target with ``os.replace`` (atomic on POSIX),
so a reader sees the old file or the new one, never half of one; a crash leaves at most a ``*.tmp-<pid>``
sibling, which no reader trusts. Folders (``model/``) are written into a temporary sibling and renamed in
place of the old one.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
from pathlib import Path
from typing import Any, Iterator

__all__ = ["AtomicCheckpointIO", "load_checkpoint", "writer", "write_text", "write_json", "write_bytes", "read_json",
           "replace_dir", "temp_path", "share_identical"]


def temp_path(path: str | os.PathLike) -> Path:
    """The temporary sibling used while ``path`` is written (``<name>.tmp-<pid>``)."""
    path = Path(path)
    return path.with_name(f"{path.name}.tmp-{os.getpid()}")


@contextlib.contextmanager
def writer(path: str | os.PathLike, mode: str = "w", encoding: str | None = "utf-8") -> Iterator:
    """Open a temporary sibling of ``path`` for writing; on success it is fsync'd and moved over ``path``.

    On an exception the temporary file is removed and ``path`` is left as it was (streaming writes of large
    files, e.g. TREC runs, go through this).
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = temp_path(path)
    try:
        with open(tmp, mode, encoding=None if "b" in mode else encoding) as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()


def write_bytes(path: str | os.PathLike, data: bytes) -> Path:
    """Write ``data`` to ``path`` atomically (fsync'd temp file, then ``os.replace``). Returns ``path``."""
    with writer(path, "wb") as f:
        f.write(data)
    return Path(path)


def write_text(path: str | os.PathLike, text: str) -> Path:
    """Write UTF-8 ``text`` to ``path`` atomically."""
    return write_bytes(path, text.encode("utf-8"))


def write_json(path: str | os.PathLike, obj: Any, indent: int | None = 2) -> Path:
    """Write ``obj`` as JSON to ``path`` atomically (serialised fully before anything touches the disk)."""
    return write_text(path, json.dumps(obj, indent=indent) + "\n")


@contextlib.contextmanager
def replace_dir(path: str | os.PathLike) -> Iterator[Path]:
    """Context manager yielding a temporary folder that replaces ``path`` when the block succeeds.

    On an exception the temporary folder is removed and ``path`` is left as it was. The swap removes the
    old folder and renames the new one (two steps: a crash in between leaves no ``path`` at all, never a
    mixed or half-written one).
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = temp_path(path)
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir()
    try:
        yield tmp
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    if path.exists():
        old = path.with_name(f"{path.name}.old-{os.getpid()}")
        os.replace(path, old)
        os.replace(tmp, path)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.replace(tmp, path)


def share_identical(path: str | os.PathLike, store: str | os.PathLike) -> bool:
    """Store the content of the written file ``path`` once: when ``store`` holds a file with the same SHA-256,
    ``path`` becomes a hard link to it (swapped in atomically: a reader sees the old file or the link, both the same
    bytes); otherwise ``path`` is linked into ``store`` for the next writer. The file stays a plain file wherever it
    is read (a run folder copied or archived keeps its bytes), only the disk holds it once — for files written
    identically by many runs, as the frozen passage encoder of every query-side run (90 MB for MiniLM).

    Returns True when ``path`` now shares its storage with the store's copy; False where hard links are not
    possible (another file system, a read-only store): ``path`` is then left as written."""
    import hashlib

    path, store = Path(path), Path(store)
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    stored = store / f"{h.hexdigest()}{path.suffix}"
    try:
        store.mkdir(parents=True, exist_ok=True)
        if not stored.exists():
            os.link(path, stored)
            return True
        if os.path.samefile(stored, path):
            return True
        tmp = temp_path(path)
        os.link(stored, tmp)
        os.replace(tmp, path)
        return True
    except OSError:
        return False


def load_checkpoint(path: str | os.PathLike, map_location=None) -> dict:
    """A checkpoint file read with ``torch.load(weights_only=True)``: tensors and plain containers only, no
    code runs from the file (the one reader for Lightning checkpoints in multipos)."""
    import torch

    return torch.load(path, map_location=map_location or "cpu", weights_only=True)


def _checkpoint_io_base():
    from lightning.pytorch.plugins.io import TorchCheckpointIO

    return TorchCheckpointIO


class AtomicCheckpointIO(_checkpoint_io_base()):
    """Lightning ``CheckpointIO`` that writes every checkpoint through :func:`writer` (temp file + rename)
    and reads it back with ``weights_only=True`` (no code runs from a checkpoint file)."""

    def save_checkpoint(self, checkpoint, path, storage_options=None) -> None:
        import torch

        if storage_options is not None:
            raise TypeError("AtomicCheckpointIO takes no storage_options")
        with writer(path, "wb") as f:
            torch.save(checkpoint, f)

    def load_checkpoint(self, path, map_location=None, weights_only=None):
        """:func:`load_checkpoint` (always ``weights_only=True``, whatever Lightning asks)."""
        return load_checkpoint(path, map_location)


def read_json(path: str | Path, missing_ok: bool = False, invalid_ok: bool = False) -> object:
    """``json.loads`` of a file. Raises ValueError naming the file for invalid JSON (e.g. an interrupted write by
    a tool other than :mod:`multipos.atomic`), FileNotFoundError naming it when absent unless ``missing_ok`` (then
    None). With ``invalid_ok`` an unreadable or invalid file is None too (for caches, such as the index of
    :mod:`multipos.runs.reuse`)."""
    path = Path(path)
    if missing_ok and not path.is_file():
        return None
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as exc:  # ValueError: invalid JSON or invalid UTF-8
        if invalid_ok:
            return None
        if isinstance(exc, json.JSONDecodeError):
            raise ValueError(f"{path}: invalid JSON ({exc})") from None
        raise
