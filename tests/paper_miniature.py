"""Miniatures of the paper-scale public files, in their published layouts, for offline end-to-end tests.

:func:`publish_evaluation_sets` writes, under a mirror folder laid out as ``MULTIPOS_MIRROR`` reads it, a small
version of every file the paper-scale evaluation assets are built from: MS MARCO's ``collectionandqueries.tar.gz``,
the TREC DL queries (``.tsv.gz``) and NIST qrels, DPR's ``psgs_w100.tsv.gz`` and ``nq-test.qa.csv``, and one BEIR
zip per Table 3 set (CQADupStack: one folder per forum; NFCorpus with its graded qrels files). The texts use the
words of ``tests/conftest.py``'s ``TOPICS``, so the tiny BERT fixture's vocabulary covers them. It returns the
registry's sources pinned to the miniatures' md5s, which :func:`pin` puts into the registry of this process.

A child process gets the same pins through ``python -m tests.paper_miniature PINS.json SCRIPT ARGS...``: it pins the
registry from the JSON file, then runs SCRIPT (``train.py``, ``evaluate.py``) as ``__main__`` with ARGS.
"""

from __future__ import annotations

import dataclasses
import gzip
import hashlib
import io
import json
import random
import runpy
import sys
import tarfile
import zipfile
from pathlib import Path

from multipos.assets import registry as reg
from multipos.assets.download import mirrored_url
from tests.helpers import TOPICS

PER_TOPIC = 8  # passages of each topic in the MS MARCO collection: ids topic * 8 + k


