"""The OpenTelemetry TLS variables (``ckpt_events.sinks.otlp._tls``) against a real HTTPS
collector on 127.0.0.1: the CA bundle, mutual TLS, a signal's own variable winning over the
generic one, ``OTEL_EXPORTER_OTLP_INSECURE``, and one line for a file that cannot be used.

The certificates are made here with the ``openssl`` command (the ``cryptography`` package is not
a dependency of the project); without it these tests are skipped, saying so.
"""

from __future__ import annotations

import http.server
import shutil
import ssl
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import anyio
import pytest

from ckpt_events import Bus, ConfigurationError, Telemetry
from ckpt_events.sinks import configure, read_otel_env
from ckpt_events.sinks.otel import OtlpSpanSink

OPENSSL = shutil.which("openssl")
pytestmark = pytest.mark.skipif(
    OPENSSL is None, reason="no openssl command to make the test certificates with (and no cryptography)"
)


class Certificates:
    """Self-signed PEM files: the collector's (for 127.0.0.1) and a client's, each with its key."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.server, self.server_key = self._make("127.0.0.1", "subjectAltName=IP:127.0.0.1")
        self.client, self.client_key = self._make("trainer", "extendedKeyUsage=clientAuth")
        self.localhost, self.localhost_key = self._make("localhost", "subjectAltName=DNS:localhost")
        self.expired, self.expired_key = self._make_expired()

    def _make(self, name: str, extension: str) -> tuple[Path, Path]:
        assert OPENSSL is not None
        cert, key = self.folder / f"{name}.pem", self.folder / f"{name}.key"
        subprocess.run(
            [OPENSSL, "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1"]
            + ["-nodes", "-days", "2", "-subj", f"/CN={name}", "-addext", extension]
            + ["-keyout", str(key), "-out", str(cert)],
            check=True,
            capture_output=True,
        )
        return cert, key

    def _make_expired(self) -> tuple[Path, Path]:
        """A self-signed certificate for 127.0.0.1 that expired a day ago (``req -x509`` takes
        no negative ``-days``; ``x509 -req`` does)."""
        assert OPENSSL is not None
        cert, key, request = (self.folder / f"expired.{end}" for end in ("pem", "key", "csr"))
        extension = self.folder / "expired.ext"
        extension.write_text("subjectAltName=IP:127.0.0.1\n")
        subprocess.run(
            [OPENSSL, "req", "-new", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
            + ["-subj", "/CN=expired", "-keyout", str(key), "-out", str(request)],
            check=True,
            capture_output=True,
        )
        subprocess.run(
            [OPENSSL, "x509", "-req", "-in", str(request), "-signkey", str(key), "-days", "-1"]
            + ["-extfile", str(extension), "-out", str(cert)],
            check=True,
            capture_output=True,
        )
        return cert, key


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Certificates:
    """The certificates, made once for the module."""
    return Certificates(tmp_path_factory.mktemp("tls"))


@contextmanager
def _https_collector(
    certs: Certificates, *, client_ca: Path | None = None, pair: tuple[Path, Path] | None = None
) -> Iterator[tuple[str, list[bytes]]]:
    """An HTTPS server on 127.0.0.1 answering every POST 200; with ``client_ca`` it takes only a
    client certificate that CA signed (mutual TLS); ``pair``: its certificate and key (else
    ``certs.server``'s). Yields its base URL and the bodies it got."""
    received: list[bytes] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_POST(self) -> None:  # noqa: N802
            received.append(self.rfile.read(int(self.headers["content-length"])))
            self.send_response(200)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args: Any) -> None:
            pass

    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(*(pair or (certs.server, certs.server_key)))
    if client_ca is not None:
        context.verify_mode = ssl.CERT_REQUIRED
        context.load_verify_locations(client_ca)
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.socket = context.wrap_socket(server.socket, server_side=True)
    thread = threading.Thread(target=server.serve_forever, args=(0.01,), daemon=True)
    thread.start()
    try:
        yield f"https://127.0.0.1:{server.server_port}", received
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


async def _export_one_span(environ: dict[str, str]) -> OtlpSpanSink:
    """Configure from ``environ`` (traces only), end one operation, close; the span sink."""
    environ = {"OTEL_METRICS_EXPORTER": "none", **environ}
    async with Bus() as bus:
        async with configure(bus, environ=environ) as configured:
            sink = configured.span_sink
            assert isinstance(sink, OtlpSpanSink)
            sink.sender.max_retries = 0  # a refused handshake is final here: no backoff
            with Telemetry(bus, kind="agent", instance="a0").operation("resume"):
                pass
    return sink


