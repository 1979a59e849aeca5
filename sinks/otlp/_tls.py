"""The TLS client context of an OTLP/HTTP sender, from the OpenTelemetry TLS variables.

``client_context`` builds one ``ssl.SSLContext`` from PEM files: the CA bundle that verifies
the collector (``OTEL_EXPORTER_OTLP_CERTIFICATE``; without it the system's trust store) and,
for mutual TLS, the client's certificate chain and key (``OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE``,
``OTEL_EXPORTER_OTLP_CLIENT_KEY``). It is built once, where the settings are read, so a file
that cannot be read or is not PEM is one ``ConfigurationError`` naming the variable, never a
failed handshake at the first export. The host name is always checked.
"""

from __future__ import annotations

import ssl

from ckpt_events import ConfigurationError
from ckpt_events._errors import shown

__all__ = ["client_context"]

#: One setting: the variable (or argument) that gave it, and the path it gave.
Named = tuple[str, str]


def client_context(
    certificate: Named | None, client_certificate: Named | None, client_key: Named | None
) -> ssl.SSLContext:
    """A client context trusting ``certificate``'s CAs (else the system's), presenting
    ``client_certificate`` with ``client_key`` (the key may also sit in the certificate's file);
    ``ConfigurationError`` in one line naming the variable whose file is at fault."""
    if client_key is not None and client_certificate is None:
        where, _ = client_key
        raise ConfigurationError(
            f"{where} is set without a client certificate: set "
            f"{where.replace('CLIENT_KEY', 'CLIENT_CERTIFICATE')} too (mutual TLS needs both)"
        )
    for named in (certificate, client_certificate, client_key):
        if named is not None:
            _check_readable(named)
    if certificate is None:
        context = ssl.create_default_context()
    else:
        where, path = certificate
        try:
            context = ssl.create_default_context(cafile=path)
        except ssl.SSLError as exc:
            raise ConfigurationError(
                f"{where}={shown(path)} holds no PEM CA certificate the TLS library takes ({_reason(exc)}); "
                "give the PEM file of the CA that signed the collector's certificate"
            ) from None
    if client_certificate is not None:
        where, path = client_certificate
        key = None if client_key is None else client_key[1]
        try:
            context.load_cert_chain(path, key)
        except ssl.SSLError as exc:
            said = f" and {client_key[0]}={shown(key)}" if client_key is not None else ""
            fix = (
                "give the PEM certificate and the PEM key that belongs to it"
                if client_key is not None
                else f"give its private key in {where.replace('CLIENT_CERTIFICATE', 'CLIENT_KEY')}"
            )
            raise ConfigurationError(
                f"{where}={shown(path)}{said} is no PEM client certificate and key pair "
                f"({_reason(exc)}); {fix}"
            ) from None
    return context


def _check_readable(named: Named) -> None:
    where, path = named
    try:
        with open(path, "rb") as file:
            file.read(1)
    except OSError as exc:
        why = exc.strerror or type(exc).__name__
        raise ConfigurationError(
            f"{where}={shown(path)} cannot be read ({why}); give a PEM file's path"
        ) from None


def _reason(exc: ssl.SSLError) -> str:
    return str(exc.reason or exc.strerror or type(exc).__name__)
