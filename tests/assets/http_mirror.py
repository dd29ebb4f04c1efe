"""A static file server on 127.0.0.1 for download tests: ``Range: bytes=N-`` requests, and a record of each request's
Range header and of its other headers (the tests check what a downloader sent)."""

from __future__ import annotations

import functools
import http.server
import threading
import typing
from pathlib import Path


class RangeHandler(http.server.SimpleHTTPRequestHandler):
    """Static files with ``Range: bytes=N-`` support; records each request's Range header and headers."""

    ranges: typing.ClassVar[list] = []
    headers_seen: typing.ClassVar[list] = []

    def log_message(self, *args):  # quiet
        pass

    def send_head(self):
        rng = self.headers.get("Range")
        type(self).ranges.append(rng)
        type(self).headers_seen.append((self.path, dict(self.headers)))
        path = Path(self.translate_path(self.path))
        if not rng or not path.is_file():
            return super().send_head()
        start = int(rng.split("=")[1].rstrip("-"))
        size = path.stat().st_size
        if start >= size:
            self.send_response(416)
            self.end_headers()
            return None
        f = open(path, "rb")  # noqa: SIM115 (returned open, as SimpleHTTPRequestHandler.send_head does)
        f.seek(start)
        self.send_response(206)
        self.send_header("Content-Length", str(size - start))
        self.send_header("Content-Range", f"bytes {start}-{size - 1}/{size}")
        self.end_headers()
        return f


class LocalServers:
    """Context manager yielding ``start(folder) -> base URL``: one threaded server per call, all stopped on exit."""

    def __init__(self):
        self.servers: list[http.server.ThreadingHTTPServer] = []

    def __enter__(self):
        def start(folder: Path) -> str:
            handler = functools.partial(RangeHandler, directory=str(folder))
            server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
            threading.Thread(target=server.serve_forever, daemon=True).start()
            self.servers.append(server)
            return f"http://127.0.0.1:{server.server_address[1]}"

        return start

    def __exit__(self, *exc):
        for s in self.servers:
            s.shutdown()
            s.server_close()
