"""The DPR open-domain QA releases, read with errors that name the file and line.

Files (the DPR releases):

* ``psgs_w100.tsv`` — the DPR Wikipedia split, 21,015,324 passages of 100 words. Tab-separated with
  a header ``id<TAB>text<TAB>title``; fields are quoted the way Python's :mod:`csv` writes them
  (a field holding ``"`` is wrapped in double quotes, inner quotes doubled). Read with :func:`read_dpr_passages`.
* ``nq-test.qa.csv`` (and ``trivia-test.qa.csv``, ``curatedtrec-test.qa.csv``, …) — one question per
  line, ``question<TAB>answers``, answers a Python list literal (``['Daei', "Ali Daei"]``). Query ids
  are the 0-based line index, as in pyserini's ``dpr-nq-test`` topics. Read with :func:`read_dpr_qa`.

Answer matching and top-k accuracy over these: :mod:`multipos.evaluation.qa`.
"""

from __future__ import annotations

import ast
import csv
import logging
import os
from collections.abc import Collection, Iterator
from dataclasses import dataclass
from pathlib import Path

from multipos.formats.types import Corpus, DataFormatError, Passage, iter_jsonl

__all__ = ["DPR_PASSAGES_HEADER", "QAPair", "iter_dpr_passages", "read_dpr_passages", "read_dpr_qa"]

log = logging.getLogger(__name__)

DPR_PASSAGES_HEADER = ["id", "text", "title"]


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
    """Read DPR's Wikipedia passages (``psgs_w100.tsv``) into a :class:`multipos.formats.types.Corpus`.

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
            raise DataFormatError(f"{path}:{expected}: blank line before the last question "
                                  "(query ids are line indexes)")
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