async def test_the_ca_bundle_verifies_the_collector(certs: Certificates) -> None:
    """OTEL_EXPORTER_OTLP_CERTIFICATE: the span reaches a collector whose certificate only that
    file vouches for; without it, the handshake fails, said in last_failure, and the span is
    counted as dropped."""
    with _https_collector(certs) as (url, received):
        sink = await _export_one_span(
            {"OTEL_EXPORTER_OTLP_ENDPOINT": url, "OTEL_EXPORTER_OTLP_CERTIFICATE": str(certs.server)}
        )
        assert (sink.stats().exported, len(received)) == (1, 1)
        refused = await _export_one_span({"OTEL_EXPORTER_OTLP_ENDPOINT": url})
    stats = refused.stats()
    assert (stats.exported, stats.dropped, len(received)) == (0, 1, 1)
    # Sent while closing (the span's only export): the reason is kept, not "got no answer".
    assert stats.last_failure is not None and stats.last_failure.startswith("failed the TLS handshake")


async def test_insecure_never_skips_verification_of_an_https_endpoint(certs: Certificates) -> None:
    """OTEL_EXPORTER_OTLP_INSECURE=true: the spec applies it to gRPC endpoints without a scheme
    only; an https endpoint is still verified (no CA given: the handshake fails)."""
    with _https_collector(certs) as (url, received):
        sink = await _export_one_span(
            {"OTEL_EXPORTER_OTLP_ENDPOINT": url, "OTEL_EXPORTER_OTLP_INSECURE": "true"}
        )
    assert (sink.stats().exported, received) == (0, [])
    settings = read_otel_env(
        {"OTEL_EXPORTER_OTLP_ENDPOINT": url, "OTEL_EXPORTER_OTLP_TRACES_INSECURE": "true"}
    )
    assert settings.traces_otlp is not None and settings.traces_otlp.insecure


async def test_mutual_tls_with_the_signals_own_client_pair(certs: Certificates) -> None:
    """A collector that asks for a client certificate takes the traces' own pair
    (..._TRACES_CLIENT_CERTIFICATE / _KEY); without one it refuses the connection."""
    with _https_collector(certs, client_ca=certs.client) as (url, received):
        base = {"OTEL_EXPORTER_OTLP_ENDPOINT": url, "OTEL_EXPORTER_OTLP_CERTIFICATE": str(certs.server)}
        refused = await _export_one_span(base)
        assert (refused.stats().exported, received) == (0, [])
        sink = await _export_one_span(
            {
                **base,
                "OTEL_EXPORTER_OTLP_TRACES_CLIENT_CERTIFICATE": str(certs.client),
                "OTEL_EXPORTER_OTLP_TRACES_CLIENT_KEY": str(certs.client_key),
            }
        )
        assert (sink.stats().exported, len(received)) == (1, 1)


async def test_a_signals_own_variable_wins_over_the_generic_one(certs: Certificates, tmp_path: Path) -> None:
    """OTEL_EXPORTER_OTLP_TRACES_CERTIFICATE wins: the generic one, a file that is missing, is
    never read for traces (metrics still read it, and say so)."""
    missing = str(tmp_path / "missing.pem")
    with _https_collector(certs) as (url, received):
        sink = await _export_one_span(
            {
                "OTEL_EXPORTER_OTLP_ENDPOINT": url,
                "OTEL_EXPORTER_OTLP_CERTIFICATE": missing,
                "OTEL_EXPORTER_OTLP_TRACES_CERTIFICATE": str(certs.server),
            }
        )
    assert (sink.stats().exported, len(received)) == (1, 1)
    with pytest.raises(ConfigurationError, match="^OTEL_EXPORTER_OTLP_CERTIFICATE="):
        read_otel_env(
            {
                "OTEL_EXPORTER_OTLP_ENDPOINT": url,
                "OTEL_EXPORTER_OTLP_CERTIFICATE": missing,
                "OTEL_EXPORTER_OTLP_TRACES_CERTIFICATE": str(certs.server),
            }
        )


