"""Open-domain QA retrieval evaluation: top-k accuracy by answer-string match (DPR / pyserini).

A question counts as answered at depth k when any of the k highest-scored passages *contains an
answer string*; Acc@k is the fraction of questions answered. This is the retrieval metric of
Karpukhin et al., "Dense Passage Retrieval for Open-Domain Question Answering", EMNLP 2020, §5
(Table 2: Top-20 / Top-100 retrieval accuracy on NQ, TriviaQA, WebQuestions, CuratedTREC, SQuAD),
computed by DPR's ``dpr/data/qa_validation.py`` (``has_answer``) and reproduced by pyserini's
``pyserini/eval/evaluate_dpr_retrieval.py`` (``has_answers``, ``evaluate_retrieval``). This module
re-implements that procedure; it does not import either project.

Files: the DPR releases (``psgs_w100.tsv``, ``nq-test.qa.csv``, …) are read by :mod:`multipos.formats.dpr`.

Answer matching (:func:`has_answer`), as DPR/pyserini do it:

1. passage text and answers are Unicode-NFD normalised (so "é" becomes "e" + U+0301);
2. both are tokenised with DrQA's ``SimpleTokenizer``: a token is a maximal run of letters, numbers
   and combining marks (``[\\p{L}\\p{N}\\p{M}]+``) or any single other character that is neither a
   separator nor a control/format character (``[^\\p{Z}\\p{C}]``) — see :func:`simple_tokenize`;
3. tokens are lower-cased; an answer matches when its token sequence occurs contiguously in the
   passage's token sequence.

Consequences worth knowing: punctuation is split off ("U.S." → ``u . s .``, so it also matches
"U. S." but not "US"); an answer never matches inside a longer token ("cat" does not match
"category"); accents are *not* stripped ("Beyoncé" does not match "Beyonce", but composed and
decomposed spellings of "Beyoncé" match each other); only the passage *text* is searched, never its
title (DPR's ``check_answer`` uses ``doc[0]``, the text; pyserini takes ``ctx['text'].split('\\n')[1]``,
dropping the title line).

Typical use::

    qa = read_dpr_qa("nq-test.qa.csv")
    run = read_run("run.nq-test.trec")                      # multipos.formats.trec.read_run
    corpus = read_dpr_passages("psgs_w100.tsv", ids=run_passage_ids(run, depth=100))
    answer_accuracy(run, qa, corpus)                       # {"acc@20": …, "acc@100": …}
"""

from __future__ import annotations

import heapq
import logging
import math
import unicodedata
from collections.abc import Iterable
from functools import lru_cache
from typing import Literal

import regex

from multipos.formats.dpr import QAPair
from multipos.formats.types import Corpus, Run

log = logging.getLogger(__name__)

MatchType = Literal["string", "regex"]


# DrQA / DPR SimpleTokenizer: ALPHA_NUM = [\p{L}\p{N}\p{M}]+, NON_WS = [^\p{Z}\p{C}]. The originals
# compile with IGNORECASE | UNICODE | MULTILINE; none of those changes what these two classes match
# (checked over every Unicode code point with the ``regex`` package), so they are left out.
TOKEN_RE = regex.compile(r"[\p{L}\p{N}\p{M}]+|[^\p{Z}\p{C}]")


def simple_tokenize(text: str) -> list[str]:
    """Tokenise like DrQA's / DPR's ``SimpleTokenizer`` (``tokenize(text).words()``); no normalisation.

    A token is a maximal run of Unicode letters, numbers and marks (``[\\p{L}\\p{N}\\p{M}]+``) or a
    single character that is neither a separator (``\\p{Z}``) nor a control/format/unassigned
    character (``\\p{C}``). So whitespace separates tokens and is dropped, every punctuation mark or
    symbol is its own token (``"U.S."`` → ``['U', '.', 'S', '.']``, ``"don't"`` → ``['don', "'", 't']``,
    ``"1,000"`` → ``['1', ',', '000']``), and format characters such as a zero-width space or soft
    hyphen split a word silently (``"foo\\u200bbar"`` → ``['foo', 'bar']``). Scripts written without
    spaces stay one token per run (``"北京"`` → ``['北京']``).

    Source: DrQA ``drqa/tokenizers/simple_tokenizer.py`` (Chen et al., ACL 2017), copied into DPR
    ``dpr/utils/tokenizers.py`` and pyserini ``evaluate_dpr_retrieval.py``.
    """
    return TOKEN_RE.findall(text)


def match_tokens(text: str) -> list[str]:
    """The tokens DPR compares: NFD-normalise, :func:`simple_tokenize`, lower-case each token.

    (DPR: ``tokenizer.tokenize(unicodedata.normalize("NFD", text)).words(uncased=True)``.)
    """
    joined = _joined(text)
    return joined[1:-1].split(" ") if joined != "  " else []


