"""The paper-scale assets built from miniatures in their published layouts, served on 127.0.0.1 as a mirror.

Each miniature is made here in the exact layout of its public file: MS MARCO's ``collectionandqueries.tar.gz``
(tab-separated ``collection.tsv``, ``queries.*.tsv``, ``qrels.*.tsv``), the TREC DL ``msmarco-test20xx-queries.tsv.gz``
and NIST qrels (``qid Q0 pid grade``), DPR's ``psgs_w100.tsv.gz`` and ``nq-test.qa.csv``, and BEIR zips (one folder
per set; CQADupStack one per forum). The registered md5s (ir_datasets' list) are replaced by the miniatures' own.
"""

from __future__ import annotations

import dataclasses
import gzip
import hashlib
import importlib.util
import json
from pathlib import Path

import pytest

from multipos.assets import AssetNotFoundError, resolve_dataset, resolve_files
from multipos.assets import registry as reg
from multipos.assets.__main__ import main as assets_cli
from multipos.assets.download import FIRST_SEEN_FILE, AssetDownloadError
from multipos.evaluation.runner import Evaluation
from multipos.evaluation.sets import EvalSet, QAEvalSet, beir_sets
from multipos.formats.beir import load_beir
from multipos.formats.types import DataFormatError
from tests.assets.http_mirror import LocalServers, RangeHandler
from tests.paper_miniature import place, tar_gz, zip_bytes

PAPER_SCALE = ("msmarco-passage", "trec-dl-2019-full", "trec-dl-2020-full", "nq-dpr", *reg.BEIR_SETS)


