"""The snippet of docs/sentence-transformers.md runs as written, on the tiny fixtures (model, data and output folder
swapped in)."""

from __future__ import annotations

import re

from tests.helpers import REPO

PAGE = REPO / "docs" / "sentence-transformers.md"


def snippet() -> str:
    """The page's first Python code block."""
    return re.search(r"```python\n(.*?)```", PAGE.read_text(encoding="utf-8"), re.S).group(1)


def test_the_docs_snippet_trains_and_saves(tiny_bert, tiny_beir, tmp_path):
    code = snippet()
    assert len(code.splitlines()) <= 14
    for real, tiny in (('"sentence-transformers/all-MiniLM-L6-v2"', repr(str(tiny_bert))),
                       ('"nfcorpus"', repr(str(tiny_beir))), ('"outputs/', f'"{tmp_path}/')):
        assert real in code
        code = code.replace(real, tiny)
    scope: dict = {}
    exec(compile(code, str(PAGE), "exec"), scope)
    assert scope["trainer"].state.global_step >= 1
    assert (tmp_path / "st-jointlh" / "final" / "modules.json").is_file()