def _joined(text: str) -> str:
    """Match tokens of ``text`` joined as ``" t1 t2 … tn "`` (``"  "`` when there are none).

    No token contains a space (spaces are ``\\p{Z}``), so an answer's token sequence occurs contiguously
    in the passage's exactly when the answer's joined form is a substring of the passage's — a
    C-speed ``in`` test instead of a Python loop over positions. Lower-casing the joined string equals
    lower-casing each token: ``str.lower`` is per character except for Greek final sigma, whose
    context test stops at the separating spaces just as it stops at a token's ends.
    """
    return f" {' '.join(TOKEN_RE.findall(unicodedata.normalize('NFD', text))).lower()} "


@lru_cache(maxsize=1 << 16)
def _answer_joined(answer: str) -> str | None:
    """Cached :func:`_joined` of an answer; None when it has no tokens (never matches, see has_answer)."""
    joined = _joined(answer)
    return None if joined == "  " else joined


@lru_cache(maxsize=1 << 12)
def _compile_answer_regex(pattern: str):
    try:
        return regex.compile(unicodedata.normalize("NFD", pattern),
                             flags=regex.IGNORECASE | regex.UNICODE | regex.MULTILINE)
    except (regex.error, ValueError, TypeError, OverflowError, RecursionError) as e:  # DPR: no match
        log.warning("answer regex %r does not compile (%s); it matches no passage", pattern, e)
        return None


def _has_answer_joined(answers: Iterable[str], passage_joined: str) -> bool:
    for a in answers:
        aj = _answer_joined(a)
        if aj is not None and aj in passage_joined:
            return True
    return False


def _has_answer_regex(answers: Iterable[str], text: str) -> bool:
    text = unicodedata.normalize("NFD", text)
    for a in answers:
        pattern = _compile_answer_regex(a)
        if pattern is not None and pattern.search(text) is not None:
            return True
    return False


def has_answer(answers: Iterable[str], text: str, match: MatchType = "string") -> bool:
    """Whether passage ``text`` contains any of ``answers`` — DPR's ``has_answer``.

    ``match="string"`` (NQ, TriviaQA, WebQuestions, SQuAD): true when the :func:`match_tokens` of some
    answer occur contiguously in the :func:`match_tokens` of ``text`` — uncased, after NFD, on
    DrQA-SimpleTokenizer tokens. Examples: "ali daei" matches "… Ali  Daei scored …"; "U.S." matches
    "the U.S. team" and "U. S."; "cat" does not match "category"; "Beyoncé" does not match "Beyonce"
    (NFD keeps the combining accent, U+0301, inside the token) but matches "Beyonce\\u0301".

    ``match="regex"`` (CuratedTREC, whose answers are regular expressions): true when some answer,
    NFD-normalised and compiled case-insensitive (``IGNORECASE | UNICODE | MULTILINE``, with the
    ``regex`` package as DPR does), is found anywhere in the NFD-normalised text. An answer that does not
    compile matches nothing (as in DPR; a warning is logged once per pattern).

    Pass the passage *text* only, not its title: DPR's ``check_answer`` matches ``doc[0]`` (the text
    column of ``psgs_w100.tsv``) and pyserini's ``evaluate_retrieval`` matches
    ``ctx['text'].split('\\n')[1]`` (the index stores "title\\ntext"); :func:`answer_accuracy` does so.

    One deliberate deviation: an answer with no tokens (e.g. only punctuation-free format characters)
    never matches, whereas DPR's loop would match it vacuously against every passage.
    :func:`read_dpr_qa` already rejects blank answers.

    Answers' token forms are cached, so calling this repeatedly with the same answers is cheap; the
    text is tokenised on every call (:func:`answer_accuracy` tokenises each distinct passage once).

    Sources: Karpukhin et al., EMNLP 2020, §5; DPR ``dpr/data/qa_validation.py::has_answer``;
    pyserini ``pyserini/eval/evaluate_dpr_retrieval.py::has_answers``.
    """
    if isinstance(answers, str):
        raise TypeError("answers must be a list of strings, not a single string")
    if match == "string":
        return _has_answer_joined(answers, _joined(text))
    if match == "regex":
        return _has_answer_regex(answers, text)
    raise ValueError(f"match must be 'string' or 'regex', got {match!r}")


def _check_ks(ks: Iterable[int]) -> list[int]:
    out = list(dict.fromkeys(ks))
    if not out or any(not isinstance(k, int) or isinstance(k, bool) or k < 1 for k in out):
        raise ValueError(f"ks must be a non-empty sequence of positive integers, got {ks!r}")
    return out


def top_passages(docs: dict[str, float], k: int) -> list[str]:
    """The ``k`` passage ids with the highest scores, best first.

    Ties keep the order of ``docs`` (a stable sort; for a run read with
    :func:`multipos.formats.trec.read_run` that is the TREC file's line order, which is also the order
    pyserini's ``convert_trec_run_to_dpr_retrieval_run`` keeps). Raises ValueError on a NaN score.
    """
    if any(math.isnan(s) for s in docs.values()):
        raise ValueError("run contains a NaN score; ranking is undefined")
    # heapq.nlargest == sorted(..., reverse=True)[:k], which is stable (ties keep input order).
    return [pid for pid, _ in heapq.nlargest(k, docs.items(), key=lambda kv: kv[1])]


