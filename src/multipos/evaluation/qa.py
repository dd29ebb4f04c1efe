"""Open-domain QA retrieval evaluation: top-k accuracy by answer-string match (DPR / pyserini).

A question counts as answered at depth k when any of the k highest-scored passages *contains an
answer string*; Acc@k is the fraction of questions answered. This is the retrieval metric of
Karpukhin et al., "Dense Passage Retrieval for Open-Domain Question Answering", EMNLP 2020, §5
(Table 2: Top-20 / Top-100 retrieval accuracy on NQ, TriviaQA, WebQuestions, CuratedTREC, SQuAD),
computed by DPR's ``dpr/data/qa_validation.py`` (``has_answer``) and reproduced by pyserini's
``pyserini/eval/evaluate_dpr_retrieval.py`` (``has_answers``, ``evaluate_retrieval``). This module
re-implements that procedure; it does not import either project.

Files (the DPR releases):

* ``psgs_w100.tsv`` — the DPR Wikipedia split, 21,015,324 passages of 100 words. Tab-separated with
  a header ``id<TAB>text<TAB>title``; fields are quoted the way Python's :mod:`csv` writes them
  (a field holding ``"`` is wrapped in double quotes, inner quotes doubled). Read with :func:`read_dpr_passages`.
* ``nq-test.qa.csv`` (and ``trivia-test.qa.csv``, ``curatedtrec-test.qa.csv``, …) — one question per
  line, ``question<TAB>answers``, answers a Python list literal (``['Daei', "Ali Daei"]``). Query ids
  are the 0-based line index, as in pyserini's ``dpr-nq-test`` topics. Read with :func:`read_dpr_qa`.

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
    run = read_run("run.nq-test.trec")                      # multipos.data.readers.read_run
    corpus = read_dpr_passages("psgs_w100.tsv", ids=run_passage_ids(run, depth=100))
    answer_accuracy(run, qa, corpus)                       # {"acc@20": …, "acc@100": …}
"""

from __future__ import annotations

import ast
import csv
import heapq
import logging
import math
import os
import unicodedata
from collections.abc import Collection, Iterable, Iterator
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Literal

import regex

from multipos.data.readers import Corpus, DataFormatError, Passage, Run, iter_jsonl

log = logging.getLogger(__name__)

MatchType = Literal["string", "regex"]

# DrQA / DPR SimpleTokenizer: ALPHA_NUM = [\p{L}\p{N}\p{M}]+, NON_WS = [^\p{Z}\p{C}]. The originals
# compile with IGNORECASE | UNICODE | MULTILINE; none of those changes what these two classes match
# (checked over every Unicode code point with the ``regex`` package), so they are left out.
TOKEN_RE = regex.compile(r"[\p{L}\p{N}\p{M}]+|[^\p{Z}\p{C}]")

DPR_PASSAGES_HEADER = ["id", "text", "title"]


# --------------------------------------------------------------------------------------------------
# Readers
# --------------------------------------------------------------------------------------------------


@dataclass
class QAPair:
    """One open-domain QA test question.

    Attributes:
        question: the question text, as in the file (no normalisation).
        answers: the reference answer strings (at least one, none blank). With ``match="regex"``
            (CuratedTREC) each string is a regular expression.
    """

    question: str
    answers: list[str]


def _check_file(path: Path) -> None:
    if not path.is_file():
        raise FileNotFoundError(f"{path}: file not found")


def _iter_tsv_records(path: Path) -> Iterator[tuple[int, list[str]]]:
    """Yield ``(first_line, fields)`` for each non-blank record of a tab-separated csv-quoted file.

    Streams the file. A record spanning several physical lines (a quoted field containing a line
    break, almost always an unbalanced ``"``) is rejected: neither DPR file format allows one.
    Raises DataFormatError naming file and 1-based line for csv errors and invalid UTF-8.
    """
    with path.open(encoding="utf-8", newline="") as f:
        reader = csv.reader(f, delimiter="\t")
        last = 0  # physical lines consumed so far
        while True:
            try:
                row = next(reader)
            except StopIteration:
                return
            except csv.Error as e:
                raise DataFormatError(f"{path}:{last + 1}: malformed tab-separated record ({e})") from None
            except UnicodeDecodeError as e:
                raise DataFormatError(f"{path}:{reader.line_num + 1}: not valid UTF-8 ({e.reason})") from None
            start, last = last + 1, reader.line_num
            if not row:
                continue
            if last != start or any("\n" in c or "\r" in c for c in row):
                runs_on = f"; the record runs on to line {last}" if last != start else ""
                raise DataFormatError(f"{path}:{start}: a quoted field is not closed on its line "
                                      f"(unbalanced double quote?){runs_on}")
            yield start, row


