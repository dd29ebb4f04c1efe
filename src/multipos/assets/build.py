"""Build an asset folder from its downloaded source files, atomically.

Every builder writes into an empty folder; :func:`build_asset` gives it a temporary sibling of the target and
renames that into place only when the whole folder is written, so a target folder is either absent or complete.
The layouts are those of ``../shared/assets`` (BEIR: ``corpus.jsonl``, ``queries.jsonl``, ``qrels/<split>.tsv``),
and the files are byte-identical to it.
"""

from __future__ import annotations

import gzip
import json
import logging
import os
import shutil
import tarfile
import zipfile
from collections.abc import Callable
from pathlib import Path

from multipos.assets.download import fetch_source
from multipos.assets.registry import Asset, get
from multipos.assets.training_data import build_training_data
from multipos.formats.types import DataFormatError

__all__ = ["BUILDERS", "build_asset"]

log = logging.getLogger(__name__)
_QRELS_HEADER = "query-id\tcorpus-id\tscore\n"


def _beir_zip(asset: Asset, files: dict[str, Path], out: Path) -> None:
    """BEIR's ``<name>.zip`` unpacked (``<name>/`` dropped from member paths) plus any further files copied in."""
    with zipfile.ZipFile(files["zip"]) as z:
        for member in z.infolist():
            rel = Path(*Path(member.filename).parts[1:])
            if member.is_dir() or not rel.parts:
                continue
            target = out / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            with z.open(member) as src, open(target, "wb") as dst:
                shutil.copyfileobj(src, dst)
    _copy_files({k: v for k, v in files.items() if k != "zip"}, out)


