"""``python -m multipos.assets fetch msmarco-multipos nq-multipos`` from a fake Hugging Face hub on 127.0.0.1.

The hub (:mod:`tests.assets.fake_hub`) answers what ``huggingface_hub`` asks; it serves miniatures in the published
layouts: Zhang et al.'s annotation records (``query_id``, ``passages_ids``, ``utility_score`` / ``relevance_score``,
``ranked_passage_ids`` in the ranking variant) as JSONL and as a JSON list, and Tevatron's training groups
(``query_id``, ``query``, ``positive_passages`` / ``negative_passages``) as ``.jsonl.gz`` and ``.jsonl``.
"""

from __future__ import annotations

import gzip
import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from hydra.utils import instantiate

from multipos.assets import AssetNotFoundError
from multipos.assets.__main__ import main as assets_cli
from multipos.assets.build import build_asset
from multipos.assets.download import FIRST_SEEN_FILE, AssetDownloadError
from multipos.assets.training_data import ZHANG_REPO, read_annotations
from multipos.formats.types import DataFormatError
from tests.assets.fake_hub import FakeHub
from tests.helpers import REPO, compose_cfg

MARCO_GROUPS, NQ_GROUPS = "Tevatron/msmarco-passage", "Tevatron/wikipedia-nq"


def _p(pid: str) -> dict:
    return {"docid": pid, "title": "" if pid.startswith("p") else f"title {pid}", "text": f"text of {pid}"}


def _group(qid: str, pos: list[str], neg: list[str]) -> dict:
    return {"query_id": qid, "query": f"query {qid}", "positive_passages": [_p(p) for p in pos],
            "negative_passages": [_p(n) for n in neg]}


def _jsonl(rows: list[dict]) -> bytes:
    return "".join(json.dumps(r) + "\n" for r in rows).encode()


MARCO_LABELS = [
    # the ranking variant: utility order from ranked_passage_ids (p3 before p1), then p2 in candidate order
    {"query_id": "q1", "passages_ids": ["p2", "p1", "n1", "p3", "n2"], "relevance_score": [1, 1, 1, 1, 0],
     "utility_score": [1, 1, 0, 1, 0], "ranking_score": [3, 2, 1], "ranked_passage_ids": ["p3", "n1", "p1"]},
    # no ranking: candidate order; p9's text is in no group, only in the msmarco-passage corpus
    {"query_id": 2, "passages_ids": ["n6", "p9", "n7"], "utility_score": [0, 1, 1]},
    {"query_id": "q3", "passages_ids": ["n8", "n9"], "utility_score": [0, 0]},  # no LLM positive
    {"query_id": "q5", "passages_ids": ["x1"], "utility_score": [1]},  # no Tevatron group
    {"query_id": "q6", "passages_ids": ["n10", "n11"], "relevance_score": [0, 1]},  # relevance labels only
    {"query_id": "q7", "passages_ids": ["gone"], "utility_score": [1]},  # a positive whose text is nowhere
]
MARCO_GROUP_ROWS = [
    _group("q1", ["p1"], ["n1", "p3", "n2", "p2", "n3"]),
    _group("2", ["h2"], ["n6", "n7", "n4"]),
    _group("q3", ["h3"], ["n8", "n9"]),
    _group("q4", ["h4"], ["n5"]),  # no annotation record
    _group("q6", ["h6"], ["n10", "n11", "n12"]),
    _group("q7", ["h7"], ["n13"]),
]
NQ_LABELS = [
    {"query_id": "0", "passages_ids": ["a", "b", "c", "d"], "utility_score": [1, 0, 1, 1],
     "ranked_passage_ids": ["d", "a"]},
    {"query_id": "1", "passages_ids": ["e", "f"], "utility_score": [1, 0]},
]
NQ_GROUP_ROWS = [_group("0", ["a", "h0"], ["b", "c", "d", "z"]), _group("1", ["h1"], ["e", "f", "y"])]