def iter_dpr_passages(path: str | os.PathLike) -> Iterator[tuple[int, Passage]]:
    """Stream DPR's ``psgs_w100.tsv``: yield ``(line_number, Passage)`` per passage, in file order.

    Format: header line ``id<TAB>text<TAB>title``, then one passage per line with exactly three
    tab-separated fields, csv-quoted as Python's :mod:`csv` writes them (a field holding ``"`` is
    wrapped in double quotes with inner quotes doubled). Fields are returned csv-decoded and otherwise
    verbatim. (DPR's ``CsvCtxSrc`` additionally strips leading/trailing ``"`` from the text; that only
    removes standalone quote tokens at the passage ends and is not done here.) Blank lines are skipped.

    Raises:
        FileNotFoundError: ``path`` does not exist.
        DataFormatError: missing/wrong header, wrong column count, empty id, malformed quoting or
            invalid UTF-8, naming the file and 1-based line. Duplicate ids are checked by
            :func:`read_dpr_passages`, not here.
    """
    path = Path(path)
    _check_file(path)
    records = _iter_tsv_records(path)
    first = next(records, None)
    if first is None:
        raise DataFormatError(f"{path}:1: empty file; expected the header 'id<TAB>text<TAB>title'")
    n, header = first
    if [h.strip() for h in header] != DPR_PASSAGES_HEADER:
        raise DataFormatError(f"{path}:{n}: missing header 'id<TAB>text<TAB>title' (got {header[:3]!r})")
    for n, row in records:
        if len(row) != 3:
            raise DataFormatError(f"{path}:{n}: expected 3 tab-separated columns (id, text, title), got {len(row)}")
        pid, text, title = row
        if not pid.strip():
            raise DataFormatError(f"{path}:{n}: field 'id' is empty")
        yield n, Passage(pid, title, text)


def read_dpr_passages(path: str | os.PathLike, ids: Collection[str] | None = None) -> Corpus:
    """Read DPR's Wikipedia passages (``psgs_w100.tsv``) into a :class:`multipos.data.readers.Corpus`.

    The file is streamed (format: see :func:`iter_dpr_passages`); each line becomes
    ``Passage(id, title, text)`` with the id kept as a string ("1" … "21015324"), in file order.

    Args:
        path: the ``.tsv`` file (uncompressed).
        ids: if given, keep only passages whose id is in this collection (pass a ``set``), e.g. the
            passages a run retrieves (:func:`run_passage_ids`). The full 21M-passage corpus needs
            tens of GB of RAM as Python objects; the top-100 passages of NQ test's 3,610 questions
            are at most 361,000. Duplicate ids are then only detected among the kept passages.

    Raises:
        FileNotFoundError: ``path`` does not exist.
        DataFormatError: as :func:`iter_dpr_passages`, plus a duplicate passage id (file and line).
    """
    corpus = Corpus()
    passages = corpus.passages
    for n, p in iter_dpr_passages(path):
        if ids is not None and p.id not in ids:
            continue
        if p.id in passages:
            raise DataFormatError(f"{path}:{n}: duplicate passage id {p.id!r}")
        passages[p.id] = p
    if ids is not None and len(passages) < len(ids):
        log.warning("%s: %d of the %d requested passage ids were not found", path, len(ids) - len(passages), len(ids))
    return corpus


def _parse_answers(value, where: str) -> list[str]:
    if not isinstance(value, list):
        raise DataFormatError(f"{where}: field 'answers' must be a list of strings, got {type(value).__name__}")
    if not value:
        raise DataFormatError(f"{where}: field 'answers' is an empty list")
    for i, a in enumerate(value):
        if not isinstance(a, str):
            raise DataFormatError(f"{where}: field 'answers'[{i}] must be a string, got {type(a).__name__}")
        if not a.strip():
            raise DataFormatError(f"{where}: field 'answers'[{i}] is blank")
    return value


