"""A loopback HTTP server the tests share: ``http.server`` on 127.0.0.1, served from a thread."""

from __future__ import annotations

import contextlib
import http.server
import threading
from collections.abc import Iterator


@contextlib.contextmanager
def serving(handler: type[http.server.BaseHTTPRequestHandler]) -> Iterator[http.server.ThreadingHTTPServer]:
    """A ``ThreadingHTTPServer`` on a free loopback port answering with ``handler``, served until
    the block ends (then shut down, closed and its thread joined). Wrap ``server.socket`` (TLS)
    before the first request: the thread only accepts once a client connects."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    # A short poll: shutdown() waits for serve_forever to look (0.5 s by default).
    thread = threading.Thread(target=server.serve_forever, args=(0.01,), daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)