def _publish(hub: FakeHub, marco_labels=MARCO_LABELS, branch: str = "main") -> dict[str, str]:
    """The three repositories on the fake hub; returns their commits."""
    return {
        ZHANG_REPO: hub.publish(ZHANG_REPO, {
            "README.md": b"# Utility-focused annotation\n",
            "labels/msmarco_qwen_utility.jsonl": _jsonl(marco_labels),
            "labels/nq_qwen_utility.json": json.dumps(NQ_LABELS).encode(),  # a JSON list
        }, branch=branch),
        MARCO_GROUPS: hub.publish(MARCO_GROUPS, {
            "train.jsonl.gz": gzip.compress(_jsonl(MARCO_GROUP_ROWS), mtime=0),
            "dev.jsonl.gz": gzip.compress(_jsonl([_group("d1", ["x"], ["y"])]), mtime=0),
            "README.md": b"# msmarco-passage\n"}),
        NQ_GROUPS: hub.publish(NQ_GROUPS, {"nq-train.jsonl": _jsonl(NQ_GROUP_ROWS),
                                           "nq-dev.jsonl": _jsonl([_group("d", ["x"], ["y"])])}),
    }


@pytest.fixture
def env(tmp_path, monkeypatch):
    """Empty assets folder and download cache; the fake hub as ``HF_ENDPOINT``; hub requests allowed (the suite
    sets ``HF_HUB_OFFLINE``); MS MARCO's corpus already built (``msmarco-passage/corpus.jsonl``, one passage)."""
    import huggingface_hub.constants

    monkeypatch.setenv("MULTIPOS_ASSETS", str(tmp_path / "assets"))
    monkeypatch.setenv("MULTIPOS_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))
    monkeypatch.delenv("MULTIPOS_MIRROR", raising=False)
    monkeypatch.delenv("MULTIPOS_HUB_REVISIONS", raising=False)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    corpus = tmp_path / "assets" / "data" / "msmarco-passage"
    corpus.mkdir(parents=True)
    (corpus / "corpus.jsonl").write_text(json.dumps({"_id": "p9", "title": "", "text": "text of p9"}) + "\n")
    with FakeHub() as hub:
        monkeypatch.setenv("HF_ENDPOINT", hub.url)
        yield tmp_path, hub


def _lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def _ids(passages: list[dict]) -> list[str]:
    return [p["docid"] for p in passages]


def test_fetch_builds_both_regimes_in_utility_order(env, capsys):
    tmp, hub = env
    commits = _publish(hub)
    assert assets_cli(["fetch", "msmarco-multipos", "nq-multipos"]) == 0
    out = tmp / "assets" / "data" / "msmarco-multipos"
    assert sorted(p.name for p in out.iterdir()) == ["heterogeneous.jsonl", "homogeneous.jsonl", "prepared.json"]

    homo = {r["query_id"]: r for r in _lines(out / "homogeneous.jsonl")}
    assert list(homo) == ["q1", "2", "q6"]  # Tevatron's order; q3 (no LLM positive), q4, q7 dropped
    assert _ids(homo["q1"]["positive_passages"]) == ["p3", "p1", "p2"]
    assert _ids(homo["q1"]["negative_passages"]) == ["n1", "n2", "n3"]  # minus every LLM and human positive
    assert homo["q1"]["query"] == "query q1" and homo["q1"]["positive_passages"][0] == _p("p3")
    assert _ids(homo["2"]["positive_passages"]) == ["p9", "n7"] and _ids(homo["2"]["negative_passages"]) == ["n6", "n4"]
    assert homo["2"]["positive_passages"][0]["text"] == "text of p9"  # from msmarco-passage's corpus
    assert _ids(homo["q6"]["positive_passages"]) == ["n11"]

    hetero = {r["query_id"]: r for r in _lines(out / "heterogeneous.jsonl")}
    assert list(hetero) == ["q1", "2", "q3", "q6", "q7"]
    assert _ids(hetero["q1"]["positive_passages"]) == ["p1", "p3", "p2"]  # human first, LLM without it
    assert _ids(hetero["q3"]["positive_passages"]) == ["h3"] and _ids(hetero["q7"]["positive_passages"]) == ["h7"]
    assert _ids(hetero["q1"]["negative_passages"]) == ["n1", "n2", "n3"]

    prepared = json.loads((out / "prepared.json").read_text())
    assert "not published" in prepared["paper_dataset"]
    r = prepared["regimes"]
    assert r["homogeneous"]["queries"] == 3 and r["homogeneous"]["positives"] == 6
    assert r["homogeneous"]["llm_positives_per_query"] == 2.0
    assert r["homogeneous"]["hard_negatives_per_query"] == round((3 + 2 + 2) / 3, 3)
    assert r["homogeneous"]["dropped"] == {"no_annotation_record": 1, "no_llm_positive": 1, "no_tevatron_group": 1,
                                           "positive_text_not_found": 1}
    assert r["heterogeneous"]["queries"] == 5 and r["heterogeneous"]["human_positives_per_query"] == 1.0
    assert r["heterogeneous"]["dropped"] == {"no_annotation_record": 1, "no_tevatron_group": 1}
    assert r["heterogeneous"]["llm_positives_that_are_human"] == 1  # p1
    assert prepared["llm_positives_without_text"] == {"count": 1, "examples": ["gone"]}
    assert prepared["paper"]["compare"]["llm_positives_per_query"] == {"built": 2.0, "paper": 6.5}
    sources = {s["role"]: s for s in prepared["sources"]}
    assert sources["annotations"]["commit"] == commits[ZHANG_REPO] and sources["annotations"]["revision"] == "main"
    assert [f["path"] for f in sources["annotations"]["files"]] == ["labels/msmarco_qwen_utility.jsonl"]
    assert [f["path"] for f in sources["groups"]["files"]] == ["train.jsonl.gz"]  # not dev.jsonl.gz
    assert sources["corpus"]["found"] == 1

    nq = tmp / "assets" / "data" / "nq-multipos"
    nq_homo = {r["query_id"]: _ids(r["positive_passages"]) for r in _lines(nq / "homogeneous.jsonl")}
    assert nq_homo == {"0": ["d", "a", "c"], "1": ["e"]}
    nq_hetero = {r["query_id"]: _ids(r["positive_passages"]) for r in _lines(nq / "heterogeneous.jsonl")}
    assert nq_hetero == {"0": ["a", "h0", "d", "c"], "1": ["h1", "e"]}  # both human positives first
    nq_prepared = json.loads((nq / "prepared.json").read_text())["regimes"]["heterogeneous"]
    assert nq_prepared["queries_with_several_human_positives"] == 1

    # Every received file's sha256 is recorded under its hub key; a second fetch leaves the folders as they are.
    records = json.loads((tmp / "cache" / "downloads" / FIRST_SEEN_FILE).read_text())
    key = f"hf://datasets/{ZHANG_REPO}@main/labels/msmarco_qwen_utility.jsonl"
    assert records[key] == sources["annotations"]["files"][0]["sha256"]
    assert f"hf://datasets/{MARCO_GROUPS}@main/train.jsonl.gz" in records
    hub.requests.clear()
    assert assets_cli(["fetch", "msmarco-multipos"]) == 0 and hub.requests == []


def test_a_changed_hub_file_stops_a_later_build_naming_both_hashes(env):
    tmp, hub = env
    _publish(hub)
    first = build_asset("msmarco-multipos", tmp / "assets", tmp / "cache" / "downloads")
    old = next(s for s in json.loads((first / "prepared.json").read_text())["sources"] if s["role"] == "annotations")
    changed = [{**MARCO_LABELS[0], "utility_score": [0, 1, 0, 1, 0]}, *MARCO_LABELS[1:]]
    _publish(hub, changed)  # the same revision (main) now names another commit, with another file
    root = tmp / "elsewhere"
    with pytest.raises(AssetDownloadError) as info:
        build_asset("msmarco-multipos", root, tmp / "cache" / "downloads")
    message = str(info.value)
    assert old["files"][0]["sha256"] in message and "labels/msmarco_qwen_utility.jsonl" in message
    new_sha = message.split("has sha256 ")[1].split(",")[0]
    assert len(new_sha) == 64 and new_sha != old["files"][0]["sha256"]
    assert not (root / "data").exists() or list((root / "data").iterdir()) == []  # no half-built folder


def test_revision_flag_reads_another_branch(env):
    tmp, hub = env
    _publish(hub)
    v1 = _publish(hub, MARCO_LABELS[:2], branch="v1")[ZHANG_REPO]
    assert assets_cli(["fetch", "msmarco-multipos", "--into", str(tmp / "v1"),
                       "--revision", f"{ZHANG_REPO}=v1"]) == 0
    prepared = json.loads((tmp / "v1" / "data" / "msmarco-multipos" / "prepared.json").read_text())
    source = next(s for s in prepared["sources"] if s["role"] == "annotations")
    assert (source["revision"], source["commit"]) == ("v1", v1)
    assert prepared["annotations"]["queries"] == 2 and "MULTIPOS_HUB_REVISIONS" not in os.environ


def test_zhang_repo_is_also_found_as_a_model_repository(env):
    tmp, hub = env
    _publish(hub)
    files = dict(hub.repos.pop(("dataset", ZHANG_REPO))["main"].files)
    hub.publish(ZHANG_REPO, files, repo_type="model")
    build_asset("nq-multipos", tmp / "assets", tmp / "cache" / "downloads")
    prepared = json.loads((tmp / "assets" / "data" / "nq-multipos" / "prepared.json").read_text())
    assert next(s for s in prepared["sources"] if s["role"] == "annotations")["repo_type"] == "model"


def test_no_matching_file_names_the_patterns_and_the_files(env, capsys):
    tmp, hub = env
    _publish(hub)
    hub.publish(ZHANG_REPO, {"README.md": b"", "labels/other.jsonl": b""})
    assert assets_cli(["fetch", "msmarco-multipos"]) == 1
    err = capsys.readouterr().err
    assert "*marco*.jsonl" in err and "README.md, labels/other.jsonl" in err
    assert not (tmp / "assets" / "data" / "msmarco-multipos").exists()


@pytest.mark.parametrize("record,field", [
    ({"passages_ids": ["a"], "utility_score": [1]}, "'query_id'"),
    ({"query_id": "q", "passages_ids": ["a", "b"], "utility_score": [1]}, "'utility_score' has 1 scores for 2"),
    ({"query_id": "q", "passages_ids": ["a", "b"], "relevance_score": [1, 2]}, "'relevance_score'[1] is 2"),
    ({"query_id": "q", "passages_ids": ["a"]}, "no field 'utility_score' or 'relevance_score'"),
    ({"query_id": "q", "utility_score": [1]}, "'passages_ids'"),
])
def test_a_malformed_annotation_record_names_file_line_and_field(tmp_path, record, field):
    path = tmp_path / "msmarco.jsonl"
    path.write_text(json.dumps(MARCO_LABELS[0]) + "\n\n" + json.dumps(record) + "\n")
    with pytest.raises(DataFormatError, match=f"{path}:3: .*{field.replace('[', '.').replace(']', '.')}"):
        read_annotations([path])


def test_malformed_record_on_the_hub_stops_the_fetch(env, capsys):
    tmp, hub = env
    _publish(hub, [*MARCO_LABELS[:1], {"query_id": "q2", "passages_ids": ["a"], "utility_score": [0.5]}])
    assert assets_cli(["fetch", "msmarco-multipos"]) == 1
    err = capsys.readouterr().err
    assert "msmarco_qwen_utility.jsonl:2: query 'q2': field 'utility_score'[0] is 0.5, not 0 or 1" in err
    assert not (tmp / "assets" / "data" / "msmarco-multipos").exists()


def test_labels_files_and_merged_ranking(tmp_path):
    """Label lines (``qid<TAB>pid,pid``, Zhang et al.'s training input) and a ranking in a second file are read; two
    files that disagree on a query's labels stop, naming both places."""
    tsv = tmp_path / "msmarco_utility.tsv"
    tsv.write_text("q1\tb,a\nq2\tc\n")
    assert read_annotations([tsv]).positives == {"q1": ("b", "a"), "q2": ("c",)}
    scores, ranking = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    scores.write_text(json.dumps({"query_id": "q", "passages_ids": ["a", "b", "c"], "utility_score": [1, 1, 1]}))
    ranking.write_text(json.dumps({"query_id": "q", "passages_ids": ["a", "b", "c"], "utility_score": [1, 1, 1],
                                   "ranked_passage_ids": ["c", "a"]}))
    assert read_annotations([scores, ranking]).positives == {"q": ("c", "a", "b")}
    other = tmp_path / "c.jsonl"
    other.write_text(json.dumps({"query_id": "q", "passages_ids": ["a", "b"], "utility_score": [0, 1]}))
    with pytest.raises(DataFormatError, match=f"{other}:1: query 'q': .* differ from those read at {scores}:1"):
        read_annotations([scores, other])


def test_tevatron_source_reads_the_asset_path(env):
    tmp, hub = env
    _publish(hub)
    assets_cli(["fetch", "msmarco-multipos"])
    hub.requests.clear()
    cfg = compose_cfg("train", ["experiment=base", "data=msmarco_hetero"])
    assert cfg.data.source.path == "msmarco-multipos/heterogeneous.jsonl" and cfg.stages.main.regime == "heterogeneous"
    corpus, queries = instantiate(cfg.data.source).load()
    by_id = {q.query_id: q for q in queries}
    assert (by_id["q1"].gold, by_id["q1"].silver) == (["p1"], ["p3", "p2"])
    assert by_id["q1"].negatives == ["n1", "n2", "n3"] and by_id["q3"].silver == []
    cfg = compose_cfg("train", ["experiment=base", "data=msmarco_homo", "regime=homogeneous"])
    _, queries = instantiate(cfg.data.source).load()
    assert [(q.gold, q.silver) for q in queries][0] == ([], ["p3", "p1", "p2"])
    assert hub.requests == []  # read from the assets folder
    for data in ("msmarco", "nq_hetero", "nq_homo"):
        assert compose_cfg("train", ["experiment=base", f"data={data}"]).data.source.path.endswith(".jsonl")


def test_a_missing_asset_file_names_what_it_holds(env):
    tmp, hub = env
    folder = tmp / "assets" / "data" / "msmarco-multipos"
    folder.mkdir(parents=True)
    (folder / "prepared.json").write_text("{}")
    cfg = compose_cfg("train", ["experiment=base", "data=msmarco_hetero"])
    with pytest.raises(AssetNotFoundError, match=r"holds \['prepared.json'\]\. Build it .*fetch msmarco-multipos"):
        instantiate(cfg.data.source).load()


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_train_offline_stops_with_one_paragraph(tmp_path, tiny_bert):
    """No network: ``train.py`` stops in one paragraph (the asset, the fetch command, the file and its schema), with
    exit status 1 and no traceback."""
    port = _closed_port()
    env = {k: v for k, v in os.environ.items() if k not in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")}
    env.update(MULTIPOS_ASSETS=str(tmp_path / "assets"), MULTIPOS_CACHE=str(tmp_path / "cache"),
               MULTIPOS_MIRROR=f"http://127.0.0.1:{port}", HF_ENDPOINT=f"http://127.0.0.1:{port}",
               MULTIPOS_DOWNLOAD_RETRIES="0", HF_HOME=str(tmp_path / "hf-home"), PYTHONUNBUFFERED="1")
    run = subprocess.run([sys.executable, "train.py", "experiment=base", "loss=jointlh", "data=msmarco_hetero",
                          f"model.name_or_path={tiny_bert}", f"hydra.run.dir={tmp_path / 'run'}"],
                         cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 1, run.stderr[-3000:]
    assert "Traceback" not in run.stderr, run.stderr[-3000:]
    paragraph = next(p for p in run.stderr.split("\n\n") if "msmarco-multipos" in p)
    assert "\n" not in paragraph.strip()
    for needed in ("python -m multipos.assets fetch msmarco-multipos", "heterogeneous.jsonl", '"positive_passages"',
                   f"127.0.0.1:{port}"):
        assert needed in paragraph, paragraph


def test_parquet_groups_and_the_list_command(tmp_path, capsys):
    """Tevatron files converted to parquet are read as a stream too; ``list`` names the hub repositories."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from multipos.assets.training_data import iter_records

    path = tmp_path / "train-00000-of-00001.parquet"
    pq.write_table(pa.Table.from_pylist(MARCO_GROUP_ROWS), path)
    rows = list(iter_records(path))
    assert [w for w, _ in rows][:2] == [f"{path} row 1", f"{path} row 2"]
    assert rows[0][1]["positive_passages"] == [_p("p1")]
    assert assets_cli(["list"]) == 0
    assert f"hub {ZHANG_REPO}@main (annotations): *marco*.jsonl" in capsys.readouterr().out
