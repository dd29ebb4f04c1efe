"""Every registered asset built from its public files, served on 127.0.0.1, equals ../shared/assets byte for byte.

The server serves a mirror laid out as ``../shared/mirror`` (``MULTIPOS_MIRROR``): the mirrored GitHub files
themselves, plus the two kinds of file the shared mirror lacks, made here from the assets' own files: BEIR's
``nfcorpus.zip`` (a zip of the assets' NFCorpus files, its registered md5 replaced by the test zip's) and the hub
files of all-MiniLM-L6-v2 (the registered hashes are those of the assets' files, so they are checked as they are).
"""

from __future__ import annotations

import dataclasses
import hashlib
import socket
import zipfile
from pathlib import Path

import pytest

from multipos.assets import AssetNotFoundError, assets_dir, resolve_dataset, resolve_model
from multipos.assets import registry as reg
from multipos.assets.__main__ import main as assets_cli
from multipos.assets.download import AssetDownloadError, fetch_source, mirrored_url
from multipos.assets.registry import REGISTRY, Source
from tests.assets.http_mirror import LocalServers, RangeHandler

SHARED_MIRROR = Path(__file__).resolve().parents[3] / "shared" / "mirror"
SHARED_ASSETS = assets_dir()  # as the suite was started (the fixtures below point MULTIPOS_ASSETS elsewhere)
DEFAULT_ASSETS = ("nfcorpus", "trec-dl-2019", "trec-dl-2020", "all-MiniLM-L6-v2")


