"""Every relative link in the README, the docs pages and the rendered results points at a file that exists, and
every ``#anchor`` at a heading of that page (GitHub's anchor rule: lower case, punctuation but ``-`` and ``_`` dropped,
spaces as ``-``)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md")),
         *sorted((REPO / "experiments" / "results").glob("*.md"))]
LINK = re.compile(r"\]\(([^)\s]+)\)")


def anchors(page: Path) -> set[str]:
    """The GitHub anchors of ``page``'s Markdown headings."""
    found = set()
    for line in page.read_text(encoding="utf-8").splitlines():
        if m := re.match(r"#+ (.*)", line):
            found.add(re.sub(r"[^\w\- ]", "", m.group(1).strip().lower()).replace(" ", "-"))
    return found


def test_anchors_follow_githubs_rule(tmp_path):
    page = tmp_path / "p.md"
    page.write_text("# Running on a GPU\n## 3. Speed against the bare step (`step_vs_bare`)\n")
    assert anchors(page) == {"running-on-a-gpu", "3-speed-against-the-bare-step-step_vs_bare"}


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(REPO)))
def test_relative_links_resolve(page):
    broken = []
    for link in LINK.findall(page.read_text(encoding="utf-8")):
        if link.startswith(("http://", "https://", "mailto:")):
            continue
        path, _, fragment = link.partition("#")
        target = (page.parent / path).resolve() if path else page
        if not target.exists():
            broken.append(f"{link}: no such file")
        elif fragment and target.suffix == ".md" and fragment not in anchors(target):
            broken.append(f"{link}: no heading with that anchor")
    assert broken == [], f"{page.relative_to(REPO)}: {broken}"
