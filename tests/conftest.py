"""Shared fixtures: a tiny randomly initialised BERT checkpoint and a tiny graded BEIR dataset.

Nothing is downloaded: the tokenizer vocabulary is written from the fixture texts and the model is
built from a config.
"""

from __future__ import annotations

import json
import os
import random
import tempfile
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("WANDB_MODE", "offline")
# Tests never touch the user's cache of mined negatives and embeddings.
os.environ["MULTIPOS_CACHE"] = tempfile.mkdtemp(prefix="multipos-test-cache-")

from tests.helpers import TOPICS  # noqa: E402  (after the environment above: it imports the project)


def _share_the_cores_between_workers() -> None:
    """Under pytest-xdist with N workers, each worker (and each process its tests start, through OMP_NUM_THREADS)
    gets an even share of the cores instead of one torch thread per core each, which would run N times as many
    threads as there are cores. A value the caller set wins."""
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    if workers <= 1:
        return
    from multipos.hardware import cores_per_job  # the share parallel_jobs=2 gives each of its runs

    os.environ.setdefault("OMP_NUM_THREADS", str(cores_per_job(workers)))
    import torch

    torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))


_share_the_cores_between_workers()

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(autouse=True)
def _fresh_reference_memo():
    """Each test computes its own floor rows (multipos.evaluation.runner keeps them per process, across runs)."""
    from multipos.evaluation import runner

    runner._REFERENCE_MEMO.clear()
    yield


@pytest.fixture(scope="session")
def tiny_beir(tmp_path_factory) -> Path:
    """A BEIR folder with 5 topics × 8 passages, 10 queries, graded train qrels (2 gold / 1 silver)
    in ``qrels-graded/train.s-3.qrel`` and BEIR dev/test qrels."""
    root = tmp_path_factory.mktemp("tiny_beir")
    rng = random.Random(0)
    corpus, queries, train, dev, test = [], [], [], [], []
    for t, (topic, words) in enumerate(TOPICS.items()):
        vocab = words.split()
        for k in range(8):
            text = " ".join(rng.choice(vocab) for _ in range(20))
            corpus.append({"_id": f"{topic}-{k}", "title": f"{topic} study {k}", "text": text})
        for j in range(2):
            qid = f"q-{topic}-{j}"
            queries.append({"_id": qid, "text": f"{vocab[j]} {vocab[j + 2]} {topic}"})
            split = train if j == 0 else dev if t % 2 else test
            for k in range(6):
                split.append((qid, f"{topic}-{k}", 2 if k < 2 else 1))
    with (root / "corpus.jsonl").open("w") as f:
        f.writelines(json.dumps(c) + "\n" for c in corpus)
    with (root / "queries.jsonl").open("w") as f:
        f.writelines(json.dumps(q) + "\n" for q in queries)
    (root / "qrels").mkdir()
    (root / "qrels-graded").mkdir()
    for split, rows in (("train", train), ("dev", dev), ("test", test)):
        with (root / "qrels" / f"{split}.tsv").open("w") as f:
            f.write("query-id\tcorpus-id\tscore\n")
            f.writelines(f"{q}\t{d}\t{g}\n" for q, d, g in rows)
        with (root / "qrels-graded" / f"{split}.s-3.qrel").open("w") as f:
            f.writelines(f"{q} 0 {d} {g}\n" for q, d, g in rows)
    return root


@pytest.fixture(scope="session")
def tiny_bert(tmp_path_factory) -> Path:
    """A 2-layer, 32-dim randomly initialised BERT with a WordPiece vocab covering the fixture texts."""
    from transformers import BertConfig, BertModel, BertTokenizerFast

    root = tmp_path_factory.mktemp("tiny_bert")
    words = sorted({w for ws in TOPICS.values() for w in ws.split()} | set(TOPICS) | {"study"}
                   | {str(i) for i in range(10)})
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *words]
    (root / "vocab.txt").write_text("\n".join(vocab) + "\n")
    tok = BertTokenizerFast(str(root / "vocab.txt"), do_lower_case=True)  # 1st arg: vocab (v5) / vocab_file (v4)
    tok.save_pretrained(root)
    import torch

    torch.manual_seed(0)
    config = BertConfig(vocab_size=len(vocab), hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                        intermediate_size=64, max_position_embeddings=128)
    BertModel(config).save_pretrained(root)
    return root


@pytest.fixture(scope="session")
def assets():
    """The shared assets folder; skips the test when it is absent (e.g. a machine without them)."""
    from multipos.assets import assets_dir

    path = assets_dir()
    if not (path / "data" / "nfcorpus").is_dir() or not (path / "models" / "all-MiniLM-L6-v2").is_dir():
        pytest.skip(f"shared assets not found at {path} (set MULTIPOS_ASSETS)")
    return path