@pytest.fixture
def env(tmp_path, monkeypatch):
    """Empty assets folder, download cache and mirror folder; one try per download; the mirror served."""
    monkeypatch.setenv("MULTIPOS_ASSETS", str(tmp_path / "assets"))
    monkeypatch.setenv("MULTIPOS_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("MULTIPOS_DOWNLOAD_RETRIES", "0")
    (tmp_path / "mirror").mkdir()
    with LocalServers() as start:
        monkeypatch.setenv("MULTIPOS_MIRROR", start(tmp_path / "mirror"))
        yield tmp_path


def _publish(env: Path, monkeypatch, asset: str, key: str, data: bytes) -> Path:
    """Put ``data`` on the mirror at the URL of source ``key`` of ``asset`` and pin that source to its md5."""
    entry = reg.REGISTRY[asset]
    source = next(s for s in entry.sources if s.name == key)
    path = place(env / "mirror", source.url, data)
    if source.hash is not None:
        pinned = dataclasses.replace(source, hash=f"md5:{hashlib.md5(data).hexdigest()}")
        sources = tuple(pinned if s.name == key else s for s in entry.sources)
        monkeypatch.setitem(reg.REGISTRY, asset, dataclasses.replace(entry, sources=sources))
    return path


MSMARCO = {
    "collection.tsv": "0\tThe presence of communication amid scientific minds\n1\tManhattan Project results\n"
                      "2\tCaffeine raises blood pressure\n3\tStatins lower LDL\n",
    "queries.train.tsv": "121352\tdefine extreme\n634306\twhat does chattel mean\n",
    "queries.dev.small.tsv": "1048585\twhat is paula deen's brother\n",
    "queries.dev.tsv": "1048585\twhat is paula deen's brother\n9\tunused dev query\n",
    "queries.eval.tsv": "7\tan eval query\n",
    "qrels.train.tsv": "121352\t0\t2\t1\n634306\t0\t1\t1\n",
    "qrels.dev.small.tsv": "1048585\t0\t3\t1\n",
    "qrels.dev.tsv": "1048585\t0\t3\t1\n",
}


def _publish_msmarco(env, monkeypatch, members=MSMARCO):
    _publish(env, monkeypatch, "msmarco-passage", "collectionandqueries", tar_gz(members))


def _publish_dl(env, monkeypatch, year: int):
    topics = "1048585\twhat is paula deen's brother\n121352\tdefine extreme\n5\tan unjudged topic\n"
    _publish(env, monkeypatch, f"trec-dl-{year}-full", "queries", gzip.compress(topics.encode()))
    _publish(env, monkeypatch, f"trec-dl-{year}-full", "qrels",
             b"121352 Q0 2 3\n1048585 Q0 3 2\n1048585 Q0 0 0\n121352 Q0 10 1\n")


def test_paper_scale_sources_are_ir_datasets_own_urls_and_md5s_with_licences():
    spec = importlib.util.find_spec("ir_datasets")
    listed = json.loads((Path(next(iter(spec.submodule_search_locations))) / "etc" / "downloads.json").read_text())
    everything = {e["url"]: e["expected_md5"] for group in listed.values() for e in group.values()
                  if isinstance(e, dict) and "url" in e}
    for name in PAPER_SCALE:
        for s in reg.REGISTRY[name].sources:
            assert s.licence and s.url.startswith("https://"), (name, s)
            if s.hash is None:  # DPR's nq-test.qa.csv: no published hash (recorded on first download)
                assert (name, s.name) == ("nq-dpr", "nq-test.qa.csv")
                continue
            if s.hash.startswith("sha256:"):  # NFCorpus' graded qrels: GitHub files pinned against ../shared/mirror
                continue
            assert s.hash == f"md5:{everything[s.url]}" and s.size, (name, s.url)
    assert reg.REGISTRY["msmarco-passage"].sources[0].headers == (("X-Ms-Version", "2019-12-12"),)


def test_list_shows_every_paper_scale_asset_with_its_size(capsys):
    assert assets_cli(["list"]) == 0
    out = capsys.readouterr().out
    for name in PAPER_SCALE:
        assert f"data/{name}:" in out
    assert "1,057,717,952 bytes" in out  # collectionandqueries.tar.gz


def test_msmarco_passage_streams_the_tarball_into_a_beir_folder(env, monkeypatch):
    _publish_msmarco(env, monkeypatch)
    RangeHandler.headers_seen.clear()
    assert assets_cli(["fetch", "msmarco-passage"]) == 0
    folder = env / "assets" / "data" / "msmarco-passage"
    corpus = [json.loads(x) for x in (folder / "corpus.jsonl").read_text().splitlines()]
    assert [c["_id"] for c in corpus] == ["0", "1", "2", "3"] and corpus[2] == \
        {"_id": "2", "title": "", "text": "Caffeine raises blood pressure"}
    queries = [json.loads(x)["_id"] for x in (folder / "queries.jsonl").read_text().splitlines()]
    assert queries == ["121352", "634306", "1048585"]  # train, then dev small; not the full dev or eval queries
    assert (folder / "qrels" / "dev.tsv").read_text() == "query-id\tcorpus-id\tscore\n1048585\t3\t1\n"
    assert (folder / "qrels" / "train.tsv").read_text().splitlines()[1:] == ["121352\t2\t1", "634306\t1\t1"]
    data = load_beir(folder, "dev")
    assert set(data.queries) == {"1048585"} and len(data.corpus) == 4
    sent = [h for path, h in RangeHandler.headers_seen if path.endswith("collectionandqueries.tar.gz")]
    assert sent and all(h.get("X-Ms-Version") == "2019-12-12" for h in sent)


def test_trec_dl_full_years_share_the_collection_and_keep_the_judged_topics(env, monkeypatch):
    _publish_msmarco(env, monkeypatch)
    for year in (2019, 2020):
        _publish_dl(env, monkeypatch, year)
    assert assets_cli(["fetch", "trec-dl-2019-full", "trec-dl-2020-full"]) == 0
    data_dir = env / "assets" / "data"
    for year in (2019, 2020):
        folder = data_dir / f"trec-dl-{year}-full"
        assert (folder / "corpus.jsonl").is_symlink()
        assert (folder / "corpus.jsonl").resolve() == (data_dir / "msmarco-passage" / "corpus.jsonl").resolve()
        assert (folder / "qrels" / "test.tsv").read_text().splitlines() == [
            "query-id\tcorpus-id\tscore", "121352\t2\t3", "121352\t10\t1", "1048585\t0\t0", "1048585\t3\t2"]
        assert [json.loads(x)["_id"] for x in (folder / "queries.jsonl").read_text().splitlines()] == \
            ["121352", "1048585"]
    # the eval set of conf/benchmark/trec_dl19_full.yaml reads it (qrels of passages outside the corpus are
    # refused by load_beir: the miniature collection lacks passage 10, so the check is on a clean copy)
    (data_dir / "trec-dl-2019-full" / "qrels" / "test.tsv").write_text(
        "query-id\tcorpus-id\tscore\n121352\t2\t3\n1048585\t3\t2\n")
    data = EvalSet(name="trec_dl19_full", path="trec-dl-2019-full", relevance_threshold=2).load()
    assert set(data.queries) == {"121352", "1048585"} and len(data.corpus) == 4


def test_nq_dpr_decompresses_the_passages_and_records_the_unpinned_questions_hash(env, monkeypatch):
    passages = "id\ttext\ttitle\n1\tAaron is a prophet in the Bible\tAaron\n2\tParis is the capital of France\tParis\n"
    _publish(env, monkeypatch, "nq-dpr", "psgs_w100.tsv.gz", gzip.compress(passages.encode()))
    qa = _publish(env, monkeypatch, "nq-dpr", "nq-test.qa.csv",
                  b"who is the brother of moses\t['Aaron']\ncapital of france\t['Paris']\n")
    folder = resolve_files("nq-dpr", ["psgs_w100.tsv", "nq-test.qa.csv"])
    assert folder == env / "cache" / "assets" / "data" / "nq-dpr"
    assert (folder / "psgs_w100.tsv").read_text() == passages
    data = QAEvalSet(name="nq_test", path="nq-dpr").load()
    assert len(data.corpus) == 2 and sorted(data.answers.values()) == [["Aaron"], ["Paris"]]
    record = json.loads((env / "cache" / "downloads" / FIRST_SEEN_FILE).read_text())
    url = next(s.url for s in reg.REGISTRY["nq-dpr"].sources if s.name == "nq-test.qa.csv")
    assert record == {url: hashlib.sha256(qa.read_bytes()).hexdigest()}
    # The file changes at its source: a new build (cache and folder gone) stops with both hashes, builds nothing.
    import shutil

    shutil.rmtree(env / "cache" / "assets")
    for p in (env / "cache" / "downloads").iterdir():
        if p.is_dir():
            shutil.rmtree(p)
    old = record[url]
    qa.write_bytes(b"who is the brother of moses\t['Aaron', 'Hur']\n")
    with pytest.raises(AssetNotFoundError) as err:
        resolve_files("nq-dpr", ["psgs_w100.tsv", "nq-test.qa.csv"])
    assert old in str(err.value) and hashlib.sha256(qa.read_bytes()).hexdigest() in str(err.value)
    assert not (env / "cache" / "assets" / "data" / "nq-dpr").exists()


def test_cqadupstack_is_twelve_forums_reported_as_one_mean_column(env, monkeypatch):
    forums = {f"cqadupstack/{forum}/{rel}": text for forum in reg.CQADUPSTACK_FORUMS for rel, text in (
        ("corpus.jsonl", json.dumps({"_id": "d1", "title": "", "text": f"{forum} answer"}) + "\n"),
        ("queries.jsonl", json.dumps({"_id": "q1", "text": f"{forum} question"}) + "\n"),
        ("qrels/test.tsv", "query-id\tcorpus-id\tscore\nq1\td1\t1\n"))}
    _publish(env, monkeypatch, "cqadupstack", "zip", zip_bytes(forums))
    assert resolve_dataset("cqadupstack/gis") == env / "cache" / "assets" / "data" / "cqadupstack" / "gis"
    assert len(load_beir(resolve_dataset("cqadupstack/tex"), "test").corpus) == 1
    with pytest.raises(AssetNotFoundError, match="cqadupstack/nosuchforum.*android"):
        resolve_dataset("cqadupstack/nosuchforum")

    sets = beir_sets(["scifact", "cqadupstack"], metrics=["ndcg@10"])
    assert list(sets) == ["scifact", *(f"cqadupstack-{f}" for f in reg.CQADUPSTACK_FORUMS)]
    assert sets["cqadupstack-gis"]["path"] == "cqadupstack/gis" and sets["cqadupstack-gis"]["group"] == "cqadupstack"
    evaluation = Evaluation(validation=None, test_sets=[EvalSet(**{k: v for k, v in kw.items() if k != "_target_"})
                                                        for kw in sets.values()], retrieval={}, average="beir_average")
    results = {"scifact": {"ndcg@10": 0.6}}
    results.update({f"cqadupstack-{f}": {"ndcg@10": 0.1 + 0.01 * i} for i, f in enumerate(reg.CQADUPSTACK_FORUMS)})
    evaluation.write(env / "out", results)
    cqa = sum(0.1 + 0.01 * i for i in range(12)) / 12
    assert results["cqadupstack"]["ndcg@10"] == pytest.approx(cqa)
    assert results["beir_average"]["ndcg@10"] == pytest.approx((0.6 + cqa) / 2)  # the forums count once, as one set
    assert json.loads((env / "out" / "metrics.json").read_text())["cqadupstack"]["ndcg@10"] == pytest.approx(cqa)


def test_paper_out_of_domain_eval_lists_the_fourteen_sets_with_cqadupstack_as_one():
    from tests.helpers import compose_cfg

    cfg = compose_cfg("train", ["experiment=base", "scale=paper", "eval=paper_out_of_domain"])
    names = list(cfg.eval.test_sets)
    groups = {s.get("group") for s in cfg.eval.test_sets.values()}
    assert len([n for n in names if not n.startswith("cqadupstack-")]) == 13 and groups == {None, "cqadupstack"}
    assert {n for n in names if not n.startswith("cqadupstack-")} | {"cqadupstack"} == set(reg.BEIR_SETS)
    cfg = compose_cfg("train", ["experiment=base", "scale=paper"])
    assert {s.path for s in cfg.eval.test_sets.values()} == {"msmarco-passage", "trec-dl-2019-full",
                                                             "trec-dl-2020-full"}


def test_a_wrong_checksum_names_the_url_and_both_hashes_and_builds_nothing(env, monkeypatch):
    _publish_msmarco(env, monkeypatch)
    tarball = next((env / "mirror").rglob("collectionandqueries.tar.gz"))
    tarball.write_bytes(tar_gz({**MSMARCO, "collection.tsv": "0\tanother text\n"}))
    assert assets_cli(["fetch", "msmarco-passage"]) == 1
    with pytest.raises(AssetNotFoundError) as err:
        resolve_dataset("msmarco-passage")
    message = str(err.value)
    assert "/msmarco.z22.web.core.windows.net/msmarcoranking/collectionandqueries.tar.gz" in message
    assert reg.REGISTRY["msmarco-passage"].sources[0].hash.removeprefix("md5:") in message
    assert hashlib.md5(tarball.read_bytes()).hexdigest() in message
    assert not (env / "assets" / "data" / "msmarco-passage").exists()
    assert not any(p.name.startswith(".msmarco-passage") for p in (env / "cache").rglob("*"))


def test_a_malformed_line_names_the_archive_member_and_line_and_leaves_nothing(env, monkeypatch):
    _publish_msmarco(env, monkeypatch, {**MSMARCO, "qrels.train.tsv": "121352\t0\t2\t1\n634306 0 1 1\n"})
    with pytest.raises(DataFormatError, match=r"collectionandqueries\.tar\.gz:qrels\.train\.tsv:2: expected 4"):
        resolve_dataset("msmarco-passage")
    assert not (env / "cache" / "assets" / "data" / "msmarco-passage").exists()
    assert not list((env / "cache" / "assets" / "data").iterdir())
    with pytest.raises(AssetDownloadError):  # the other paper-scale files are not on this mirror
        from multipos.assets.download import fetch_source

        fetch_source(reg.REGISTRY["fiqa"].sources[0], env / "cache" / "downloads")


def test_paper_scale_data_follows_the_regime():
    from tests.helpers import compose_cfg

    for study, path, gold in (("table2_homogeneous", "homogeneous.jsonl", 0),
                              ("table4_heterogeneous", "heterogeneous.jsonl", 1),
                              ("table5_curriculum", "heterogeneous.jsonl", 1)):
        source = compose_cfg("train", [f"experiment={study}", "scale=paper"]).data.source
        assert (source.path, source.gold_positives) == (f"msmarco-multipos/{path}", gold), study
