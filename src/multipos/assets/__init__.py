"""Where real data and checkpoints come from: the assets folder, else built from their public sources.

The shared assets folder is found through the environment variable ``MULTIPOS_ASSETS`` (default:
``../shared/assets`` beside the repository). An asset that is not there is built from the public files the
registry (:mod:`multipos.assets.registry`) lists for it, verified by hash, into ``<cache>/assets`` (cache:
``$MULTIPOS_CACHE``, default ``<repo>/.cache``); ``python -m multipos.assets fetch NAME...`` builds named assets
into ``$MULTIPOS_ASSETS``. ``MULTIPOS_MIRROR`` replaces every public host by a mirror
(:func:`multipos.assets.download.mirrored_url`). When nothing works, :class:`AssetNotFoundError` names every
place tried.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import sys
import urllib.request
import zipfile
from collections.abc import Iterator
from pathlib import Path

from multipos.formats.types import DataFormatError

REPO_ROOT = Path(__file__).resolve().parents[3]

#: Public source of BEIR datasets that have no registry entry (e.g. the paper's out-of-domain sets).
BEIR_URL = "https://public.ukp.informatik.tu-darmstadt.de/thakur/BEIR/datasets/{name}.zip"
#: DPR's open-domain QA files (Karpukhin et al., 2020; facebookresearch/DPR ``download_data.py``).
DPR_URLS = {
    "psgs_w100.tsv": "https://dl.fbaipublicfiles.com/dpr/wikipedia_split/psgs_w100.tsv.gz",
    "nq-test.qa.csv": "https://dl.fbaipublicfiles.com/dpr/data/retriever/nq-test.qa.csv",
}
HUB_IDS = {"all-MiniLM-L6-v2": "sentence-transformers/all-MiniLM-L6-v2", "bert-base-uncased": "bert-base-uncased"}


#: Settings file of a multipos checkpoint (pooling, normalisation, τ, shared; ``DualEncoder.save_pretrained``).
ENCODER_SETTINGS_FILE = "multipos_encoder.json"


class AssetNotFoundError(FileNotFoundError):
    """Neither the assets folder nor the public source could provide an asset."""


@contextlib.contextmanager
def stop_on_missing_asset() -> Iterator[None]:
    """Around a Hydra entry point (``train.py``, ``evaluate.py``): a dataset or model that neither the assets folder,
    the cache nor its public sources could provide (:class:`multipos.assets.AssetNotFoundError`, also when Hydra's
    ``instantiate`` wrapped it) stops the job with its one-paragraph message on stderr and exit status 1, without a
    traceback: the message names the asset, where it was looked for and the command that builds it."""
    try:
        yield
    except Exception as e:  # noqa: BLE001 (re-raised unless an AssetNotFoundError is behind it)
        cause: BaseException | None = e
        while cause is not None and not isinstance(cause, AssetNotFoundError):
            cause = cause.__cause__ or cause.__context__
        if cause is None:
            raise
        print(f"\n{cause}\n", file=sys.stderr)
        raise SystemExit(1) from None


def assets_dir() -> Path:
    """The assets folder: ``$MULTIPOS_ASSETS`` or ``<repo>/../shared/assets``."""
    return Path(os.environ.get("MULTIPOS_ASSETS", REPO_ROOT.parent / "shared" / "assets")).expanduser()


def cache_dir() -> Path:
    """Writable cache for mined negatives, embeddings and downloads: ``$MULTIPOS_CACHE`` or ``<repo>/.cache``."""
    path = Path(os.environ.get("MULTIPOS_CACHE", REPO_ROOT / ".cache")).expanduser()
    path.mkdir(parents=True, exist_ok=True)
    return path


def is_local_path(name_or_path: str) -> bool:
    """True for a filesystem path (absolute, or starting with ``./``, ``../`` or ``~``), which can be neither a hub
    id nor a dataset name: where it does not exist, nothing is looked up by name or downloaded."""
    return str(name_or_path).startswith(("/", "./", "../", "~"))


def resolve_model(name_or_path: str) -> str:
    """Return a local checkpoint folder or a hub id for ``name_or_path``.

    An existing folder is returned as is; a bare name found in ``<assets>/models/`` resolves there; a registered
    name (:data:`multipos.assets.registry.REGISTRY`, e.g. ``all-MiniLM-L6-v2``) resolves to ``<cache>/assets/models``,
    built from its hub files on first use; any other name is returned as a hub id (``transformers`` downloads it
    where a network exists).

    Raises:
        AssetNotFoundError: a filesystem path (absolute, or starting with ``./``, ``../`` or ``~``) that is not a
            folder, or a registered model that is neither in the assets folder nor downloadable (every place tried).
    """
    if Path(name_or_path).expanduser().is_dir():
        return str(Path(name_or_path).expanduser())
    if is_local_path(name_or_path):
        what = "a file, not a checkpoint folder" if Path(name_or_path).expanduser().exists() else "not found"
        raise AssetNotFoundError(f"{name_or_path}: checkpoint folder {what} (model.name_or_path / data.tokenizer)")
    short = name_or_path.split("/")[-1]
    local = assets_dir() / "models" / short
    if local.is_dir():
        return str(local)
    from multipos.assets.registry import REGISTRY

    if short in REGISTRY and name_or_path in (short, HUB_IDS.get(short)):
        return str(_build_registered(short, [local]))
    return HUB_IDS.get(name_or_path, name_or_path)


def built_assets_dir() -> Path:
    """Where assets built from their public sources go when ``$MULTIPOS_ASSETS`` lacks them: ``<cache>/assets``."""
    return cache_dir() / "assets"


def _build_registered(name: str, tried: list[Path], download: bool = True) -> Path:
    """Build registered asset ``name`` into :func:`built_assets_dir` (or return it, built before)."""
    from multipos.assets.build import build_asset
    from multipos.assets.download import AssetDownloadError
    from multipos.assets.registry import get

    kind = get(name).kind
    built = built_assets_dir() / kind / name
    if built.is_dir():
        return built
    tried = [*tried, built]
    if not download:
        reason = "download disabled"
    else:
        try:
            return build_asset(name, built_assets_dir(), cache_dir() / "downloads")
        except AssetDownloadError as e:
            reason = f"building it from its public sources failed: {e}"
    raise AssetNotFoundError(
        f"{kind[:-1] if kind == 'models' else 'dataset'} {name!r} not found (tried {', '.join(map(str, tried))}; "
        f"{reason}). Set MULTIPOS_ASSETS to a folder holding {kind}/{name}, run `python -m multipos.assets fetch "
        f"{name}` where a network exists, or set MULTIPOS_MIRROR to a mirror of its public files."
    )


_WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin",
                 "pytorch_model.bin.index.json")
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "vocab.json", "spiece.model",
                    "sentencepiece.bpe.model")


def check_checkpoint_dir(path: str | Path) -> None:
    """Check that the local folder ``path`` holds a loadable checkpoint before ``from_pretrained`` reads it.

    A shared-encoder folder needs ``config.json``, weights (``model.safetensors``, ``pytorch_model.bin`` or a
    sharded index) and tokenizer files; an untied multipos folder needs both in ``query_encoder/`` (the
    tokenizer there) and ``passage_encoder/``. Raises FileNotFoundError naming the folder, what is missing
    and the files present; DataFormatError when ``multipos_encoder.json`` is not valid JSON.
    """
    folder = Path(path)
    saved = folder / ENCODER_SETTINGS_FILE
    if saved.is_file():
        try:
            json.loads(saved.read_text())
        except (ValueError, UnicodeDecodeError) as e:
            raise DataFormatError(f"{saved}: not valid JSON ({e}); the checkpoint's settings cannot be read") from None
    untied = (folder / "query_encoder").is_dir()
    sides = [(folder / "query_encoder", True), (folder / "passage_encoder", False)] if untied else [(folder, True)]
    for side, needs_tokenizer in sides:
        present = sorted(p.name for p in side.iterdir()) if side.is_dir() else []
        missing = []
        if "config.json" not in present:
            missing.append("config.json (the model configuration)")
        if not set(_WEIGHT_FILES) & set(present):
            missing.append(f"model weights (one of {', '.join(_WEIGHT_FILES)})")
        if needs_tokenizer and not set(_TOKENIZER_FILES) & set(present):
            missing.append(f"tokenizer files (one of {', '.join(_TOKENIZER_FILES)})")
        if missing:
            raise FileNotFoundError(f"{side} is not a model checkpoint: missing {'; '.join(missing)}. "
                                    f"Files there: {present[:20]}")


def resolve_dataset(name_or_path: str, download: bool = True) -> Path:
    """Return a BEIR-layout folder for a dataset name (``nfcorpus``) or path.

    Looks in order at: an existing path, ``<assets>/data/<name>``; then, for a registered name
    (:data:`multipos.assets.registry.REGISTRY`), ``<cache>/assets/data/<name>``, built there from its public sources
    when missing; for any other name, ``<cache>/beir/<name>``, downloaded from ``BEIR_URL`` when missing.

    Raises:
        AssetNotFoundError: nothing worked (names every place tried and the ``MULTIPOS_ASSETS`` alternative), or a
            filesystem path (:func:`is_local_path`) is not a folder (said without looking further).
    """
    path = Path(name_or_path).expanduser()
    if path.is_dir():
        return path
    if is_local_path(name_or_path):
        what = "is a file, not a BEIR folder" if path.exists() else "does not exist"
        raise AssetNotFoundError(f"{name_or_path}: {what} (a BEIR folder holds corpus.jsonl, queries.jsonl and "
                                 "qrels/; data.source.path, eval.paths or an evaluation set's path)")
    local = assets_dir() / "data" / name_or_path
    if local.is_dir():
        return local
    from multipos.assets.registry import REGISTRY

    if name_or_path in REGISTRY:
        return _build_registered(name_or_path, [local], download)
    head, _, sub = name_or_path.partition("/")
    if sub and head in REGISTRY:  # a folder inside a registered asset: cqadupstack/android
        folder = resolve_dataset(head, download) / sub
        if not folder.is_dir():
            raise AssetNotFoundError(f"dataset {name_or_path!r}: {folder} does not exist (asset {head!r} holds "
                                     f"{', '.join(sorted(p.name for p in folder.parent.iterdir() if p.is_dir()))})")
        return folder
    candidates = [local, cache_dir() / "beir" / name_or_path]
    if candidates[1].is_dir():
        return candidates[1]
    url = BEIR_URL.format(name=name_or_path)
    if download:
        try:
            return _download_beir(name_or_path, url)
        except Exception as e:  # network errors, bad zip
            reason = f"download from {url} failed: {e}"
    else:
        reason = "download disabled"
    tried = ", ".join(str(c) for c in candidates)
    raise AssetNotFoundError(
        f"dataset {name_or_path!r} not found (tried {tried}; {reason}). "
        "Set MULTIPOS_ASSETS to the shared assets folder or give a BEIR folder path."
    )


def _download_beir(name: str, url: str) -> Path:
    """An unregistered BEIR dataset: its zip through the download cache, unpacked atomically into the cache."""
    from multipos.assets.download import fetch_source
    from multipos.assets.registry import Source

    archive = fetch_source(Source(url, None, "see the BEIR dataset's own licence", name), cache_dir() / "downloads")
    target = cache_dir() / "beir"
    tmp = target / f".{name}.unpacking-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        with zipfile.ZipFile(archive) as z:
            z.extractall(tmp)
        os.replace(tmp / name, target / name)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target / name


def resolve_files(name_or_path: str, files: list[str], urls: dict[str, str] | None = None) -> Path:
    """Return the folder holding every file in ``files`` for a dataset name or path (non-BEIR layouts,
    e.g. DPR's ``psgs_w100.tsv`` + ``nq-test.qa.csv``).

    Looks at an existing path, ``<assets>/data/<name>``, ``<cache>/<name>``; files still missing are
    downloaded from ``urls`` (default :data:`DPR_URLS`; ``.gz`` is decompressed) into ``<cache>/<name>``.
    Raises AssetNotFoundError naming the places tried and the file that could not be had.
    """
    import gzip

    from multipos.assets.registry import REGISTRY

    urls = DPR_URLS if urls is None else urls
    path = Path(name_or_path).expanduser()
    if not path.is_dir() and name_or_path in REGISTRY:  # a registered folder (nq-dpr): built from its sources
        folder = resolve_dataset(name_or_path)
        missing = [f for f in files if not (folder / f).is_file()]
        if missing:
            raise AssetNotFoundError(f"{folder} (asset {name_or_path!r}) has no {', '.join(missing)}")
        return folder
    candidates = [path] if path.is_dir() else [assets_dir() / "data" / name_or_path, cache_dir() / name_or_path]
    for c in candidates:
        if c.is_dir() and all((c / f).is_file() for f in files):
            return c
    target = candidates[-1]
    for f in files:
        if (target / f).is_file():
            continue
        url = urls.get(f)
        try:
            if url is None:
                raise FileNotFoundError("no public source known")
            target.mkdir(parents=True, exist_ok=True)
            tmp = target / (f + ".part")
            with urllib.request.urlopen(url, timeout=30) as r:
                stream = gzip.GzipFile(fileobj=r) if url.endswith(".gz") else r
                with tmp.open("wb") as out:
                    shutil.copyfileobj(stream, out)
            tmp.replace(target / f)
        except Exception as e:  # network errors, missing source
            tried = ", ".join(str(c) for c in candidates)
            raise AssetNotFoundError(f"{f} for {name_or_path!r} not found (tried {tried}; "
                                     f"download from {url} failed: {e})") from None
    return target