def _copy_files(files: dict[str, Path], out: Path) -> None:
    for rel, path in files.items():
        (out / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(path, out / rel)


def _files(asset: Asset, files: dict[str, Path], out: Path) -> None:
    """Each source file copied to its path inside the asset (model folders)."""
    _copy_files(files, out)


def _trec_dl_subcorpus(asset: Asset, files: dict[str, Path], out: Path) -> None:
    """A TREC DL passage sub-corpus in BEIR layout.

    ``queries.jsonl``: the judged topics (ids sorted as integers); ``corpus.jsonl``: the union of the runs'
    hits (passage text of the first run, in registry order, that returned it; ids sorted as integers; empty
    title); ``qrels-official/test.tsv``: every official judgment; ``qrels/test.tsv``: those of passages in the
    corpus. Both qrels files are sorted by (query id, passage id) as integers.
    """
    topics: dict[str, str] = {}
    for line in files["topics"].read_text(encoding="utf-8").splitlines():
        qid, text = line.split("\t", 1)
        topics[qid] = text
    judgments = []
    for line in files["qrels"].read_text(encoding="utf-8").splitlines():
        qid, _, pid, grade = line.split()
        judgments.append((qid, pid, grade))
    judgments.sort(key=lambda j: (int(j[0]), int(j[1])))
    corpus: dict[str, str] = {}
    for key, path in files.items():
        if key.startswith("run:"):
            for entry in json.loads(path.read_text(encoding="utf-8")):
                for hit in entry["hits"]:
                    corpus.setdefault(str(hit["docid"]), hit["content"])
    judged = sorted({qid for qid, _, _ in judgments}, key=int)
    with open(out / "queries.jsonl", "w", encoding="utf-8") as f:
        for qid in judged:
            f.write(json.dumps({"_id": qid, "text": topics[qid]}, ensure_ascii=False) + "\n")
    with open(out / "corpus.jsonl", "w", encoding="utf-8") as f:
        for pid in sorted(corpus, key=int):
            f.write(json.dumps({"_id": pid, "title": "", "text": corpus[pid]}, ensure_ascii=False) + "\n")
    for folder, rows in (("qrels-official", judgments), ("qrels", [j for j in judgments if j[1] in corpus])):
        (out / folder).mkdir()
        with open(out / folder / "test.tsv", "w", encoding="utf-8") as f:
            f.write(_QRELS_HEADER)
            f.writelines(f"{q}\t{p}\t{g}\n" for q, p, g in rows)


def _tsv_rows(stream, where: str, fields: int, sep: str | None = "\t"):
    """(line number, fields) of a text stream of ``fields``-column lines; a malformed line names ``where`` and its
    number (:class:`multipos.formats.types.DataFormatError`)."""
    for n, line in enumerate(stream, 1):
        line = line.rstrip("\r\n")
        if not line:
            continue
        parts = line.split(sep, fields - 1) if sep else line.split()
        if len(parts) != fields:
            raise DataFormatError(f"{where}:{n}: expected {fields} {'tab-separated ' if sep else ''}fields, got "
                                  f"{len(parts)}: {line[:120]!r}")
        yield n, parts


def _msmarco_passage(asset: Asset, files: dict[str, Path], out: Path) -> None:
    """MS MARCO passage v1 in BEIR layout, streamed from ``collectionandqueries.tar.gz`` (never held in memory).

    ``corpus.jsonl`` from ``collection.tsv`` (``{"_id", "title": "", "text"}``, in collection order);
    ``queries.jsonl``: ``queries.train.tsv`` then ``queries.dev.small.tsv``; ``qrels/train.tsv`` from
    ``qrels.train.tsv`` and ``qrels/dev.tsv`` from ``qrels.dev.small.tsv`` (MS MARCO dev small, 6,980 queries: the
    set the paper and BEIR report), grade 1.
    """
    wanted = {"collection.tsv", "queries.train.tsv", "queries.dev.small.tsv", "qrels.train.tsv", "qrels.dev.small.tsv"}
    (out / "qrels").mkdir()
    seen = set()
    archive = files["collectionandqueries"]
    with tarfile.open(archive, "r|gz") as tar:  # a stream: members are read in archive order, once
        for member in tar:
            base = Path(member.name).name
            if not member.isfile() or base not in wanted:
                continue
            seen.add(base)
            stream = (line.decode("utf-8") for line in tar.extractfile(member))
            where = f"{archive}:{member.name}"
            if base == "collection.tsv":
                with open(out / "corpus.jsonl", "w", encoding="utf-8") as f:
                    for _, (pid, text) in _tsv_rows(stream, where, 2):
                        f.write(json.dumps({"_id": pid, "title": "", "text": text}, ensure_ascii=False) + "\n")
            elif base.startswith("queries."):
                with open(out / "queries.jsonl", "a", encoding="utf-8") as f:
                    for _, (qid, text) in _tsv_rows(stream, where, 2):
                        f.write(json.dumps({"_id": qid, "text": text}, ensure_ascii=False) + "\n")
            else:
                split = "train" if base == "qrels.train.tsv" else "dev"
                with open(out / "qrels" / f"{split}.tsv", "w", encoding="utf-8") as f:
                    f.write(_QRELS_HEADER)
                    f.writelines(f"{qid}\t{pid}\t{grade}\n" for _, (qid, _, pid, grade) in _tsv_rows(stream, where, 4))
    if seen != wanted:
            raise DataFormatError(f"{archive}: missing {', '.join(sorted(wanted - seen))} (MS MARCO's "
                              "collectionandqueries.tar.gz holds collection.tsv, queries.*.tsv and qrels.*.tsv)")


def _link_corpus(corpus: Path, out: Path) -> None:
    """``out/corpus.jsonl`` as a link to ``corpus``: one copy on disk. Relative where possible (the build folder is
    a sibling of the final one, so the link stays right after the rename)."""
    corpus = corpus.resolve()
    try:
        target = os.path.relpath(corpus, out.resolve())
    except ValueError:  # another drive
        target = str(corpus)
    os.symlink(target, out / "corpus.jsonl")


def _trec_dl_full(asset: Asset, files: dict[str, Path], out: Path) -> None:
    """A TREC DL passage year over the whole MS MARCO collection, in BEIR layout.

    ``queries.jsonl``: the judged topics of the year's ``msmarco-test20xx-queries.tsv.gz`` (ids sorted as integers);
    ``qrels/test.tsv``: NIST's judgments (``qid Q0 pid grade``), sorted by (query, passage) as integers;
    ``corpus.jsonl``: a link to the ``msmarco-passage`` asset's corpus.
    """
    with gzip.open(files["queries"], "rt", encoding="utf-8") as f:
        topics = {qid: text for _, (qid, text) in _tsv_rows(f, str(files["queries"]), 2)}
    with open(files["qrels"], encoding="utf-8") as f:
        judgments = sorted(((q, p, g) for _, (q, _, p, g) in _tsv_rows(f, str(files["qrels"]), 4, sep=None)),
                           key=lambda j: (int(j[0]), int(j[1])))
    judged = sorted({q for q, _, _ in judgments}, key=int)
    missing = [q for q in judged if q not in topics]
    if missing:
            raise DataFormatError(f"{files['qrels']}: judged queries {missing[:5]} are not in {files['queries']}")
    with open(out / "queries.jsonl", "w", encoding="utf-8") as f:
        f.writelines(json.dumps({"_id": q, "text": topics[q]}, ensure_ascii=False) + "\n" for q in judged)
    (out / "qrels").mkdir()
    with open(out / "qrels" / "test.tsv", "w", encoding="utf-8") as f:
        f.write(_QRELS_HEADER)
        f.writelines(f"{q}\t{p}\t{g}\n" for q, p, g in judgments)
    _link_corpus(files["asset:msmarco-passage"] / "corpus.jsonl", out)


def _dpr_nq(asset: Asset, files: dict[str, Path], out: Path) -> None:
    """DPR's NQ test folder: ``psgs_w100.tsv`` (decompressed from ``psgs_w100.tsv.gz`` as a stream) and
    ``nq-test.qa.csv`` (question, answer list), the layout :class:`multipos.evaluation.sets.QAEvalSet` reads."""
    with gzip.open(files["psgs_w100.tsv.gz"], "rb") as src, open(out / "psgs_w100.tsv", "wb") as dst:
        shutil.copyfileobj(src, dst, 1 << 20)
    shutil.copyfile(files["nq-test.qa.csv"], out / "nq-test.qa.csv")


#: builder name (``Asset.builder``) -> function(asset, {source name: downloaded file}, empty output folder)
BUILDERS: dict[str, Callable[[Asset, dict[str, Path], Path], None]] = {
    "beir_zip": _beir_zip,
    "files": _files,
    "trec_dl_subcorpus": _trec_dl_subcorpus,
    "msmarco_passage": _msmarco_passage,
    "trec_dl_full": _trec_dl_full,
    "dpr_nq": _dpr_nq,
    "multipos_training_data": build_training_data,  # its files come from the hub (multipos.assets.hub)
}


def _required(name: str, root: Path, cache: Path) -> Path:
    """The folder of required asset ``name``: in ``root`` or wherever :func:`multipos.assets.resolve_dataset` finds
    it without downloading, else built into ``root``."""
    from multipos.assets import AssetNotFoundError, resolve_dataset

    here = root / get(name).kind / name
    if here.is_dir():
        return here
    try:
        return resolve_dataset(name, download=False)
    except AssetNotFoundError:
        return build_asset(name, root, cache)


def build_asset(name: str, root: Path, cache: Path) -> Path:
    """Download the sources of asset ``name`` into ``cache`` and build ``<root>/<kind>/<name>`` from them.

    An existing target folder is returned as it is. The folder is written into a temporary sibling and renamed
    into place once complete; on any error the sibling is removed and nothing is left at the target.

    Raises:
        KeyError: ``name`` is not registered (:data:`multipos.assets.registry.REGISTRY`).
        AssetDownloadError: a source file could not be downloaded or its hash differs.
    """
    asset = get(name)
    target = root / asset.kind / name
    if target.is_dir():
        return target
    files = {f"asset:{req}": _required(req, root, cache) for req in asset.requires}
    files.update({s.name: fetch_source(s, cache) for s in asset.sources})
    tmp = target.with_name(f".{name}.building-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    try:
        BUILDERS[asset.builder](asset, files, tmp, **asset.options)
        os.replace(tmp, target)
    except OSError:
        if target.is_dir():  # another process built it first
            return target
        raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    log.info("built %s at %s from %d public files", name, target, len(files))
    return target
