"""A real OTLP/HTTP receiver on 127.0.0.1 for the command line's tests: records the path of
every request it is sent and answers 200 with an empty reply, as a collector does."""

from __future__ import annotations

import contextlib
import http.server
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any


@dataclass
class Received:
    """What the receiver was sent: one path per request, the bodies' bytes, and each body with
    its content type (``bodies``, in order)."""

    url: str
    paths: list[str] = field(default_factory=list)
    bytes: int = 0
    bodies: list[tuple[str, bytes]] = field(default_factory=list)


@contextlib.contextmanager
def otlp_receiver(port: int = 0) -> Iterator[Received]:
    """A running receiver on ``port`` (0: any free one); ``url`` is its base (``http://127.0.0.1:PORT``)."""
    received = Received("")

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802
            body = self.rfile.read(int(self.headers.get("content-length", "0")))
            received.bytes += len(body)
            # The path first: a reader pairing paths and bodies while this runs pairs whole ones.
            received.paths.append(self.path)
            received.bodies.append((self.headers.get("content-type", ""), body))
            self.send_response(200)
            self.send_header("content-type", self.headers.get("content-type", "application/x-protobuf"))
            self.send_header("content-length", "0")
            self.end_headers()

        def log_message(self, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", port), Handler)
    received.url = f"http://127.0.0.1:{server.server_port}"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield received
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)
