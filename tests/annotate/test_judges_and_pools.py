"""Judges (a local transformers causal LM built in the test) and candidate pooling."""

from __future__ import annotations

import pytest

from multipos.annotate.cache import CallCache
from multipos.annotate.candidates import pool_candidates
from multipos.annotate.stages import parse_grade
from multipos.formats.types import Corpus, Passage


def test_a_local_transformers_judge_answers_and_is_cached(tiny_lm, tmp_path):
    from multipos.annotate.judges import TransformersJudge

    judge = TransformersJudge(str(tiny_lm), max_new_tokens=4, cache=CallCache(tmp_path))
    messages = [{"role": "user", "content": "heart cholesterol"}]
    first = judge.ask(messages, "v1")
    assert first.completion_tokens <= 4 and first.prompt_tokens > 0
    assert judge.ask(messages, "v1") == first and judge.stats.calls == 1 and judge.stats.cache_hits == 1
    judge.ask(messages, "v2")  # a new prompt version is asked anew
    assert judge.stats.calls == 2


@pytest.mark.parametrize("text, grade", [("Final score: 2", 2), ("final score = 3.", 3), ("**Final Score:** 1", 1),
                                         ("0", 0), ("I'd say 2", None), ("Final score: 5", None), ("", None)])
def test_grades_are_read_only_from_the_expected_form(text, grade):
    assert parse_grade(text) == grade


def test_pools_interleave_the_retrievers_rank_by_rank(tmp_path):
    corpus = Corpus({p: Passage(p, "", t) for p, t in
                     {"a": "heart attack risk", "b": "heart diet", "c": "sleep", "d": "heart heart heart"}.items()})
    (tmp_path / "run.trec").write_text("q Q0 c 1 9 x\nq Q0 b 2 8 x\nq Q0 zz 3 7 x\n")
    pools = pool_candidates(corpus, {"q": "heart"}, [{"kind": "bm25", "depth": 2},
                                                     {"kind": "run", "path": str(tmp_path / "run.trec"), "depth": 3}])
    bm25_top = pools["q"][0]
    assert bm25_top in ("a", "d") and pools["q"][1] == "c" and "zz" not in pools["q"]  # unknown ids dropped
    assert len(pools["q"]) == len(set(pools["q"]))
    with pytest.raises(ValueError, match=r"candidates\.retrievers\[0\]\.kind"):
        pool_candidates(corpus, {"q": "x"}, [{"kind": "splade"}])