def run_passage_ids(run: Run, depth: int = 100) -> set[str]:
    """Ids of the passages ranked in the top ``depth`` of any query of ``run``.

    Use as ``read_dpr_passages(path, ids=run_passage_ids(run, max(ks)))`` to load only the passages
    :func:`answer_accuracy` will look at.
    """
    if depth < 1:
        raise ValueError(f"depth must be a positive integer, got {depth!r}")
    return {pid for docs in run.values() for pid in top_passages(docs, depth)}


def answer_accuracy(run: Run, qa: dict[str, QAPair], corpus: Corpus, ks: Iterable[int] = (20, 100),
                    per_query: bool = False, match: MatchType = "string"):
    """Top-k retrieval accuracy by answer-string match (DPR's "Top-k accuracy", Acc@k).

    For each question in ``qa``, its passages in ``run`` are ranked by descending score (ties: see
    :func:`top_passages`); the question scores 1.0 at ``k`` when at least one of its top ``k``
    passages' *text* :func:`has_answer` (title not searched), else 0.0. Acc@k is the mean over all
    questions of ``qa``.

    Args:
        run: {query id → {passage id → score}} (:data:`multipos.formats.types.Run`); higher is better.
            Depth beyond ``max(ks)`` is ignored.
        qa: {query id → QAPair} from :func:`read_dpr_qa`; defines the question set.
        corpus: passages by id (:func:`read_dpr_passages`); must hold every passage in the top
            ``max(ks)`` of every question of ``qa`` (deeper passages are not needed).
        ks: cut-offs, positive ints; duplicates are dropped, order kept.
        per_query: also return per-question values.
        match: ``"string"`` (token match) or ``"regex"`` (CuratedTREC), see :func:`has_answer`.

    Returns:
        ``{"acc@20": float, "acc@100": float}`` — fractions in [0, 1], not percent — in ``ks`` order;
        with ``per_query=True`` the tuple ``(means, {"acc@20": {qid: 0.0 | 1.0}, …})`` with every
        question of ``qa``, like :func:`multipos.evaluation.metrics.evaluate_run`.

    Questions of ``qa`` absent from ``run`` (or with no passages) score 0 at every k (logged). Run
    queries not in ``qa`` are ignored with a warning giving their count.

    Raises:
        ValueError: ``qa`` is empty, ``ks`` invalid, ``match`` unknown, a NaN score, or passages
            ranked in the top ``max(ks)`` are missing from ``corpus`` (message gives their count and
            examples).

    Each distinct passage is tokenised once per call and answers' tokens are cached, so NQ test
    (3,610 questions × 100 passages) takes seconds.

    Sources: Karpukhin et al., EMNLP 2020, §5 / Table 2; DPR ``qa_validation.calculate_matches``;
    pyserini ``evaluate_dpr_retrieval.evaluate_retrieval``.
    """
    ks = _check_ks(ks)
    if match not in ("string", "regex"):
        raise ValueError(f"match must be 'string' or 'regex', got {match!r}")
    if not qa:
        raise ValueError("qa is empty: no questions to evaluate")
    depth = max(ks)

    extra = [q for q in run if q not in qa]
    if extra:
        log.warning("ignoring %d run queries that are not in the QA set, e.g. %s", len(extra), extra[:3])
    ranked = {qid: top_passages(run.get(qid) or {}, depth) for qid in qa}
    missing_q = [q for q, pids in ranked.items() if not pids]
    if missing_q:
        log.warning("%d of %d questions have no retrieved passages and score 0, e.g. %s",
                    len(missing_q), len(qa), missing_q[:3])
    absent = sorted({p for pids in ranked.values() for p in pids if p not in corpus})
    if absent:
        raise ValueError(f"{len(absent)} passage ids ranked in the top {depth} are not in the corpus, "
                         f"e.g. {absent[:5]}")

    passage_cache: dict[str, str] = {}  # passage id → joined match tokens (string mode)

    def hit(pid: str, answers: list[str]) -> bool:
        text = corpus.passages[pid].text
        if match == "regex":
            return _has_answer_regex(answers, text)
        joined = passage_cache.get(pid)
        if joined is None:
            joined = passage_cache[pid] = _joined(text)
        return _has_answer_joined(answers, joined)

    per_q: dict[str, dict[str, float]] = {f"acc@{k}": {} for k in ks}
    for qid, pair in qa.items():
        first = next((i for i, pid in enumerate(ranked[qid]) if hit(pid, pair.answers)), None)
        for k in ks:
            per_q[f"acc@{k}"][qid] = 1.0 if first is not None and first < k else 0.0
    means = {name: sum(vals.values()) / len(vals) for name, vals in per_q.items()}
    return (means, per_q) if per_query else means