@pytest.fixture
def serve():
    """serve(folder) -> base URL of an HTTP server on 127.0.0.1 for ``folder`` (stopped after the test)."""
    with LocalServers() as start:
        yield start


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _tree(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): _sha256(p) for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.fixture
def env(tmp_path, monkeypatch):
    """Empty assets folder and download cache, one try per download."""
    monkeypatch.setenv("MULTIPOS_ASSETS", str(tmp_path / "assets"))
    monkeypatch.setenv("MULTIPOS_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("MULTIPOS_DOWNLOAD_RETRIES", "0")
    return tmp_path


def test_mirrored_url_layout():
    gh = "https://raw.githubusercontent.com/castorini/anserini-tools/5b81/topics/t.txt"
    assert mirrored_url(gh, "http://m:1/") == "http://m:1/github/castorini/anserini-tools/5b81/topics/t.txt"
    assert mirrored_url("https://huggingface.co/a/b/resolve/main/x.json", "http://m") == \
        "http://m/huggingface.co/a/b/resolve/main/x.json"
    assert mirrored_url(gh, "") == gh


def test_every_asset_has_public_sources_with_hashes_and_licences():
    for name in DEFAULT_ASSETS:
        asset = REGISTRY[name]
        assert asset.sources and asset.kind in ("data", "models")
        for s in asset.sources:
            assert s.url.startswith("https://") and s.licence and s.hash, (name, s)
            algo, _, digest = s.hash.partition(":")
            assert algo in ("sha256", "md5") and len(digest) == {"sha256": 64, "md5": 32}[algo]


@pytest.mark.assets
def test_default_assets_built_from_mirror_equal_the_shared_assets(env, serve, monkeypatch):
    shared = SHARED_ASSETS
    if not (shared / "data" / "nfcorpus").is_dir() or not SHARED_MIRROR.is_dir():
        pytest.skip("needs ../shared/assets and ../shared/mirror")
    mirror = env / "mirror"
    mirror.mkdir()
    (mirror / "github").symlink_to(SHARED_MIRROR / "github")
    nf = shared / "data" / "nfcorpus"
    zip_path = mirror / "public.ukp.informatik.tu-darmstadt.de/thakur/BEIR/datasets/nfcorpus.zip"
    zip_path.parent.mkdir(parents=True)
    with zipfile.ZipFile(zip_path, "w", zipfile.ZIP_DEFLATED) as z:
        for rel in ("corpus.jsonl", "queries.jsonl", "qrels/train.tsv", "qrels/dev.tsv", "qrels/test.tsv"):
            z.write(nf / rel, f"nfcorpus/{rel}")
    md5 = hashlib.md5(zip_path.read_bytes()).hexdigest()
    nf_asset = REGISTRY["nfcorpus"]
    sources = tuple(dataclasses.replace(s, hash=f"md5:{md5}") if s.name == "zip" else s for s in nf_asset.sources)
    monkeypatch.setitem(REGISTRY, "nfcorpus", dataclasses.replace(nf_asset, sources=sources))
    hub = mirror / "huggingface.co/sentence-transformers/all-MiniLM-L6-v2/resolve/main"
    for s in REGISTRY["all-MiniLM-L6-v2"].sources:
        (hub / s.name).parent.mkdir(parents=True, exist_ok=True)
        (hub / s.name).symlink_to(shared / "models" / "all-MiniLM-L6-v2" / s.name)
    monkeypatch.setenv("MULTIPOS_MIRROR", serve(mirror))

    assert assets_cli(["fetch", *DEFAULT_ASSETS]) == 0
    for name in DEFAULT_ASSETS:
        kind = REGISTRY[name].kind
        built, reference = _tree(env / "assets" / kind / name), _tree(shared / kind / name)
        assert built == reference, name
    # A second fetch downloads nothing and leaves the folders as they are.
    RangeHandler.ranges.clear()
    assert assets_cli(["fetch", *DEFAULT_ASSETS]) == 0
    assert RangeHandler.ranges == []


def test_a_hash_mismatch_names_the_url_and_both_hashes_and_leaves_no_partial_asset(env, serve, monkeypatch):
    files = env / "mirror" / "github" / "o" / "r" / "c"
    files.mkdir(parents=True)
    (files / "topics.txt").write_text("1\tq\n")
    (files / "qrels.txt").write_text("1 0 7 1\n")
    expected = "0" * 64
    asset = reg.Asset("tiny-dl", "data", "trec_dl_subcorpus", description="test", sources=(
        Source("https://raw.githubusercontent.com/o/r/c/topics.txt", f"sha256:{_sha256(files / 'topics.txt')}", "x",
               "topics"),
        Source("https://raw.githubusercontent.com/o/r/c/qrels.txt", f"sha256:{expected}", "x", "qrels"),
    ))
    monkeypatch.setitem(REGISTRY, "tiny-dl", asset)
    monkeypatch.setenv("MULTIPOS_MIRROR", serve(env / "mirror"))
    with pytest.raises(AssetNotFoundError) as err:
        resolve_dataset("tiny-dl")
    message = str(err.value)
    assert "/github/o/r/c/qrels.txt" in message
    assert expected in message and _sha256(files / "qrels.txt") in message
    assert not (env / "assets").exists()
    leftovers = [p.name for p in (env / "cache").rglob("*") if p.is_file() or p.name.startswith(".tiny-dl")]
    assert not any("qrels" in n or "tiny-dl" in n for n in leftovers), leftovers


def test_no_network_names_every_place_tried_and_the_assets_alternative(env, monkeypatch):
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    monkeypatch.setenv("MULTIPOS_MIRROR", f"http://127.0.0.1:{port}")
    with pytest.raises(AssetNotFoundError) as err:
        resolve_dataset("trec-dl-2019")
    message = str(err.value)
    for needle in (str(env / "assets" / "data" / "trec-dl-2019"), str(env / "cache" / "assets" / "data"),
                   f"127.0.0.1:{port}/github/castorini/anserini-tools", "MULTIPOS_ASSETS", "multipos.assets fetch"):
        assert needle in message
    with pytest.raises(AssetNotFoundError, match=r"model 'all-MiniLM-L6-v2' not found .*huggingface\.co"):
        resolve_model("all-MiniLM-L6-v2")
    assert not (env / "cache" / "assets").exists()


def test_a_partial_download_is_resumed_with_a_range_request(env, serve, monkeypatch):
    data = bytes(range(256)) * 4096  # 1 MiB
    (env / "mirror" / "h").mkdir(parents=True)
    (env / "mirror" / "h" / "blob.bin").write_bytes(data)
    source = Source("https://h/blob.bin", f"sha256:{hashlib.sha256(data).hexdigest()}", "x", "blob")
    monkeypatch.setenv("MULTIPOS_MIRROR", serve(env / "mirror"))
    cache = env / "cache" / "downloads"
    partial = cache / "partial" / (hashlib.sha256(mirrored_url(source.url).encode()).hexdigest()[:24] + ".part")
    partial.parent.mkdir(parents=True)
    partial.write_bytes(data[:300_000])
    RangeHandler.ranges.clear()
    path = fetch_source(source, cache)
    assert path.read_bytes() == data
    assert RangeHandler.ranges == ["bytes=300000-"]
    assert not partial.exists()


def test_fetch_cli_reports_a_failure_with_exit_status_1(env, monkeypatch, capsys):
    monkeypatch.setenv("MULTIPOS_MIRROR", "http://127.0.0.1:9")
    assert assets_cli(["fetch", "trec-dl-2020"]) == 1
    assert "trec-dl-2020: not built" in capsys.readouterr().err
    with pytest.raises(AssetDownloadError):
        fetch_source(REGISTRY["trec-dl-2020"].sources[0], env / "cache")
