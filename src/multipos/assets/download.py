"""Downloads of registered source files: pooch for the cache, hash check and retries; HTTP ranges for resuming.

Why pooch (not ir_datasets): the assets are built from a handful of plain files at pinned URLs, which is what
pooch does (a known hash per file, a cache folder, retries, the file moved into place only once its hash
matches); ir_datasets knows NFCorpus and TREC DL but builds its own layouts, not the BEIR folders and sub-corpora
the configs read, and downloads the 8.8M-passage MS MARCO collection to build the TREC DL ones.
multipos adds one thing pooch lacks: a partial download is kept in ``<cache>/downloads/partial/`` and resumed
with an HTTP ``Range`` request on the next try.

Environment:
    ``MULTIPOS_MIRROR``: a base URL that replaces every public host, laid out as ``../shared/mirror``:
        ``github/<owner>/<repo>/<commit>/<path>`` for ``raw.githubusercontent.com`` files, ``<host>/<path>``
        for any other host.
    ``MULTIPOS_DOWNLOAD_RETRIES``: extra tries after a failed download or a hash mismatch (default 2).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from pathlib import Path
from urllib.parse import urlsplit

from multipos.assets.registry import Source

__all__ = ["AssetDownloadError", "mirrored_url", "fetch_source", "file_hash", "check_first_seen", "FIRST_SEEN_FILE"]

#: In the download cache: the sha256 of each unpinned file (no published hash) as first received, by URL or hub
#: file; every later download or build is checked against it.
FIRST_SEEN_FILE = "sha256-first-seen.json"

log = logging.getLogger(__name__)
_CHUNK = 1 << 20


class AssetDownloadError(RuntimeError):
    """A source file could not be had: every URL tried and why, or a hash that differs (URL and both hashes)."""


def mirrored_url(url: str, mirror: str | None = None) -> str:
    """``url`` as served by the mirror ``mirror`` (default ``$MULTIPOS_MIRROR``; unset: ``url`` itself).

    ``https://raw.githubusercontent.com/<owner>/<repo>/<commit>/<path>`` maps to
    ``<mirror>/github/<owner>/<repo>/<commit>/<path>``; ``https://<host>/<path>`` to ``<mirror>/<host>/<path>``.
    """
    mirror = os.environ.get("MULTIPOS_MIRROR") if mirror is None else mirror
    if not mirror:
        return url
    parts = urlsplit(url)
    prefix = "github" if parts.netloc == "raw.githubusercontent.com" else parts.netloc
    return f"{mirror.rstrip('/')}/{prefix}{parts.path}"


def file_hash(path: str | os.PathLike, algorithm: str = "sha256") -> str:
    """Hex digest of the file at ``path`` (``sha256`` or ``md5``)."""
    h = hashlib.new(algorithm)
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(_CHUNK), b""):
            h.update(chunk)
    return h.hexdigest()


def _resumable_downloader(partial_dir: Path, headers: dict[str, str] | None = None):
    """A pooch downloader that keeps what it received in ``partial_dir`` and asks only for the rest next time
    (``headers``: extra request headers the host needs)."""

    def download(url: str, output_file, pooch, check_only: bool = False):  # pooch calls it with these arguments
        import requests
        from tqdm.auto import tqdm

        partial_dir.mkdir(parents=True, exist_ok=True)
        part = partial_dir / (hashlib.sha256(url.encode()).hexdigest()[:24] + ".part")
        have = part.stat().st_size if part.exists() else 0
        request_headers = {**(headers or {}), **({"Range": f"bytes={have}-"} if have else {})}
        with requests.get(url, headers=request_headers, stream=True, timeout=(10, 60)) as r:
            if r.status_code == 416:  # the partial file is already whole
                r.close()
            else:
                r.raise_for_status()
                resumed = r.status_code == 206
                if not resumed:
                    have = 0
                total = int(r.headers.get("Content-Length", 0)) + have or None
                name = url.rsplit("/", 1)[-1]
                with open(part, "ab" if resumed else "wb") as f, tqdm(
                        total=total, initial=have, unit="B", unit_scale=True, desc=name, leave=False,
                        disable=None) as bar:
                    for chunk in r.iter_content(_CHUNK):
                        f.write(chunk)
                        bar.update(len(chunk))
        # Whole: hand it to pooch, which checks the hash and moves it into the cache (or deletes it).
        os.replace(part, output_file if isinstance(output_file, (str, os.PathLike)) else output_file.name)

    return download


def fetch_source(source: Source, cache: Path, retries: int | None = None) -> Path:
    """Download ``source`` into ``cache`` (once: a cached file whose hash matches is used as it is).

    Args:
        source: the registered file (URL, hash).
        cache: download cache folder; files land in ``<cache>/<sha256 of URL>/<file name>``.
        retries: extra tries after a failure or hash mismatch (default ``$MULTIPOS_DOWNLOAD_RETRIES`` or 2).

    Returns:
        Path of the verified file.

    Raises:
        AssetDownloadError: the download failed after every try (the URL and the error), or the file's hash
            differs from the registered one (the URL and both hashes; nothing is kept).
    """
    import pooch
    import requests

    url = mirrored_url(source.url)
    retries = int(os.environ.get("MULTIPOS_DOWNLOAD_RETRIES", "2")) if retries is None else retries
    key = hashlib.sha256(source.url.encode()).hexdigest()[:16]
    fname = f"{key}/{source.url.rsplit('/', 1)[-1]}"
    store = pooch.create(path=cache, base_url="", registry={fname: source.hash}, urls={fname: url},
                         retry_if_failed=retries)
    pooch.get_logger().setLevel(logging.WARNING)
    try:
        path = Path(store.fetch(fname, downloader=_resumable_downloader(cache / "partial", dict(source.headers))))
    except ValueError as e:
        if "hash" not in str(e):
            raise
        raise AssetDownloadError(f"{url}: the downloaded file's hash differs from the registered one "
                                 f"({source.hash}); {e}") from None
    except (requests.exceptions.RequestException, OSError) as e:
        raise AssetDownloadError(f"{url}: download failed ({type(e).__name__}: {e})") from None
    if source.hash is None:
        try:
            check_first_seen(source.url, file_hash(path), cache)
        except AssetDownloadError:
            path.unlink()
            raise
    return path


def check_first_seen(key: str, sha256: str, cache: Path) -> bool:
    """Check an unpinned file's sha256 against the one recorded when ``key`` (its URL, or ``hf://`` hub file) was
    first received, recording it on first sight in ``<cache>/``:data:`FIRST_SEEN_FILE`.

    Returns:
        True when the hash was recorded now (first sight), False when it matched the record.

    Raises:
        AssetDownloadError: the hash differs from the recorded one (names the key, both hashes and the record file).
    """
    from multipos import atomic

    record_file = Path(cache) / FIRST_SEEN_FILE
    records = json.loads(record_file.read_text(encoding="utf-8")) if record_file.is_file() else {}
    seen = records.get(key)
    if seen is None:
        records[key] = sha256
        atomic.write_json(record_file, records)
        log.warning("%s is not pinned by a published hash: its sha256 %s is recorded in %s and checked from now on",
                    key, sha256, record_file)
        return True
    if seen != sha256:
        raise AssetDownloadError(f"{key}: the file received has sha256 {sha256}, but {seen} was recorded when it was "
                                 f"first received ({record_file}); the source changed. Pin a revision, or delete "
                                 "its entry there to accept the new file.")
    return False
