"""The project's error for bad input files, at the ground floor so that every layer can raise it (the checkpoint
checks of :mod:`multipos.assets` as well as the readers of :mod:`multipos.data`, which re-export it)."""

from __future__ import annotations

__all__ = ["DataFormatError"]


class DataFormatError(ValueError):
    """Malformed input file; the message names the file, line and field."""