def tar_gz(members: dict[str, str]) -> bytes:
    """A ``.tar.gz`` holding ``members`` ({name: text})."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for name, text in members.items():
            data = text.encode()
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def zip_bytes(members: dict[str, str]) -> bytes:
    """A zip holding ``members`` ({name: text})."""
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as z:
        for name, text in members.items():
            z.writestr(name, text)
    return buf.getvalue()


def place(mirror: Path, url: str, data: bytes) -> Path:
    """Write ``data`` where the mirror serves ``url``; returns the file."""
    path = mirror / mirrored_url(url, "http://x").removeprefix("http://x/")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return path


def _topic_text(rng: random.Random, topic: str, n: int = 20) -> str:
    words = TOPICS[topic].split()
    return " ".join(rng.choice(words) for _ in range(n))


def msmarco_members(seed: int = 0) -> dict[str, str]:
    """The files of a miniature ``collectionandqueries.tar.gz``: 40 passages (8 a topic), 3 training queries a topic
    (ids 100+; the human positive is the topic's passage 0, 1 or 2), 1 dev-small query a topic (ids 200+)."""
    rng = random.Random(seed)
    collection, train_q, train_qrels, dev_q, dev_qrels = [], [], [], [], []
    for t, topic in enumerate(TOPICS):
        words = TOPICS[topic].split()
        for k in range(PER_TOPIC):
            collection.append(f"{t * PER_TOPIC + k}\t{_topic_text(rng, topic)}")
        for j in range(3):
            qid = 100 + t * 3 + j
            train_q.append(f"{qid}\t{words[j]} {words[j + 1]} {topic}")
            train_qrels.append(f"{qid}\t0\t{t * PER_TOPIC + j}\t1")
        dev_q.append(f"{200 + t}\t{words[3]} {topic}")
        dev_qrels.append(f"{200 + t}\t0\t{t * PER_TOPIC + 3}\t1")
    lines = "\n".join
    return {"collection.tsv": lines(collection) + "\n", "queries.train.tsv": lines(train_q) + "\n",
            "queries.dev.small.tsv": lines(dev_q) + "\n", "queries.dev.tsv": lines(dev_q) + "\n",
            "queries.eval.tsv": "999\tan eval query\n", "qrels.train.tsv": lines(train_qrels) + "\n",
            "qrels.dev.small.tsv": lines(dev_qrels) + "\n", "qrels.dev.tsv": lines(dev_qrels) + "\n"}


def _beir_set(name: str, rng: random.Random) -> dict[str, str]:
    """A BEIR folder's files for one tiny set: 2 topics × 4 passages, one test query a topic."""
    corpus, queries, qrels = [], [], ["query-id\tcorpus-id\tscore"]
    for t, topic in enumerate(rng.sample(sorted(TOPICS), 2)):
        for k in range(4):
            corpus.append(json.dumps({"_id": f"{name}-{topic}-{k}", "title": topic, "text": _topic_text(rng, topic)}))
        queries.append(json.dumps({"_id": f"{name}-q{t}", "text": f"{TOPICS[topic].split()[0]} {topic}"}))
        qrels += [f"{name}-q{t}\t{name}-{topic}-{k}\t{2 - (k > 0)}" for k in range(2)]
    return {"corpus.jsonl": "\n".join(corpus) + "\n", "queries.jsonl": "\n".join(queries) + "\n",
            "qrels/test.tsv": "\n".join(qrels) + "\n"}


def publish_evaluation_sets(mirror: Path, seed: int = 0) -> dict[str, list[dict]]:
    """Write the miniature source file of every paper-scale evaluation asset (and NFCorpus) under ``mirror``.

    Returns:
        {asset name: its sources as dicts (``dataclasses.asdict``), each pinned to its miniature's md5}: for
        :func:`pin` here, or written to a JSON file for ``python -m tests.paper_miniature``.
    """
    rng = random.Random(seed)
    files: dict[tuple[str, str], bytes] = {("msmarco-passage", "collectionandqueries"): tar_gz(msmarco_members(seed))}
    topics = [t for t in TOPICS]
    for year, first in ((2019, 300), (2020, 400)):
        queries = "".join(f"{first + t}\t{TOPICS[topic].split()[4]} {topic}\n" for t, topic in enumerate(topics))
        queries += f"{first + 90}\tan unjudged topic\n"
        qrels = "".join(f"{first + t} Q0 {t * PER_TOPIC + k} {3 - k}\n" for t in range(len(topics)) for k in range(4))
        files[f"trec-dl-{year}-full", "queries"] = gzip.compress(queries.encode())
        files[f"trec-dl-{year}-full", "qrels"] = qrels.encode()
    passages = ["id\ttext\ttitle"]
    qa = []
    for t, topic in enumerate(topics):
        for k in range(PER_TOPIC):
            passages.append(f"{t * PER_TOPIC + k + 1}\t{_topic_text(rng, topic)}\t{topic.title()}")
        qa.append(f"which {topic} word goes with {TOPICS[topic].split()[1]}\t['{TOPICS[topic].split()[0]}']")
    files["nq-dpr", "psgs_w100.tsv.gz"] = gzip.compress(("\n".join(passages) + "\n").encode())
    files["nq-dpr", "nq-test.qa.csv"] = ("\n".join(qa) + "\n").encode()
    for name in reg.BEIR_SETS:
        if name == "cqadupstack":
            members = {f"cqadupstack/{forum}/{rel}": text for forum in reg.CQADUPSTACK_FORUMS
                       for rel, text in _beir_set(forum, rng).items()}
        else:
            members = {f"{name}/{rel}": text for rel, text in _beir_set(name, rng).items()}
            if name == "nfcorpus":  # its graded qrels come as separate files (TREC format)
                test = [line.split("\t") for line in members["nfcorpus/qrels/test.tsv"].splitlines()[1:]]
                members.update({f"nfcorpus/qrels/{split}.tsv": members["nfcorpus/qrels/test.tsv"]
                                for split in ("train", "dev")})
                for s in reg.REGISTRY["nfcorpus"].sources:
                    if s.name != "zip":
                        files["nfcorpus", s.name] = "".join(f"{q} 0 {d} {g}\n" for q, d, g in test).encode()
        files[name, "zip"] = zip_bytes(members)
    pins: dict[str, list[dict]] = {}
    for (asset, key), data in files.items():
        source = next(s for s in reg.REGISTRY[asset].sources if s.name == key)
        place(mirror, source.url, data)
        if source.hash is not None:
            algo = source.hash.partition(":")[0]
            source = dataclasses.replace(source, hash=f"{algo}:{hashlib.new(algo, data).hexdigest()}")
        pins.setdefault(asset, [dataclasses.asdict(s) for s in reg.REGISTRY[asset].sources])
        pins[asset] = [dataclasses.asdict(source) if d["name"] == key else d for d in pins[asset]]
    return pins


def pin(pins: dict[str, list[dict]], setitem=None) -> None:
    """Replace the sources of the named registry entries by ``pins`` (``setitem``: e.g. ``monkeypatch.setitem``,
    so a test gets the registry back; default: plain assignment, for a child process)."""
    setitem = setitem or (lambda d, k, v: d.__setitem__(k, v))
    for name, sources in pins.items():
        entry = reg.REGISTRY[name]
        fixed = tuple(reg.Source(**{**s, "headers": tuple(tuple(h) for h in s["headers"])}) for s in sources)
        setitem(reg.REGISTRY, name, dataclasses.replace(entry, sources=fixed))


if __name__ == "__main__":  # python -m tests.paper_miniature PINS.json SCRIPT ARGS...
    pin(json.loads(Path(sys.argv[1]).read_text()))
    script = sys.argv[2]
    sys.argv = [script, *sys.argv[3:]]
    sys.path.insert(0, str(Path(script).resolve().parent))
    runpy.run_path(script, run_name="__main__")
