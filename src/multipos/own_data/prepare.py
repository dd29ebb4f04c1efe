"""Your own data, made ready for the main job's method: splits, positive grades and text lengths, said out loud.

:func:`prepare` reads a BEIR folder (``corpus.jsonl``, ``queries.jsonl``, ``qrels/{train,dev,test}.tsv``; graded or
binary train qrels) or a Tevatron JSONL file (one query a line with ``positive_passages``) and writes a BEIR folder
the configs read as it is (:file:`conf/experiment/own_data.yaml`):

* **Splits.** A folder's own ``dev`` split picks the checkpoint; where it has none, a held-out slice of its training
  queries does (``dev_fraction``, drawn with ``seed``; said in the log and in ``prepared.json``). A Tevatron file has
  no test split: a second held-out slice (``test_fraction``) is its test set. Test sets never include a dev split.
* **Grades.** Which train grades are gold and which silver is explicit (``gold_grades``, ``silver_grades``); left
  unset, binary qrels (one positive grade) have one tier, gold, and graded qrels take their highest grade as gold and
  every other positive grade as silver. Grade 0 (and negative grades) are judged non-relevant.
* **Lengths.** Query and passage lengths are the 99th percentile of the data's token lengths under the model's
  tokenizer, capped by the model's maximum; the share of texts a length truncates is reported.

Bad input stops with the file, line and field (:mod:`multipos.formats.beir`, :mod:`multipos.formats.trec`,
:mod:`multipos.formats.tevatron`); nothing is written until everything has been read.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import random
import shutil
from dataclasses import asdict, dataclass, field
from pathlib import Path

from multipos.formats.beir import check_qrels_ids, check_query_texts, read_corpus, read_queries
from multipos.formats.tevatron import read_tevatron
from multipos.formats.trec import read_qrels
from multipos.formats.types import DataFormatError

__all__ = ["Prepared", "prepare", "positive_tiers", "length_for"]

log = logging.getLogger(__name__)


@dataclass
class Prepared:
    """What :func:`prepare` made: the BEIR folder and the settings the main job's method reads from it.

    Attributes:
        folder: the prepared BEIR folder (``qrels/train.tsv``, ``qrels/dev.tsv``, ``qrels/test.tsv``).
        source: the file or folder it was made from.
        gold_grade, silver_grade: train grades ``>= gold_grade`` are gold, ``silver_grade <= g < gold_grade`` silver
            (:class:`multipos.data.sources.BeirGradedSource`).
        regime: ``all`` (every positive, gold first): the regime that keeps every positive of either kind.
        dev: ``given`` (the folder's own dev split) or ``held out`` (a slice of its training queries).
        test: ``given`` or ``held out``.
        counts: queries per split, positive labels per tier, passages.
        query_max_length, passage_max_length: token lengths (99th percentile, capped by the model).
        truncated: share of queries / passages longer than those lengths (0-1).
        notes: what the log said about choices made for the user.
    """

    folder: Path
    source: str
    gold_grade: int
    silver_grade: int
    regime: str
    dev: str
    test: str
    counts: dict
    query_max_length: int
    passage_max_length: int
    truncated: dict
    notes: list[str] = field(default_factory=list)

    def overrides(self) -> list[str]:
        """The ``python train.py experiment=own_data`` overrides that point the main job's method at this data."""
        return [f"data_path='{self.folder}'", f"data.source.gold_grade={self.gold_grade}",
                f"data.source.silver_grade={self.silver_grade}", f"model.query_max_length={self.query_max_length}",
                f"model.passage_max_length={self.passage_max_length}",
                f"eval.passage_max_length={self.passage_max_length}"]


def positive_tiers(grades: set[int], gold_grades: list[int] | None = None,
                   silver_grades: list[int] | None = None) -> tuple[int, int, str]:
    """(gold_grade, silver_grade, explanation) for the positive grades ``grades`` (> 0) of the train qrels.

    Raises:
        ValueError: no positive grade, or ``gold_grades`` / ``silver_grades`` that are not contiguous ranges of
            grades (gold must be every grade from its lowest up, silver the grades just below gold), naming the
            setting.
    """
    if not grades:
        raise ValueError("the training qrels judge no passage with a grade above 0: no query has a positive")
    if gold_grades is None and silver_grades is None:
        if len(grades) == 1:
            g = min(grades)
            return g, g, f"binary qrels (every positive has grade {g}): one tier, gold"
        top = max(grades)
        return top, min(grades), (f"graded qrels: grade {top} is gold, grades {sorted(grades - {top})} silver "
                                  "(set --gold-grades / --silver-grades to change)")
    gold = sorted(set(gold_grades or []))
    silver = sorted(set(silver_grades or []))
    if not gold:
        raise ValueError("gold_grades: give at least one grade (every positive may be gold)")
    if gold != list(range(gold[0], max(max(grades), gold[-1]) + 1)):
        raise ValueError(f"gold_grades={gold}: gold must be every grade from its lowest up ({sorted(grades)} occur)")
    if silver and (silver != list(range(silver[0], silver[-1] + 1)) or silver[-1] != gold[0] - 1 or silver[0] < 1):
        raise ValueError(f"silver_grades={silver}: silver must be the positive grades just below gold ({gold})")
    dropped = sorted(g for g in grades if g < (silver[0] if silver else gold[0]))
    note = f"gold grades {gold}, silver grades {silver or 'none'}"
    if dropped:
        note += f"; positives with grades {dropped} are not used"
    return gold[0], silver[0] if silver else gold[0], note


def length_for(lengths: list[int], cap: int, percentile: float = 99.0) -> tuple[int, float]:
    """(max_length, share truncated): the ``percentile`` of ``lengths`` (tokens, special tokens included), at most
    ``cap``, rounded up to a multiple of 8; and the share (0-1) of texts longer than it."""
    if not lengths:
        return min(cap, 32), 0.0
    ordered = sorted(lengths)
    k = min(len(ordered) - 1, math.ceil(percentile / 100 * len(ordered)) - 1)
    length = min(cap, -(-ordered[max(k, 0)] // 8) * 8)
    return length, sum(n > length for n in lengths) / len(lengths)


def _split_off(qids: list[str], fraction: float, seed: int, what: str) -> tuple[list[str], list[str]]:
    rng = random.Random(seed)
    shuffled = sorted(qids)
    rng.shuffle(shuffled)
    n = max(1, round(fraction * len(shuffled)))
    if n >= len(shuffled):
        raise ValueError(f"{what}: {len(shuffled)} training queries are too few to hold out a {fraction:.0%} slice")
    held = set(shuffled[:n])
    return [q for q in qids if q not in held], [q for q in qids if q in held]


def _write_qrels(path: Path, qrels: dict[str, dict[str, int]], qids: list[str]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        f.write("query-id\tcorpus-id\tscore\n")
        for q in qids:
            f.writelines(f"{q}\t{p}\t{g}\n" for p, g in qrels[q].items())


def _tevatron_to_beir(path: Path, gold_positives: int) -> tuple[dict, dict, dict]:
    """(corpus {id: (title, text)}, queries {id: text}, qrels {query: {passage: grade}}) of a Tevatron file:
    positives get grade 2 where they are among the first ``gold_positives``, else 1."""
    corpus: dict[str, tuple[str, str]] = {}
    queries: dict[str, str] = {}
    qrels: dict[str, dict[str, int]] = {}
    for ex in read_tevatron(path):
        if ex.query_id in queries:
            raise DataFormatError(f"{ex.where}: duplicate query_id {ex.query_id!r}")
        queries[ex.query_id] = ex.query
        for passage in (*ex.positives, *ex.negatives):
            corpus.setdefault(passage.id, (passage.title, passage.text))
        qrels[ex.query_id] = {p.id: 2 if i < gold_positives else 1 for i, p in enumerate(ex.positives)}
    return corpus, queries, qrels


def _token_lengths(tokenizer, texts: list[str], sample: int = 5000, seed: int = 0) -> list[int]:
    if len(texts) > sample:
        texts = random.Random(seed).sample(texts, sample)
    return [len(ids) for ids in tokenizer(texts, add_special_tokens=True, truncation=False)["input_ids"]]


def prepare(path: str | os.PathLike, out_root: str | os.PathLike, tokenizer=None, *, model_max_length: int = 512,
            gold_grades: list[int] | None = None, silver_grades: list[int] | None = None, gold_positives: int = 0,
            dev_fraction: float = 0.1, test_fraction: float = 0.2, seed: int = 0) -> Prepared:
    """Read ``path`` (a BEIR folder or a Tevatron ``.jsonl`` file) and write its prepared BEIR folder under
    ``out_root`` (one folder per source and settings; an existing one is reused).

    Args:
        tokenizer: a Hugging Face tokenizer for the length statistics (None: the model defaults, 32 / 256).
        model_max_length: the model's longest input (tokens): lengths are capped by it.
        gold_grades, silver_grades: explicit positive tiers (:func:`positive_tiers`).
        gold_positives: Tevatron files only: how many leading positives of each line are gold.
        dev_fraction, test_fraction: held-out shares of the training queries where the data has no dev / test.

    Raises:
        FileNotFoundError: ``path`` is neither a BEIR folder (naming the missing files) nor a file.
        DataFormatError: bad input (file, line and field), a split naming unknown ids.
        ValueError: bad grade settings, too few queries to hold out a slice.
    """
    source = Path(path).expanduser().resolve()
    notes: list[str] = []
    if source.is_dir():
        missing = [f for f in ("corpus.jsonl", "queries.jsonl", "qrels/train.tsv") if not (source / f).is_file()]
        if missing:
            raise FileNotFoundError(f"{source}: not a BEIR folder with training qrels: missing {', '.join(missing)}")
        corpus_obj = read_corpus(source / "corpus.jsonl")
        corpus = {pid: (p.title, p.text) for pid, p in corpus_obj.passages.items()}
        queries = read_queries(source / "queries.jsonl")
        splits = {s: read_qrels(source / "qrels" / f"{s}.tsv") for s in ("train", "dev", "test")
                  if (source / "qrels" / f"{s}.tsv").is_file()}
        for split, qrels in splits.items():
            check_qrels_ids(qrels, queries, corpus_obj, str(source / "qrels" / f"{split}.tsv"))
            check_query_texts(queries, qrels, source / "queries.jsonl")
        if "test" not in splits:
            raise FileNotFoundError(f"{source}/qrels/test.tsv: no test split (the held-out queries the trained "
                                    "model is scored on); add one, or give a Tevatron file to hold one out")
        test_how = "given"
    elif source.is_file():
        corpus, queries, train = _tevatron_to_beir(source, gold_positives)
        train_ids, test_ids = _split_off(list(train), test_fraction, seed + 1, f"{source}")
        splits = {"train": {q: train[q] for q in train_ids}, "test": {q: train[q] for q in test_ids}}
        test_how = "held out"
        notes.append(f"test split: {len(test_ids)} training queries held out ({test_fraction:.0%}, seed {seed + 1})")
        notes.append("the file's negative_passages join the corpus; hard negatives are mined with BM25")
    else:
        raise FileNotFoundError(f"{source}: no such file or folder (a BEIR folder or a Tevatron .jsonl file)")

    if "dev" in splits:
        dev_how = "given"
    else:
        train_ids, dev_ids = _split_off(list(splits["train"]), dev_fraction, seed, f"{source}")
        splits["dev"] = {q: splits["train"][q] for q in dev_ids}
        splits["train"] = {q: splits["train"][q] for q in train_ids}
        dev_how = "held out"
        notes.append(f"no dev split: {len(dev_ids)} training queries held out to pick the checkpoint "
                     f"({dev_fraction:.0%}, seed {seed})")

    train_grades = {g for docs in splits["train"].values() for g in docs.values() if g > 0}
    gold_grade, silver_grade, tiers = positive_tiers(train_grades, gold_grades, silver_grades)
    notes.append(tiers)
    n_gold = sum(g >= gold_grade for docs in splits["train"].values() for g in docs.values())
    n_silver = sum(silver_grade <= g < gold_grade for docs in splits["train"].values() for g in docs.values())
    no_positive = [q for q, docs in splits["train"].items() if not any(g >= silver_grade for g in docs.values())]
    if no_positive:
        notes.append(f"{len(no_positive)} training queries have no positive and are skipped, e.g. {no_positive[:3]}")

    if tokenizer is not None:
        judged_q = sorted({q for qrels in splits.values() for q in qrels})
        q_len, q_cut = length_for(_token_lengths(tokenizer, [queries[q] for q in judged_q]), model_max_length)
        texts = [f"{t} {x}".strip() for t, x in corpus.values()]
        p_len, p_cut = length_for(_token_lengths(tokenizer, texts), model_max_length)
    else:
        (q_len, q_cut), (p_len, p_cut) = (32, float("nan")), (256, float("nan"))
    notes.append(f"lengths (99th percentile, at most {model_max_length}): queries {q_len} tokens "
                 f"(truncates {q_cut:.1%}), passages {p_len} (truncates {p_cut:.1%})")

    counts = {"passages": len(corpus), **{f"{s}_queries": len(q) for s, q in splits.items()},
              "gold_labels": n_gold, "silver_labels": n_silver}
    key = hashlib.sha1(json.dumps([str(source), source.stat().st_mtime_ns if source.is_file() else
                                   [(source / f).stat().st_mtime_ns for f in ("corpus.jsonl", "queries.jsonl")],
                                   dev_fraction, test_fraction, seed, gold_positives]).encode()).hexdigest()[:10]
    folder = Path(out_root).expanduser() / f"{source.stem if source.is_file() else source.name}-{key}"
    prepared = Prepared(folder, str(source), gold_grade, silver_grade, "all", dev_how, test_how, counts, q_len, p_len,
                        {"queries": q_cut, "passages": p_cut}, notes)
    if not (folder / "prepared.json").is_file():
        _write_folder(prepared, source, corpus, queries, splits)
    for note in notes:
        log.info("own data: %s", note)
    return prepared


def _write_folder(prepared: Prepared, source: Path, corpus: dict, queries: dict, splits: dict) -> None:
    """Write the prepared folder into a temporary sibling, then rename it into place (atomic)."""
    folder = prepared.folder
    tmp = folder.with_name(f".{folder.name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    (tmp / "qrels").mkdir(parents=True)
    try:
        if source.is_dir():
            os.symlink(source / "corpus.jsonl", tmp / "corpus.jsonl")
            os.symlink(source / "queries.jsonl", tmp / "queries.jsonl")
        else:
            with open(tmp / "corpus.jsonl", "w", encoding="utf-8") as f:
                for pid, (title, text) in corpus.items():
                    f.write(json.dumps({"_id": pid, "title": title, "text": text}, ensure_ascii=False) + "\n")
            with open(tmp / "queries.jsonl", "w", encoding="utf-8") as f:
                for qid, text in queries.items():
                    f.write(json.dumps({"_id": qid, "text": text}, ensure_ascii=False) + "\n")
        for split, qrels in splits.items():
            _write_qrels(tmp / "qrels" / f"{split}.tsv", qrels, list(qrels))
        info = {k: (str(v) if isinstance(v, Path) else v) for k, v in asdict(prepared).items()}
        (tmp / "prepared.json").write_text(json.dumps(info, indent=1, default=str) + "\n", encoding="utf-8")
        folder.parent.mkdir(parents=True, exist_ok=True)
        os.replace(tmp, folder)
    except OSError:
        if not (folder / "prepared.json").is_file():
            raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