def _parse_question(value, where: str) -> str:
    if not isinstance(value, str):
        raise DataFormatError(f"{where}: field 'question' must be a string, got {type(value).__name__}")
    if not value.strip():
        raise DataFormatError(f"{where}: field 'question' is empty")
    return value


def read_dpr_qa(path: str | os.PathLike) -> dict[str, QAPair]:
    """Read a DPR QA test file into {query id → :class:`QAPair`}, in file order.

    Two formats, chosen by the file name:

    * ``*.jsonl`` — one JSON object per line, ``{"id"?: str|int, "question": str, "answers": [str, …]}``;
      a missing ``id`` becomes the 0-based line index (blank lines count as lines).
    * anything else (DPR's ``*.qa.csv``) — one question per line, ``question<TAB>answers``, parsed with
      :mod:`csv` (tab delimiter) exactly as DPR's ``CsvQASrc`` does, so a question wrapped in double
      quotes is csv-decoded. ``answers`` is a Python list literal of strings, parsed with
      :func:`ast.literal_eval` (never ``eval``). The query id is the 0-based line index ("0", "1", …),
      matching pyserini's ``dpr-nq-test`` topic ids. Trailing blank lines are allowed; a blank line
      followed by more questions is an error (it would make ids ambiguous).

    Every question must be non-empty and have at least one non-blank answer.

    Raises:
        FileNotFoundError: ``path`` does not exist.
        DataFormatError: naming file, 1-based line and field — wrong column count, ``answers`` not a
            Python/JSON list of strings (or an unparsable literal), empty question, blank answer,
            duplicate id, malformed JSON, a record spanning several lines.
    """
    path = Path(path)
    _check_file(path)
    qa: dict[str, QAPair] = {}
    if path.name.endswith(".jsonl"):
        for n, obj in iter_jsonl(path):
            where = f"{path}:{n}"
            raw_id = obj.get("id", n - 1)
            if not isinstance(raw_id, (str, int)) or isinstance(raw_id, bool):
                raise DataFormatError(f"{where}: field 'id' must be a string or integer, got {type(raw_id).__name__}")
            qid = str(raw_id)
            if qid in qa:
                raise DataFormatError(f"{where}: duplicate query id {qid!r}")
            if "question" not in obj:
                raise DataFormatError(f"{where}: missing field 'question'")
            if "answers" not in obj:
                raise DataFormatError(f"{where}: missing field 'answers'")
            qa[qid] = QAPair(_parse_question(obj["question"], where), _parse_answers(obj["answers"], where))
        return qa

    expected = 1  # each question must be on the line after the previous one
    for n, row in _iter_tsv_records(path):
        where = f"{path}:{n}"
        if n != expected:
            raise DataFormatError(f"{path}:{expected}: blank line before the last question (query ids are line indexes)")
        expected = n + 1
        if len(row) != 2:
            raise DataFormatError(f"{where}: expected 2 tab-separated columns (question, answers), got {len(row)}")
        try:
            answers = ast.literal_eval(row[1].strip())
        except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError) as e:
            raise DataFormatError(f"{where}: field 'answers' is not a Python list literal ({type(e).__name__}: "
                                  f"{row[1][:80]!r})") from None
        qa[str(n - 1)] = QAPair(_parse_question(row[0], where), _parse_answers(answers, where))
    return qa


# --------------------------------------------------------------------------------------------------
# Tokenisation and matching
# --------------------------------------------------------------------------------------------------


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
        return regex.compile(unicodedata.normalize("NFD", pattern), flags=regex.IGNORECASE | regex.UNICODE | regex.MULTILINE)
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


# --------------------------------------------------------------------------------------------------
# Top-k accuracy
# --------------------------------------------------------------------------------------------------


def _check_ks(ks: Iterable[int]) -> list[int]:
    out = list(dict.fromkeys(ks))
    if not out or any(not isinstance(k, int) or isinstance(k, bool) or k < 1 for k in out):
        raise ValueError(f"ks must be a non-empty sequence of positive integers, got {ks!r}")
    return out


def top_passages(docs: dict[str, float], k: int) -> list[str]:
    """The ``k`` passage ids with the highest scores, best first.

    Ties keep the order of ``docs`` (a stable sort; for a run read with
    :func:`multipos.data.readers.read_run` that is the TREC file's line order, which is also the order
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
        run: {query id → {passage id → score}} (:data:`multipos.data.readers.Run`); higher is better.
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
