"""Files of a Hugging Face hub repository, downloaded through ``huggingface_hub`` into the download cache.

:func:`resolve_repo` turns a repository and a revision (a branch, tag or commit) into the commit it names and the files
it holds there (``HfApi.repo_info`` and ``HfApi.list_repo_files``); :func:`download` fetches one file of that commit
with ``hf_hub_download`` (streamed to disk, kept in ``<cache>/hub`` in the hub's own cache layout, so a file is
received once) and checks it: hub datasets publish no hash a build could pin, so the sha256 of each file is recorded
the first time it is received, under ``hf://<type>s/<repo>@<revision asked>/<path>`` in
``<cache>/sha256-first-seen.json`` (:func:`multipos.assets.download.check_first_seen`), and a later download that
differs stops with both hashes.

Endpoint, read at each call (``huggingface_hub`` reads ``HF_ENDPOINT`` once, when it is imported; here it is passed
explicitly): ``$HF_ENDPOINT``; else, when ``$MULTIPOS_MIRROR`` is set, ``<mirror>/huggingface.co`` (the mirror layout
of :func:`multipos.assets.download.mirrored_url`: the mirror answers the hub's API there), with no token sent to it;
else ``https://huggingface.co``.
"""

from __future__ import annotations

import fnmatch
import logging
import os
from dataclasses import dataclass
from pathlib import Path

from multipos.assets.download import AssetDownloadError, check_first_seen, file_hash

__all__ = ["HUB_URL", "HubRepo", "hub_endpoint", "resolve_repo", "match_files", "download", "first_seen_key"]

log = logging.getLogger(__name__)

HUB_URL = "https://huggingface.co"


def hub_endpoint() -> str:
    """The hub endpoint now: ``$HF_ENDPOINT``, else ``$MULTIPOS_MIRROR/huggingface.co``, else :data:`HUB_URL`."""
    if os.environ.get("HF_ENDPOINT"):
        return os.environ["HF_ENDPOINT"].rstrip("/")
    mirror = os.environ.get("MULTIPOS_MIRROR")
    return f"{mirror.rstrip('/')}/huggingface.co" if mirror else HUB_URL


def _token() -> bool | None:
    """No token for a mirror (``MULTIPOS_MIRROR`` without ``HF_ENDPOINT``); else the client's own (``HF_TOKEN``, the
    saved login, or none)."""
    return False if os.environ.get("MULTIPOS_MIRROR") and not os.environ.get("HF_ENDPOINT") else None


def _hub_errors() -> tuple[type[BaseException], ...]:
    """What a hub call raises when the hub cannot answer: HTTP and network errors of the client's HTTP library, the
    hub's own errors (repository, revision or file not found) and OS errors (disk, offline mode)."""
    from huggingface_hub import errors

    found: list[type[BaseException]] = [OSError, errors.EntryNotFoundError, errors.HfHubHTTPError]
    for module in ("httpx2", "httpx", "requests"):
        try:
            lib = __import__(module)
        except ImportError:
            continue
        found.append(lib.HTTPError if module != "requests" else lib.exceptions.RequestException)
    return tuple(found)


@dataclass(frozen=True)
class HubRepo:
    """A hub repository at one commit: ``revision`` as asked, ``commit`` the id it resolved to, ``files`` every path
    the commit holds, and the ``endpoint`` asked."""

    repo_id: str
    repo_type: str
    revision: str
    commit: str
    files: tuple[str, ...]
    endpoint: str

    @property
    def where(self) -> str:
        return f"{self.endpoint}/{'datasets/' if self.repo_type == 'dataset' else ''}{self.repo_id}@{self.revision}"


def resolve_repo(repo_id: str, revision: str = "main", repo_types: tuple[str, ...] = ("dataset",)) -> HubRepo:
    """The commit ``revision`` names in ``repo_id`` and the files it holds, trying each type of ``repo_types`` in
    order (``dataset``, ``model``) until the hub knows the repository as that type.

    Raises:
        AssetDownloadError: the hub could not be reached, or knows no such repository (under any of the types) or
            revision (names the endpoint, the repository, the revision and the client's error).
    """
    from huggingface_hub import HfApi
    from huggingface_hub.errors import RepositoryNotFoundError

    endpoint = hub_endpoint()
    api = HfApi(endpoint=endpoint, token=_token())
    tried = []
    for repo_type in repo_types:
        try:
            info = api.repo_info(repo_id, repo_type=repo_type, revision=revision)
            files = api.list_repo_files(repo_id, repo_type=repo_type, revision=info.sha or revision)
        except RepositoryNotFoundError:
            tried.append(repo_type)
            continue
        except _hub_errors() as e:
            raise AssetDownloadError(f"{endpoint}: hub repository {repo_id} ({repo_type}) at revision {revision!r} "
                                     f"could not be read ({type(e).__name__}: {_first_line(e)})") from None
        return HubRepo(repo_id, repo_type, revision, info.sha or revision, tuple(sorted(files)), endpoint)
    raise AssetDownloadError(f"{endpoint}: no hub repository {repo_id} (tried as {' and as '.join(tried)})")


def _first_line(e: BaseException) -> str:
    return str(e).strip().splitlines()[0] if str(e).strip() else ""


def match_files(repo: HubRepo, patterns: list[str] | tuple[str, ...], what: str) -> list[str]:
    """The repository's files that match the first pattern (``fnmatch``, case-insensitive, against the whole path:
    ``*`` also crosses ``/``) that matches any; patterns are alternatives, in order of preference.

    Raises:
        AssetDownloadError: no pattern matches (names ``what``, the patterns and the files the repository holds).
    """
    for pattern in patterns:
        hits = [f for f in repo.files if fnmatch.fnmatch(f.lower(), pattern.lower())]
        if hits:
            return hits
    shown = ", ".join(repo.files[:40]) + (f" ... ({len(repo.files)} files)" if len(repo.files) > 40 else "")
    raise AssetDownloadError(f"{repo.where} (commit {repo.commit}): no file matches the {what} patterns "
                             f"{list(patterns)}; the repository holds: {shown or 'no file'}")


def first_seen_key(repo: HubRepo, filename: str) -> str:
    """The key of ``filename``'s sha256 record: ``hf://<type>s/<repo>@<revision asked>/<path>``."""
    return f"hf://{repo.repo_type}s/{repo.repo_id}@{repo.revision}/{filename}"


def download(repo: HubRepo, filename: str, cache: Path) -> tuple[Path, str]:
    """Download ``filename`` of ``repo``'s commit into ``<cache>/hub`` (once: a file of that commit already there is
    used as it is) and check its sha256 against the one recorded when it was first received.

    Returns:
        (path of the file, its sha256).

    Raises:
        AssetDownloadError: the download failed (the URL and the client's error), or the file differs from the one
            received first under the same repository, revision and path (the key and both hashes).
    """
    from huggingface_hub import hf_hub_download

    try:
        path = Path(hf_hub_download(repo.repo_id, filename, repo_type=repo.repo_type, revision=repo.commit,
                                    cache_dir=Path(cache) / "hub", endpoint=repo.endpoint, token=_token()))
    except _hub_errors() as e:
        raise AssetDownloadError(f"{repo.where}/{filename} (commit {repo.commit}): download failed "
                                 f"({type(e).__name__}: {_first_line(e)})") from None
    sha = file_hash(path)
    check_first_seen(first_seen_key(repo, filename), sha, Path(cache))
    log.info("%s/%s: sha256 %s", repo.where, filename, sha)
    return path, sha