def test_a_file_that_cannot_be_used_is_one_line_naming_the_variable(
    certs: Certificates, tmp_path: Path
) -> None:
    """Missing, a folder, not PEM, a key without its certificate, a certificate without its key,
    a bad INSECURE: each is one ConfigurationError line naming the variable and the fix."""
    not_pem = tmp_path / "notes.txt"
    not_pem.write_text("not a certificate\n")
    base = {"OTEL_EXPORTER_OTLP_ENDPOINT": "https://127.0.0.1:4318"}
    cases = [
        ({"OTEL_EXPORTER_OTLP_CERTIFICATE": str(tmp_path / "missing.pem")}, "cannot be read (No such file"),
        ({"OTEL_EXPORTER_OTLP_TRACES_CERTIFICATE": str(tmp_path)}, "cannot be read (Is a directory)"),
        ({"OTEL_EXPORTER_OTLP_CERTIFICATE": str(not_pem)}, "holds no PEM CA certificate"),
        (
            {"OTEL_EXPORTER_OTLP_CLIENT_KEY": str(certs.client_key)},
            "set OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE too",
        ),
        ({"OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE": str(certs.client)}, "in OTEL_EXPORTER_OTLP_CLIENT_KEY"),
        (
            {
                "OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE": str(certs.client),
                "OTEL_EXPORTER_OTLP_CLIENT_KEY": str(certs.server_key),
            },
            "is no PEM client certificate and key pair",
        ),
        (
            {"OTEL_EXPORTER_OTLP_INSECURE": "yes"},
            "OTEL_EXPORTER_OTLP_INSECURE='yes' is not valid; use true or false",
        ),
    ]
    for extra, said in cases:
        with pytest.raises(ConfigurationError) as refused:
            read_otel_env({**base, **extra})
        message = str(refused.value)
        assert "\n" not in message and said in message, message
        assert message.startswith(next(iter(extra))), message


def _tls_cases(certs: Certificates) -> dict[str, tuple[tuple[Path, Path] | None, bool, Path, str]]:
    """Each certificate mistake: the collector's pair, whether it asks for a client certificate,
    the CA file given, and the fix the warning must say."""
    other_ca = certs.client  # a CA that did not sign the collector's certificate
    return {
        "wrong CA": (None, False, other_ca, "in OTEL_EXPORTER_OTLP_CERTIFICATE"),
        "expired": ((certs.expired, certs.expired_key), False, certs.expired, "certificate has expired"),
        "host mismatch": (
            (certs.localhost, certs.localhost_key),
            False,
            certs.localhost,
            "not issued for the endpoint's host",
        ),
        "no client certificate": (
            None,
            True,
            certs.server,
            "set OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE and OTEL_EXPORTER_OTLP_CLIENT_KEY",
        ),
    }


@pytest.mark.parametrize("case", ["wrong CA", "expired", "host mismatch", "no client certificate"])
async def test_a_certificate_mistake_is_one_warning_with_its_fix_and_never_retried(
    certs: Certificates, case: str, caplog: pytest.LogCaptureFixture
) -> None:
    """With the sender's own retries (5), a certificate the collector's TLS cannot pass is said
    once, with the verify failure and what to change (was: "is that an OTLP/HTTP collector's
    URL?", and a collector asking for a client certificate was "refused or unreachable"), and
    is not retried (was: 5 retries over ~31 s per batch, 8.5 s of a close for mutual TLS)."""
    pair, mutual, ca, fix = _tls_cases(certs)[case]
    environ = {"OTEL_METRICS_EXPORTER": "none", "OTEL_EXPORTER_OTLP_CERTIFICATE": str(ca)}
    with _https_collector(certs, client_ca=certs.client if mutual else None, pair=pair) as (url, received):
        started = time.monotonic()
        async with Bus() as bus:
            async with configure(bus, environ={**environ, "OTEL_EXPORTER_OTLP_ENDPOINT": url}) as configured:
                sink = configured.span_sink
                assert isinstance(sink, OtlpSpanSink) and sink.sender.max_retries == 5
                if mutual:
                    # The refusal may come as a reset or an EOF (retried: not known to be the
                    # certificate), on a loaded machine several times in a row (all six attempts
                    # once, the collector's alert lost to its close): more attempts, as fast.
                    sink.sender.initial_backoff = sink.sender.max_backoff = 0.05
                    sink.sender.max_retries = 15
                with Telemetry(bus, kind="agent", instance="a0").operation("resume"):
                    pass
                await bus.flush()
                await _until(lambda: sink.stats().dropped == 1, 5.0)
                # Not retried while running: the mutual TLS refusal may come as a reset once.
                assert mutual or sink.stats().retries == 0
        took = time.monotonic() - started
    stats = sink.stats()
    assert (stats.exported, stats.dropped, received) == (0, 1, [])
    assert stats.last_failure is not None and stats.last_failure.startswith("failed the TLS handshake")
    warnings = [r.getMessage() for r in caplog.records if "failed the TLS handshake" in r.getMessage()]
    first = warnings[0]
    assert "\n" not in first and fix in first and url in first, first
    assert "is that an OTLP/HTTP collector's URL" not in first and "Traceback" not in caplog.text
    assert took < 2.0, took


async def _until(done: Callable[[], bool], limit: float) -> None:
    """Wait (bounded by ``limit`` seconds) until ``done()``."""
    deadline = time.monotonic() + limit
    while not done() and time.monotonic() < deadline:
        await anyio.sleep(0.02)
