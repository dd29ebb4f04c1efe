"""Where real data and checkpoints come from: one setting, one fallback.

The shared assets folder is found through the environment variable ``MULTIPOS_ASSETS`` (default:
``../shared/assets`` beside the repository). When an asset is not there, multipos falls back to its
public source (Hugging Face hub id for models, the BEIR download URL for datasets) and raises a
:class:`AssetNotFoundError` that names both places when neither works.
"""

from __future__ import annotations

import json
import os
import shutil
import urllib.request
import zipfile
from pathlib import Path

from multipos.types import DataFormatError

REPO_ROOT = Path(__file__).resolve().parents[2]

#: Public sources of the assets used by the default configs.
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

    An existing folder is returned as is; a bare name found in ``<assets>/models/`` resolves there;
    otherwise the hub id is returned (``transformers`` downloads it where a network exists). Raises
    AssetNotFoundError for a filesystem path (absolute, or starting with ``./``, ``../`` or ``~``) that is not
    a folder: it cannot be a hub id.
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
    return HUB_IDS.get(name_or_path, name_or_path)


_WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin", "pytorch_model.bin.index.json")
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

    Looks in order at: an existing path, ``<assets>/data/<name>``, ``<cache>/beir/<name>``, then
    downloads ``BEIR_URL`` into the cache. Raises AssetNotFoundError naming every place tried, or, for a filesystem
    path (:func:`is_local_path`) that is not a folder, saying so without looking further.
    """
    path = Path(name_or_path).expanduser()
    if path.is_dir():
        return path
    if is_local_path(name_or_path):
        what = "is a file, not a BEIR folder" if path.exists() else "does not exist"
        raise AssetNotFoundError(f"{name_or_path}: {what} (a BEIR folder holds corpus.jsonl, queries.jsonl and "
                                 "qrels/; data.source.path, eval.paths or an evaluation set's path)")
    candidates = [assets_dir() / "data" / name_or_path, cache_dir() / "beir" / name_or_path]
    for c in candidates:
        if c.is_dir():
            return c
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
    target = cache_dir() / "beir"
    target.mkdir(parents=True, exist_ok=True)
    archive = target / f"{name}.zip"
    with urllib.request.urlopen(url, timeout=30) as r, archive.open("wb") as f:
        shutil.copyfileobj(r, f)
    with zipfile.ZipFile(archive) as z:
        z.extractall(target)
    archive.unlink()
    return target / name


def resolve_files(name_or_path: str, files: list[str], urls: dict[str, str] | None = None) -> Path:
    """Return the folder holding every file in ``files`` for a dataset name or path (non-BEIR layouts,
    e.g. DPR's ``psgs_w100.tsv`` + ``nq-test.qa.csv``).

    Looks at an existing path, ``<assets>/data/<name>``, ``<cache>/<name>``; files still missing are
    downloaded from ``urls`` (default :data:`DPR_URLS`; ``.gz`` is decompressed) into ``<cache>/<name>``.
    Raises AssetNotFoundError naming the places tried and the file that could not be had.
    """
    import gzip

    urls = DPR_URLS if urls is None else urls
    path = Path(name_or_path).expanduser()
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
            raise AssetNotFoundError(f"{f} for {name_or_path!r} not found (tried {tried}; download from {url} failed: {e})") from None
    return target
