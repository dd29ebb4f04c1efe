"""Claims no stronger than their tests: every comparative sentence of README.md, docs/objectives.md and
docs/experiments.md is listed in docs/claims.yaml with the results cells it rests on, and each cell carries the
marker the sentence implies."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
CLAIMS = yaml.safe_load((REPO / "docs" / "claims.yaml").read_text(encoding="utf-8"))
#: The pages whose comparative sentences must each be a listed claim.
CHECKED_PAGES = ("README.md", "docs/objectives.md", "docs/experiments.md")
OBJECTIVE = re.compile(r"\b(singlelh|rand1lh|jointlh|summarglh|lsepair|recontriever|jointlh_weighted|infonce)\b", re.I)
COMPARATIVE = re.compile(r"\b(better|worse|best|default|second|robust|significant\w*|beats?|above|below|wins?|"
                         r"level|ahead|steeper|flatter|faster|slower)\b", re.I)
MARKERS = "+-♣♦*"


def _flat(text: str) -> str:
    return " ".join(text.split())


def _blocks(page: str) -> list[str]:
    """The page's blocks (paragraphs, list items) outside code fences and tables, each on one line."""
    text = re.sub(r"```.*?```", "", (REPO / page).read_text(encoding="utf-8"), flags=re.S)
    out = []
    for block in re.split(r"\n\s*\n", text):
        lines = [line for line in block.splitlines() if not line.lstrip().startswith("|")]
        for item in re.split(r"\n(?=\s*- )", "\n".join(lines)):
            if item.strip():
                out.append(_flat(item))
    return out


def _clauses(block: str) -> list[str]:
    """A block cut into clauses at ``. ``, ``; `` and ``? `` (outside link targets), questions left out."""
    parts = re.split(r"(?<=[.;?])\s+(?![^()]*\))", block)
    return [p for p in parts if p.strip() and not p.rstrip().endswith("?")]


def _table_cell(path: Path, row: str, column: str) -> str:
    """The cell of the Markdown table row whose first cells, joined by `` | ``, equal ``row``, in ``column``."""
    header = None
    for line in path.read_text(encoding="utf-8").splitlines():
        if not line.startswith("|"):
            header = None
            continue
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if header is None:
            header = cells
            continue
        if column in header:
            key_cells = row.split(" | ")
            if cells[:len(key_cells)] == key_cells:
                return cells[header.index(column)]
    raise AssertionError(f"{path.relative_to(REPO)}: no row {row!r} in a table with column {column!r}")


def _cell_markers(cell: str) -> str:
    """The significance markers after a cell's value (``**0.3609**+♣ ± 0.0058`` → ``+♣``; ``-0.0199*`` → ``*``)."""
    m = re.match(r"^(?:\*\*|<u>)?([+-]?[\d.]+)(?:\*\*|</u>)?([+\-♣♦*]*)", cell)
    assert m, f"no value in cell {cell!r}"
    return m.group(2)


def _text_block(path: Path, row: str) -> str:
    """The lines of a text results file under its line ``<row>:``, up to the next unindented line."""
    lines = path.read_text(encoding="utf-8").splitlines()
    start = lines.index(f"{row}:")
    end = next((i for i in range(start + 1, len(lines)) if lines[i] and not lines[i].startswith(" ")), len(lines))
    return "\n".join(lines[start + 1:end])


@pytest.mark.parametrize("claim", CLAIMS, ids=[f"{c['page']}: {c['says'][:50]}" for c in CLAIMS])
def test_each_claim_is_in_its_page_links_its_results_and_the_markers_say_so(claim):
    blocks = [b for b in _blocks(claim["page"]) if claim["says"] in b]
    assert len(blocks) == 1, f"{claim['page']}: {claim['says']!r} found in {len(blocks)} blocks"
    links = {(REPO / claim["page"]).parent.joinpath(t).resolve() for t in re.findall(r"\]\(([^)#\s]+)", blocks[0])}
    for cell in claim["rests_on"]:
        path = REPO / cell["results"]
        assert path.resolve() in links, f"{claim['page']}: the block of {claim['says']!r} links no {cell['results']}"
        text = _table_cell(path, cell["row"], cell["column"]) if "column" in cell else _text_block(path, cell["row"])
        where = f"{cell['results']} {cell['row']!r} {cell.get('column', '')}: {text[:80]!r}"
        if "contains" in cell:
            assert cell["contains"] in text, f"{where} lacks {cell['contains']!r}"
        if "marker" in cell or "no_marker" in cell:
            found = _cell_markers(text)
            assert all(m in found for m in cell.get("marker", "")), f"{where}: marker {cell['marker']!r} missing"
            assert not set(cell.get("no_marker", "")) & set(found), f"{where}: marker {found!r} contradicts the claim"


@pytest.mark.parametrize("page", CHECKED_PAGES)
def test_every_comparative_sentence_of_the_page_is_a_listed_claim(page):
    listed = [c["says"] for c in CLAIMS if c["page"] == page]
    unlisted = [clause for block in _blocks(page) for clause in _clauses(block)
                if OBJECTIVE.search(clause) and COMPARATIVE.search(re.sub(r"`[^`]*`", "", clause))
                and not any(s in clause for s in listed)]
    assert not unlisted, f"{page}: comparative sentences not in docs/claims.yaml:\n" + "\n".join(unlisted)
