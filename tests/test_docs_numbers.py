"""The docs cannot go stale: every measured number a page states is in the results file it links, and the pages stay
a product (README at most 12 KB, docs/ at most 120 KB: 115 KB until the sentence-transformers page came, 100 KB
until the paper-scale page and assets came, prose lines at most 120 characters).

A *block* is a run of non-blank lines outside code fences (a paragraph, a list, a table). A number with three or
more decimals (``0.3602``, ``0.0058``) in a block must occur, as written, in one of the files under
``experiments/results/`` or ``bench/results/`` that the block links; a block that states such a number and links no
results file fails too.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
LINK = re.compile(r"\]\(([^)\s#]+)(?:#[^)\s]*)?\)")
NUMBER = re.compile(r"(?<![\w.:/])\d+\.\d{3,}(?![\d])")  # not inside an id or URL (arXiv:2602.12727)
RESULTS = ("experiments/results/", "bench/results/")


def blocks(text: str) -> list[tuple[int, list[str]]]:
    """(first line number, lines) of each block of ``text`` outside code fences."""
    out, current, start, fenced = [], [], 0, False
    for i, line in enumerate(text.splitlines(), 1):
        if line.lstrip().startswith("```"):
            fenced = not fenced
            if current:
                out.append((start, current))
            current = []
            continue
        if fenced:
            continue
        if line.strip():
            if not current:
                start = i
            current.append(line)
        elif current:
            out.append((start, current))
            current = []
    if current:
        out.append((start, current))
    return out


def unsourced_numbers(page: Path) -> list[str]:
    """``"<page>:<line>: <number> ..."`` for each number not found in the results files its block links."""
    problems = []
    for start, lines in blocks(page.read_text(encoding="utf-8")):
        text = "\n".join(lines)
        numbers = NUMBER.findall(text)
        if not numbers:
            continue
        linked = []
        for link in LINK.findall(text):
            target = (page.parent / link).resolve()
            rel = target.relative_to(REPO).as_posix() if target.is_relative_to(REPO) else ""
            if rel.startswith(RESULTS):
                linked.extend(sorted(target.rglob("*")) if target.is_dir() else [target])
        sources = "".join(p.read_text(encoding="utf-8") for p in linked if p.is_file() and p.suffix != ".png")
        where = f"{page.relative_to(REPO)}:{start}"
        if not linked:
            problems.append(f"{where}: states {numbers[:3]} but links no results file")
            continue
        problems += [f"{where}: {n} is not in {[p.name for p in linked]}" for n in numbers if n not in sources]
    return problems


def test_the_rule_catches_a_stale_number(tmp_path, monkeypatch):
    (tmp_path / "experiments" / "results").mkdir(parents=True)
    (tmp_path / "experiments" / "results" / "r.md").write_text("| jointlh | 0.3602 ± 0.0058 |\n")
    page = tmp_path / "p.md"
    page.write_text("Reaches 0.3602 ([r](experiments/results/r.md)).\n\n"
                    "Reaches 0.9999\n([r](experiments/results/r.md))."
                    "\n\nAlone 0.1234.\n```\n0.5555\n```\n")
    monkeypatch.setattr("tests.test_docs_numbers.REPO", tmp_path)
    problems = unsourced_numbers(page)
    assert len(problems) == 2
    assert "p.md:3: 0.9999 is not in ['r.md']" in problems[0] and "p.md:6: states ['0.1234']" in problems[1]


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(REPO)))
def test_every_stated_number_is_in_the_results_file_it_links(page):
    assert unsourced_numbers(page) == []


def test_pages_are_short_and_their_prose_lines_at_most_120_characters():
    assert (REPO / "README.md").stat().st_size <= 12 * 1024
    assert sum(p.stat().st_size for p in (REPO / "docs").rglob("*.md")) <= 120 * 1024
    long_lines = []
    for page in PAGES:
        fenced = False
        for i, line in enumerate(page.read_text(encoding="utf-8").splitlines(), 1):
            if line.lstrip().startswith("```"):
                fenced = not fenced
            elif not fenced and not line.lstrip().startswith("|") and len(line) > 120:
                long_lines.append(f"{page.relative_to(REPO)}:{i} ({len(line)})")
    assert long_lines == []
