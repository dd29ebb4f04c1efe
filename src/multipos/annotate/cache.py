"""Every LLM call cached on disk, so that nothing is paid for twice and a killed run asks no question again.

One SQLite file; the key is the sha256 of (backend, model, prompt version, messages, generation settings) as sorted
JSON. A row is written when its answer arrives (one transaction per call), so a run killed at any point keeps every
answer it received. Safe to use from several threads of one process.
"""

from __future__ import annotations

import hashlib
import json
import sqlite3
import threading
from dataclasses import dataclass
from pathlib import Path

__all__ = ["CallCache", "Completion", "call_key"]


@dataclass(frozen=True)
class Completion:
    """A judge's answer: its text and token counts (0 where the backend reports none)."""

    text: str
    prompt_tokens: int = 0
    completion_tokens: int = 0


def call_key(backend: str, model: str, prompt_version: str, messages: list[dict], settings: dict) -> str:
    """sha256 hex of the call's identity (module docstring)."""
    what = [backend, model, prompt_version, messages, settings]
    return hashlib.sha256(json.dumps(what, sort_keys=True, ensure_ascii=False).encode()).hexdigest()


class CallCache:
    """``get(key)`` / ``put(key, completion)`` over ``<folder>/calls.sqlite``."""

    def __init__(self, folder: str | Path):
        self.path = Path(folder).expanduser() / "calls.sqlite"
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        self._db = sqlite3.connect(self.path, check_same_thread=False)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("CREATE TABLE IF NOT EXISTS calls (key TEXT PRIMARY KEY, text TEXT, prompt_tokens INTEGER, "
                         "completion_tokens INTEGER)")
        self._db.commit()

    def get(self, key: str) -> Completion | None:
        with self._lock:
            row = self._db.execute("SELECT text, prompt_tokens, completion_tokens FROM calls WHERE key = ?",
                                   (key,)).fetchone()
        return Completion(*row) if row else None

    def put(self, key: str, completion: Completion) -> None:
        with self._lock:
            self._db.execute("INSERT OR REPLACE INTO calls VALUES (?, ?, ?, ?)",
                             (key, completion.text, completion.prompt_tokens, completion.completion_tokens))
            self._db.commit()

    def __len__(self) -> int:
        with self._lock:
            return self._db.execute("SELECT COUNT(*) FROM calls").fetchone()[0]
