"""The repository stays light and its history readable: checks that CI runs with the suite (``make test``).

* Every commit after :data:`SUBJECTS_FROM` has a subject of one line of at most 72 characters (git joins a first
  paragraph of several lines into one subject, so a wrapped subject fails too). Details go in the body.
* No tracked binary file (a NUL byte in its first 8 KiB) is larger than :data:`MAX_BINARY_BYTES`, and no results
  archive (``.tar*``, ``.zip``) is tracked under ``experiments/``. Results are text (run folders under
  ``experiments/runs/``, archived studies under ``experiments/sweeps/<archive>/``, tables under
  ``experiments/results/``); a figure stays small.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
#: The last commit before the subject rule: every commit after it is checked.
SUBJECTS_FROM = "40c00d8baa137e609f9d74acca2b588287dd2beb"
MAX_SUBJECT = 72
MAX_BINARY_BYTES = 256 * 1024


def _git(*args: str, repo: Path = REPO) -> subprocess.CompletedProcess:
    return subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True)


pytestmark = pytest.mark.skipif(shutil.which("git") is None or _git("rev-parse", "HEAD").returncode != 0,
                                reason="not a git checkout")


def long_subjects(revisions: str, repo: Path = REPO) -> list[str]:
    """``<hash> (<length>): <subject>`` of each commit in ``revisions`` (a git range) of ``repo`` whose subject is
    longer than :data:`MAX_SUBJECT` characters."""
    log = _git("log", "--format=%h%x00%s", revisions, repo=repo).stdout.splitlines()
    return [f"{h} ({len(s)}): {s[:80]}..." for h, s in (line.split("\0", 1) for line in log) if len(s) > MAX_SUBJECT]


def test_new_commit_subjects_are_one_line_of_at_most_72_characters():
    known = _git("cat-file", "-e", f"{SUBJECTS_FROM}^{{commit}}").returncode == 0
    revisions = f"{SUBJECTS_FROM}..HEAD" if known else "-1"  # a shallow clone: the newest commit alone
    assert long_subjects(revisions) == [], "subject lines longer than 72 characters (put details in the body)"


def test_a_wrapped_or_long_subject_is_found_and_a_short_one_with_a_body_is_not(tmp_path):
    _git("init", "-q", repo=tmp_path)
    for message in ("Short subject\n\nA body line that is much longer than seventy-two characters, as bodies may be.",
                    "A subject wrapped\nonto a second line of the first paragraph, which git joins into one subject",
                    "x" * 73):
        _git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "--allow-empty", "-m", message,
             repo=tmp_path)
    found = long_subjects("HEAD", repo=tmp_path)
    assert len(found) == 2 and "(73)" in found[0] and "A subject wrapped onto" in found[1]


def test_no_new_binary_file_is_larger_than_the_limit():
    too_big = []
    for name in _git("ls-files", "-z").stdout.split("\0"):
        path = REPO / name
        if not name or not path.is_file():
            continue
        if name.startswith("experiments/") and (".tar" in path.name or path.suffix == ".zip"):
            too_big.append(f"{name}: an archive (export the study as text: python -m multipos.report.export)")
            continue
        with path.open("rb") as f:
            binary = b"\0" in f.read(8192)
        if binary and path.stat().st_size > MAX_BINARY_BYTES:
            too_big.append(f"{name}: {path.stat().st_size / 1024:.0f} KiB")
    assert too_big == [], f"binary files over {MAX_BINARY_BYTES // 1024} KiB: keep results as text"
