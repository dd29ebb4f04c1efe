"""Build an asset folder from its downloaded source files, atomically.

Every builder writes into an empty folder; :func:`build_asset` gives it a temporary sibling of the target and
renames that into place only when the whole folder is written, so a target folder is either absent or complete.
The layouts are those of ``../shared/assets`` (BEIR: ``corpus.jsonl``, ``queries.jsonl``, ``qrels/<split>.tsv``),
and the files are byte-identical to it.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import zipfile
from collections.abc import Callable
from pathlib import Path

from multipos.assets.download import fetch_source
from multipos.assets.registry import Asset, get

__all__ = ["BUILDERS", "build_asset"]

log = logging.getLogger(__name__)


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
            f.write("query-id\tcorpus-id\tscore\n")
            f.writelines(f"{q}\t{p}\t{g}\n" for q, p, g in rows)


#: builder name (``Asset.builder``) -> function(asset, {source name: downloaded file}, empty output folder)
BUILDERS: dict[str, Callable[[Asset, dict[str, Path], Path], None]] = {
    "beir_zip": _beir_zip,
    "files": _files,
    "trec_dl_subcorpus": _trec_dl_subcorpus,
}


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
    files = {s.name: fetch_source(s, cache) for s in asset.sources}
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
