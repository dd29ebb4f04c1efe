"""A Hugging Face hub on 127.0.0.1 for download tests: exactly the requests ``huggingface_hub`` makes for
``HfApi.repo_info``, ``HfApi.list_repo_files`` and ``hf_hub_download`` of a repository at a revision.

- ``GET /api/{datasets|models}/{owner}/{name}/revision/{rev}``: the repository's info (``id``, ``sha``: the commit the
  revision names, ``siblings``);
- ``GET /api/{datasets|models}/{owner}/{name}/tree/{rev}[/{folder}]``: its files (``type``, ``path``, ``size``,
  ``oid``), every file at any depth (the client asks ``recursive=True``);
- ``HEAD`` / ``GET /[datasets/]{owner}/{name}/resolve/{rev}/{path}``: one file, with the headers the client reads
  (``X-Repo-Commit``, ``ETag``, ``Content-Length``).

A revision is a branch name (``main``) or a commit id (40 hex digits, as the hub's). Unknown repositories, revisions
and files answer 404 with the hub's ``X-Error-Code`` (``RepoNotFound``, ``RevisionNotFound``, ``EntryNotFound``), so
the client raises the errors it raises against the hub.
"""

from __future__ import annotations

import hashlib
import http.server
import json
import threading
import typing
from urllib.parse import unquote, urlsplit

__all__ = ["FakeHub"]


class _Repo(typing.NamedTuple):
    commit: str
    files: dict[str, bytes]


class FakeHub:
    """A hub of repositories, each a set of files at one commit per branch; ``publish`` replaces a branch's files
    (a new commit, as a push). Use as a context manager: ``url`` is the endpoint while it runs."""

    def __init__(self):
        self.repos: dict[tuple[str, str], dict[str, _Repo]] = {}  # (type, id) -> {branch: files at a commit}
        self.requests: list[tuple[str, str]] = []  # (method, path) of every request received
        self._server: http.server.ThreadingHTTPServer | None = None
        self.url = ""

    def publish(self, repo_id: str, files: dict[str, bytes], repo_type: str = "dataset", branch: str = "main") -> str:
        """Make ``files`` (path -> content) the content of ``branch``; returns the new commit id."""
        digest = hashlib.sha1(repo_id.encode())
        for path in sorted(files):
            digest.update(path.encode() + b"\0" + files[path])
        commit = digest.hexdigest()
        self.repos.setdefault((repo_type, repo_id), {})[branch] = _Repo(commit, dict(files))
        return commit

    def _find(self, repo_type: str, repo_id: str, revision: str) -> tuple[_Repo | None, str | None]:
        branches = self.repos.get((repo_type, repo_id))
        if branches is None:
            return None, "RepoNotFound"
        for repo in branches.values():
            if revision == repo.commit:
                return repo, None
        if revision in branches:
            return branches[revision], None
        return None, "RevisionNotFound"

    def __enter__(self) -> FakeHub:
        hub = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *args):  # quiet
                pass

            def _send(self, status: int, body: bytes = b"", headers: dict | None = None, head: bool = False):
                self.send_response(status)
                for k, v in (headers or {}).items():
                    self.send_header(k, v)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                if not head:
                    self.wfile.write(body)

            def _error(self, code: str, head: bool = False):
                self._send(404, json.dumps({"error": code}).encode(), {"X-Error-Code": code,
                                                                        "Content-Type": "application/json"}, head)

            def _json(self, obj):
                self._send(200, json.dumps(obj).encode(), {"Content-Type": "application/json"})

            def _route(self, head: bool):
                path = urlsplit(self.path).path
                hub.requests.append((self.command, path))
                parts = [unquote(p) for p in path.strip("/").split("/")]
                if parts[:1] == ["api"] and len(parts) >= 6 and parts[1] in ("datasets", "models"):
                    repo_type, repo_id, what, rev = parts[1][:-1], f"{parts[2]}/{parts[3]}", parts[4], parts[5]
                    repo, error = hub._find(repo_type, repo_id, rev)
                    if error:
                        return self._error(error, head)
                    if what == "revision":
                        return self._json({"id": repo_id, "sha": repo.commit, "private": False,
                                           "siblings": [{"rfilename": p} for p in sorted(repo.files)]})
                    if what == "tree":
                        folder = "/".join(parts[6:])
                        return self._json([{"type": "file", "path": p, "size": len(data),
                                            "oid": hashlib.sha1(data).hexdigest()}
                                           for p, data in sorted(repo.files.items())
                                           if not folder or p.startswith(folder + "/")])
                    return self._error("EntryNotFound", head)
                repo_type = "dataset" if parts[:1] == ["datasets"] else "model"
                parts = parts[1:] if repo_type == "dataset" else parts
                if len(parts) < 5 or parts[2] != "resolve":
                    return self._error("RepoNotFound", head)
                repo, error = hub._find(repo_type, f"{parts[0]}/{parts[1]}", parts[3])
                if error:
                    return self._error(error, head)
                name = "/".join(parts[4:])
                if name not in repo.files:
                    return self._send(404, b"", {"X-Error-Code": "EntryNotFound", "X-Repo-Commit": repo.commit}, head)
                data = repo.files[name]
                self._send(200, data, {"X-Repo-Commit": repo.commit, "ETag": f'"{hashlib.sha256(data).hexdigest()}"',
                                       "Content-Type": "application/octet-stream"}, head)

            def do_GET(self):  # noqa: N802 (http.server's names)
                self._route(head=False)

            def do_HEAD(self):  # noqa: N802
                self._route(head=True)

        self._server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        return self

    def __exit__(self, *exc):
        self._server.shutdown()
        self._server.server_close()
