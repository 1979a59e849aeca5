"""The standard OpenTelemetry environment, parsed once into a typed ``OtelSettings``.

``read_otel_env(environ)`` reads only the mapping it is given (never ``os.environ`` behind the
caller's back) and raises ``ConfigurationError`` naming the variable and what is valid for
every bad value. ``configure`` turns the settings into sinks; ``serve`` reads the sampler.
"""

from __future__ import annotations

import importlib.util
import math
import re
import ssl
import urllib.parse
from collections.abc import Mapping
from typing import Any, Final, Literal

import msgspec

from ckpt_events import ConfigurationError
from ckpt_events._errors import InvalidTypeError, shown
from ckpt_events._public_home import publish
from ckpt_events.sinks._scrape_server import host_problem, listen_host
from ckpt_events.sinks._span_attrs import DEFAULT_ATTRIBUTE_COUNT_LIMIT, AttributeLimits
from ckpt_events.sinks.otlp._endpoint import endpoint_problem, safe_url
from ckpt_events.sinks.otlp._headers import HEADER_RULES, header_problem
from ckpt_events.sinks.otlp._tls import client_context
from ckpt_events.vocab import REDACTED

__all__ = [
    "DEFAULT_METRIC_EXPORT_TIMEOUT_MS",
    "DEFAULT_METRIC_INTERVAL_MS",
    "DEFAULT_SERVICE_NAME",
    "BatchSettings",
    "OtelSettings",
    "OtlpSettings",
    "TlsFiles",
    "read_otel_env",
    "sample_ratio_from_env",
]

Protocol = Literal["http/protobuf", "http/json", "grpc"]
ExporterName = Literal["otlp", "console", "prometheus"]

PROTOCOLS: Final = ("http/protobuf", "http/json", "grpc")
EXPORTERS: Final = ("otlp", "console", "prometheus", "none")
COMPRESSIONS: Final = ("gzip", "deflate", "none")
ENV_TEMPORALITY: Final = "OTEL_EXPORTER_OTLP_METRICS_TEMPORALITY_PREFERENCE"
#: ``OTEL_EXPORTER_OTLP_METRICS_TEMPORALITY_PREFERENCE``'s values (the specification's).
TEMPORALITIES: Final = ("cumulative", "delta", "lowmemory")
SAMPLERS: Final = (
    "always_on",
    "always_off",
    "traceidratio",
    "parentbased_always_on",
    "parentbased_always_off",
    "parentbased_traceidratio",
)
#: Propagators we implement; ``baggage`` is accepted and ignored (we carry no baggage).
PROPAGATORS_SUPPORTED: Final = ("tracecontext", "baggage", "none")
DEFAULT_ENDPOINTS: Final = {
    "http/protobuf": "http://localhost:4318",
    "http/json": "http://localhost:4318",
    "grpc": "http://localhost:4317",
}
SIGNAL_PATHS: Final = {"traces": "/v1/traces", "metrics": "/v1/metrics"}
#: The optional dependency that brings OTLP over gRPC.
GRPC_EXTRA: Final = "ckpt-events[grpc]"
#: ``OTEL_METRIC_EXPORT_INTERVAL``'s default, and ``OtlpMetricSink(export_interval=)``'s (in
#: seconds): one default whether the sink is built by ``configure`` or directly (the SDK's is 60 s).
DEFAULT_METRIC_INTERVAL_MS: Final = 10_000
#: ``OTEL_METRIC_EXPORT_TIMEOUT``'s default, the specification's (the SDK's periodic reader's).
DEFAULT_METRIC_EXPORT_TIMEOUT_MS: Final = 30_000
#: The most each millisecond variable takes: what the sinks take (a request timeout of an hour,
#: ``OtlpSpanSink``'s linger of a minute, ``OtlpMetricSink``'s interval of a day).
MAX_TIMEOUT_MS: Final = 3_600_000
MAX_SCHEDULE_DELAY_MS: Final = 60_000
MAX_METRIC_INTERVAL_MS: Final = 86_400_000
#: ``service.name`` when neither an argument nor ``OTEL_SERVICE_NAME`` gives one.
DEFAULT_SERVICE_NAME: Final = "ckpt-events"
_PROTOCOL_NAMES: Final[dict[str, Protocol]] = {p: p for p in ("http/protobuf", "http/json", "grpc")}


class TlsFiles(msgspec.Struct, frozen=True):
    """The PEM files of ``OtlpSettings.tls`` (``None``: unset), for an exporter that reads them
    itself (OpenTelemetry's gRPC one, given credentials built from them)."""

    certificate: str | None = None
    client_certificate: str | None = None
    client_key: str | None = None


class OtlpSettings(msgspec.Struct, frozen=True):
    """One signal's OTLP exporter: full endpoint URL, protocol, headers, timeout, compression.

    ``tls`` is the client context built from the ``..._CERTIFICATE``, ``..._CLIENT_CERTIFICATE``
    and ``..._CLIENT_KEY`` files (``None``: none set, the system's trust store), used when the
    endpoint is ``https``; ``insecure`` is ``OTEL_EXPORTER_OTLP_INSECURE``, which the spec
    applies only to a gRPC endpoint without a scheme (every endpoint here has one: ``http`` is
    plain, ``https`` is TLS), so it is checked and kept, never a way to skip verification.
    """

    endpoint: str
    protocol: Protocol
    headers: dict[str, str]
    timeout_s: float | None
    compression: str | None
    tls: ssl.SSLContext | None = None
    insecure: bool = False
    #: The files ``tls`` was built from.
    tls_files: TlsFiles = TlsFiles()


class BatchSettings(msgspec.Struct, frozen=True):
    """``OTEL_BSP_*`` mapped onto the span sink: seconds and counts, ``None`` where unset;
    ``max_export_batch`` is at most ``max_buffer`` when both are set."""

    linger_s: float | None = None
    max_export_batch: int | None = None
    max_buffer: int | None = None
    export_timeout_s: float | None = None


def given(**options: Any) -> dict[str, Any]:
    """``options`` without the unset ones (``None``): a sink's own default stands for those (the
    span sinks' ``OTEL_BSP_*`` options, under each sink's own names)."""
    return {name: value for name, value in options.items() if value is not None}


class OtelSettings(msgspec.Struct, frozen=True):
    """What the OpenTelemetry environment asks for.

    ``traces`` / ``metrics`` name the exporters per signal (empty: that signal is off);
    ``traces_otlp`` / ``metrics_otlp`` hold the OTLP settings when ``"otlp"`` is among them.
    ``sample_ratio`` is the share of new traces sampled (``Telemetry(sample_ratio=...)``).
    """

    sdk_disabled: bool = False
    traces: tuple[ExporterName, ...] = ()
    metrics: tuple[ExporterName, ...] = ()
    traces_otlp: OtlpSettings | None = None
    metrics_otlp: OtlpSettings | None = None
    batch: BatchSettings = BatchSettings()
    #: ``OTEL_SPAN_ATTRIBUTE_VALUE_LENGTH_LIMIT`` / ``OTEL_SPAN_ATTRIBUTE_COUNT_LIMIT``, else their
    #: generic ``OTEL_ATTRIBUTE_*`` (default: no length limit, 128 attributes).
    attribute_limits: AttributeLimits = AttributeLimits()
    sample_ratio: float = 1.0
    service_name: str | None = None
    resource_attributes: dict[str, str] = msgspec.field(default_factory=dict)
    metric_interval_ms: int = DEFAULT_METRIC_INTERVAL_MS
    #: ``OTEL_METRIC_EXPORT_TIMEOUT`` (``None``: unset): the SDK readers' export timeout, and
    #: our ``OtlpMetricSink``'s request timeout when no OTLP timeout variable gives one.
    metric_export_timeout_ms: int | None = None
    #: ``OTEL_EXPORTER_OTLP_METRICS_TEMPORALITY_PREFERENCE``, checked (``None``: unset); our
    #: OTLP/HTTP metric sink takes only ``cumulative``; OpenTelemetry's gRPC exporter is given it.
    metric_temporality: str | None = None
    #: Where ``OTEL_METRICS_EXPORTER=prometheus`` serves ``/metrics``
    #: (``OTEL_EXPORTER_PROMETHEUS_HOST`` / ``_PORT``); an IPv6 host without brackets.
    prometheus_host: str = "localhost"
    prometheus_port: int = 9464
    #: ``CKPT_EVENTS_PROMETHEUS_PORTS``: how many ports from ``prometheus_port`` on the endpoint may
    #: take, the first free one (1: that port alone); one per worker process of a server.
    prometheus_ports: int = 1


#: ``CKPT_EVENTS_PROMETHEUS_PORTS``' bound: worker processes of one server, with room to spare.
MAX_PROMETHEUS_PORTS: Final = 1024


#: The prefixes of the variables we read: only their values are checked to be strings.
_OUR_PREFIXES: Final = ("OTEL_", "CKPT_EVENTS_")


def check_environ(env: object, where: str) -> Mapping[str, str]:
    """``env`` when it is a mapping whose variables of ours (``OTEL_*``, ``CKPT_EVENTS_*``) are
    strings, as ``os.environ``'s are; else ``InvalidTypeError`` naming ``where`` or the variable.

    Without it, ``None`` or a ``True`` where a string goes was an ``AttributeError`` (``.get``,
    ``.strip``) from deep inside, naming neither the argument nor the variable.
    """
    if not isinstance(env, Mapping):
        raise InvalidTypeError(
            f"{where} must be a mapping of str to str (such as os.environ), not {shown(env)}"
        )
    for name, value in env.items():
        if isinstance(name, str) and name.startswith(_OUR_PREFIXES) and not isinstance(value, str):
            raise InvalidTypeError(
                f"{where}[{shown(name)}] must be a str, as every environment variable is, not {shown(value)}"
            )
    return env


def _get(env: Mapping[str, str], name: str) -> str | None:
    raw = env.get(name)
    if raw is None or not raw.strip():
        return None
    return raw.strip()


def _bad(name: str, value: str, valid: str) -> ConfigurationError:
    return ConfigurationError(f"{name}={shown(value)} is not valid; {valid}")


def _choice(env: Mapping[str, str], name: str, choices: tuple[str, ...]) -> str | None:
    raw = _get(env, name)
    if raw is None:
        return None
    if raw.lower() not in choices:
        raise _bad(name, raw, f"use one of {', '.join(choices)}")
    return raw.lower()


def _bool(env: Mapping[str, str], name: str) -> bool:
    raw = _get(env, name)
    if raw is None:
        return False
    if raw.lower() not in ("true", "false"):
        raise _bad(name, raw, "use true or false")
    return raw.lower() == "true"


def _millis(env: Mapping[str, str], name: str, *, maximum: int, allow_zero: bool = True) -> int | None:
    """A whole number of milliseconds up to ``maximum``: a sink refused a larger one with its own
    argument's name, and a huge timeout overflowed every wait on it at close."""
    raw = _get(env, name)
    if raw is None:
        return None
    try:
        value = int(raw)
    except ValueError:
        value = -1
    if value < 0 or (value == 0 and not allow_zero) or value > maximum:
        floor = "0" if allow_zero else "1"
        raise _bad(name, raw, f"use a whole number of milliseconds from {floor} to {maximum}")
    return value


def _count(env: Mapping[str, str], name: str, *, minimum: int = 1) -> int | None:
    """A whole number >= ``minimum``, or ``None`` when unset."""
    raw = _get(env, name)
    if raw is None:
        return None
    try:
        value = int(raw)
    except ValueError:
        value = minimum - 1
    if value < minimum:
        raise _bad(name, raw, f"use a whole number >= {minimum}")
    return value


def _limit(env: Mapping[str, str], span_name: str, generic_name: str) -> int | None:
    """A whole number >= 0 from ``span_name``, else ``generic_name`` (the spec: the span's own wins)."""
    name = span_name if _get(env, span_name) is not None else generic_name
    return _count(env, name, minimum=0)


def _attribute_limits(env: Mapping[str, str]) -> AttributeLimits:
    length = _limit(env, "OTEL_SPAN_ATTRIBUTE_VALUE_LENGTH_LIMIT", "OTEL_ATTRIBUTE_VALUE_LENGTH_LIMIT")
    count = _limit(env, "OTEL_SPAN_ATTRIBUTE_COUNT_LIMIT", "OTEL_ATTRIBUTE_COUNT_LIMIT")
    return AttributeLimits(length, DEFAULT_ATTRIBUTE_COUNT_LIMIT if count is None else count)


#: An entry of a headers variable as an error shows it: its name, then what follows it.
_ENTRY: Final = re.compile(r"\s*([^=:\s]*)(.?)", re.DOTALL)


def _masked(text: str) -> str:
    """A headers variable's ``text`` for an error message: each entry's name and the mark after
    it (``=``, or the ``:`` or space written in its place), its value (a credential, often:
    ``Authorization=Bearer ...``) ``[REDACTED]``; the error is printed and logged. An entry with
    no mark at all is ``[REDACTED]`` whole: it may be the credential itself (a key pasted without
    its header's name, the end of one cut at a comma in it), which was shown as its "name"."""
    masked = []
    for item in text.split(","):
        found = _ENTRY.match(item)
        key, mark = found.groups() if found else ("", "")
        masked.append(f"{key}{mark}{REDACTED}" if mark else REDACTED if item.strip() else "")
    return ",".join(masked)


def _pairs(env: Mapping[str, str], name: str, *, secret: bool = False) -> dict[str, str]:
    """``key=value`` pairs separated by commas, percent-decoded (headers, resource attributes);
    ``secret``: an error shows the names, not the values (``_masked``)."""
    raw = _get(env, name)
    parsed: dict[str, str] = {}
    if raw is None:
        return parsed
    said = _masked if secret else str
    items = raw.split(",")
    for number, item in enumerate(items, 1):
        if not item.strip():
            continue
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            # By its place too: a redacted entry is not told apart by what it shows.
            raise _bad(
                name,
                said(raw),
                "use key=value pairs separated by commas "
                f"(bad entry {number} of {len(items)}: {shown(said(item.strip()))})",
            )
        try:
            # Strict: %FF (not UTF-8) was decoded to U+FFFD, a resource attribute set to a value
            # nobody wrote, without a word.
            decoded = urllib.parse.unquote(key.strip(), errors="strict")
            parsed[decoded] = urllib.parse.unquote(value.strip(), errors="strict")
        except UnicodeDecodeError:
            raise _bad(
                name,
                said(raw),
                f"entry {shown(said(item.strip()))} percent-decodes to bytes that are not UTF-8 "
                "(percent-encode the UTF-8 bytes of the text; %25 for a literal '%')",
            ) from None
    return parsed


def _headers(env: Mapping[str, str], name: str) -> dict[str, str]:
    """``_pairs`` whose every pair can be sent as an HTTP header (checked here, not at the
    first export, where ``http.client`` refusing it on the export thread lost the batch)."""
    headers: dict[str, str] = {}
    by_lower: dict[str, str] = {}
    for key, value in _pairs(env, name, secret=True).items():
        # HTTP names are case-insensitive: "Authorization=a,authorization=b" sent both headers
        # (a collector takes either, or refuses); the last one wins, as for an exact repeat.
        headers.pop(by_lower.get(key.lower(), key), None)
        by_lower[key.lower()] = key
        headers[key] = value
    for key, value in headers.items():
        problem = header_problem(key, value)
        if problem is not None:
            raise _bad(
                name,
                _masked(env[name].strip()),
                f"{problem} (after percent-decoding); {HEADER_RULES}. The value is percent-decoded: "
                "write %25 for a literal '%' (to send the text %E2%82%AC, write %25E2%2582%25AC)",
            )
    return headers


def check_url(value: str, where: str, *, base: bool = False) -> str:
    """``value`` as an http(s) URL without a trailing slash, or ``ConfigurationError``; ``base``:
    a signal path is appended to it (so it takes no ``?query``)."""
    if not isinstance(value, str):
        raise ConfigurationError(f"{where} must be a URL string, not {shown(value)}")
    problem = endpoint_problem(value.strip(), base=base)
    if problem is not None:
        raise ConfigurationError(f"{where}={shown(safe_url(value))} {problem}")
    return value.strip().rstrip("/")


def _exporters(env: Mapping[str, str], name: str, has_endpoint: bool) -> tuple[ExporterName, ...]:
    raw = _get(env, name)
    if raw is None:
        # Unset: OTLP only when an endpoint says where (so an empty environment stays off).
        return ("otlp",) if has_endpoint else ()
    names: list[ExporterName] = []
    for item in raw.lower().split(","):
        part = item.strip()
        if part not in EXPORTERS:
            raise _bad(name, raw, f"use a comma-separated list of {', '.join(EXPORTERS)}")
        if part == "otlp":
            names.append("otlp")
        elif part == "console":
            names.append("console")
        elif part == "prometheus":
            if name != "OTEL_METRICS_EXPORTER":
                raise _bad(name, raw, "prometheus is a metrics exporter (OTEL_METRICS_EXPORTER)")
            names.append("prometheus")
    if "none" in (item.strip() for item in raw.lower().split(",")):
        if names:  # the otlp beside it was dropped without a word (the SDK refuses the list)
            raise _bad(name, raw, "none cannot be combined with other exporters: use none alone, or drop it")
        return ()
    return tuple(dict.fromkeys(names))


def _otlp(
    env: Mapping[str, str], signal: str, endpoint_override: str | None, where_override: str
) -> OtlpSettings:
    upper = signal.upper()
    prefix = f"OTEL_EXPORTER_OTLP_{upper}_"
    protocol_var = prefix + "PROTOCOL" if _get(env, prefix + "PROTOCOL") else "OTEL_EXPORTER_OTLP_PROTOCOL"
    protocol = _choice(env, protocol_var, PROTOCOLS) or "http/protobuf"
    if protocol == "grpc" and not _grpc_installed():
        # Checked here, where the variable is known: the exporter's import error named
        # OTEL_EXPORTER_OTLP_PROTOCOL when OTEL_EXPORTER_OTLP_METRICS_PROTOCOL had asked for gRPC.
        raise _bad(
            protocol_var,
            env[protocol_var].strip(),
            f"grpc needs opentelemetry-exporter-otlp-proto-grpc: pip install '{GRPC_EXTRA}', "
            "or use http/protobuf or http/json",
        )
    path = SIGNAL_PATHS[signal] if protocol != "grpc" else ""
    if endpoint_override is not None:
        endpoint = check_url(endpoint_override, where_override, base=True) + path
    elif (own := _get(env, prefix + "ENDPOINT")) is not None:
        endpoint = check_url(own, prefix + "ENDPOINT")  # per-signal: used as is
    elif (base := _get(env, "OTEL_EXPORTER_OTLP_ENDPOINT")) is not None:
        endpoint = check_url(base, "OTEL_EXPORTER_OTLP_ENDPOINT", base=True) + path
    else:
        endpoint = DEFAULT_ENDPOINTS[protocol] + path
    headers_var = prefix + "HEADERS" if _get(env, prefix + "HEADERS") else "OTEL_EXPORTER_OTLP_HEADERS"
    timeout_var = prefix + "TIMEOUT" if _get(env, prefix + "TIMEOUT") else "OTEL_EXPORTER_OTLP_TIMEOUT"
    compression_var = (
        prefix + "COMPRESSION" if _get(env, prefix + "COMPRESSION") else "OTEL_EXPORTER_OTLP_COMPRESSION"
    )
    timeout_ms = _millis(env, timeout_var, maximum=MAX_TIMEOUT_MS, allow_zero=False)
    tls, tls_files = _tls(env, signal)
    return OtlpSettings(
        endpoint=endpoint,
        protocol=_PROTOCOL_NAMES[protocol],
        headers=_headers(env, headers_var),
        timeout_s=None if timeout_ms is None else timeout_ms / 1000,
        compression=_choice(env, compression_var, COMPRESSIONS),
        tls=tls,
        tls_files=tls_files,
        insecure=_bool(env, _signal_var(env, signal, "INSECURE")),
    )


def _grpc_installed() -> bool:
    """Whether OpenTelemetry's OTLP/gRPC exporters (the grpc extra) can be imported."""
    try:
        return importlib.util.find_spec("opentelemetry.exporter.otlp.proto.grpc") is not None
    except ImportError:  # a parent package missing
        return False


def _signal_var(env: Mapping[str, str], signal: str, option: str) -> str:
    """The variable that gives ``option`` for ``signal``: the signal's own when set, else the
    generic one (the spec: a signal-specific option wins)."""
    own = f"OTEL_EXPORTER_OTLP_{signal.upper()}_{option}"
    return own if _get(env, own) is not None else f"OTEL_EXPORTER_OTLP_{option}"


def _tls(env: Mapping[str, str], signal: str) -> tuple[ssl.SSLContext | None, TlsFiles]:
    """The TLS client context of ``signal``'s files, each variable resolved on its own (a
    signal's CA with the generic client pair is a valid mix), or ``None`` when none is set; and
    the files themselves (for OpenTelemetry's gRPC exporter, given credentials built from them)."""
    files = []
    for option in ("CERTIFICATE", "CLIENT_CERTIFICATE", "CLIENT_KEY"):
        name = _signal_var(env, signal, option)
        path = _get(env, name)
        files.append(None if path is None else (name, path))
    certificate, client_certificate, client_key = files
    paths = TlsFiles(*(None if file is None else file[1] for file in files))
    if certificate is None and client_certificate is None and client_key is None:
        return None, paths
    return client_context(certificate, client_certificate, client_key), paths


def _port(env: Mapping[str, str], name: str, default: int) -> int:
    raw = _get(env, name)
    if raw is None:
        return default
    try:
        value = int(raw)
    except ValueError:
        value = -1
    if not 0 <= value <= 65535:
        raise _bad(name, raw, "use a TCP port number from 0 to 65535")
    return value


def _prometheus_ports(env: Mapping[str, str], port: int) -> int:
    """``CKPT_EVENTS_PROMETHEUS_PORTS`` (default 1): a count of ports from ``port`` on, all of them
    TCP ports; with port 0 (any free port) there is no range to take from."""
    name = "CKPT_EVENTS_PROMETHEUS_PORTS"
    raw = _get(env, name)
    if raw is None:
        return 1
    try:
        value = int(raw)
    except ValueError:
        value = 0
    if not 1 <= value <= MAX_PROMETHEUS_PORTS:
        raise _bad(
            name, raw, f"use a number of ports from 1 to {MAX_PROMETHEUS_PORTS}, one per worker process"
        )
    if value > 1 and port == 0:
        raise _bad(
            name,
            raw,
            "it counts ports from OTEL_EXPORTER_PROMETHEUS_PORT on, which is 0 (any free port): "
            "set that to the first port of the range",
        )
    if port + value - 1 > 65535:
        raise _bad(name, raw, f"OTEL_EXPORTER_PROMETHEUS_PORT {port} + {value - 1} is past port 65535")
    return value


def _prometheus_host(env: Mapping[str, str]) -> str:
    """``OTEL_EXPORTER_PROMETHEUS_HOST`` as the scrape endpoint binds it (default ``localhost``): an
    IPv6 address bare or in a URL's brackets (``::1``, ``[::1]``); ``[::1]`` went to bind() as
    is, refused as a name that does not resolve."""
    raw = _get(env, "OTEL_EXPORTER_PROMETHEUS_HOST")
    if raw is None:
        return "localhost"
    problem = host_problem(raw)
    if problem is not None:
        raise ConfigurationError(
            f"OTEL_EXPORTER_PROMETHEUS_HOST={shown(raw)} {problem}; use a host name or an IPv4 or IPv6 "
            "address, and put the port in OTEL_EXPORTER_PROMETHEUS_PORT"
        )
    return listen_host(raw)


def _sample_ratio(env: Mapping[str, str]) -> float:
    sampler = _choice(env, "OTEL_TRACES_SAMPLER", SAMPLERS) or "parentbased_always_on"
    if sampler.endswith("always_on"):
        return 1.0
    if sampler.endswith("always_off"):
        return 0.0
    raw = _get(env, "OTEL_TRACES_SAMPLER_ARG")
    if raw is None:
        return 1.0
    try:
        ratio = float(raw)
    except ValueError:
        ratio = math.nan
    if not 0.0 <= ratio <= 1.0:
        raise _bad("OTEL_TRACES_SAMPLER_ARG", raw, "use a probability between 0 and 1")
    return ratio


def sample_ratio_from_env(environ: Mapping[str, str]) -> float:
    """The share of new traces to sample per ``OTEL_TRACES_SAMPLER`` / ``_ARG`` (default 1.0).

    Our sampler is ``ParentBased(TraceIdRatioBased)``: a continued trace keeps its caller's
    decision, so ``traceidratio`` and ``parentbased_*`` map onto the same ratio.
    """
    return _sample_ratio(check_environ(environ, "environ"))


def _check_propagators(env: Mapping[str, str]) -> None:
    raw = _get(env, "OTEL_PROPAGATORS")
    if raw is None:
        return
    for part in raw.lower().split(","):
        if part.strip() not in PROPAGATORS_SUPPORTED:
            raise _bad(
                "OTEL_PROPAGATORS",
                raw,
                "ckpt-events speaks W3C tracecontext only; use tracecontext (baggage is ignored)",
            )


def read_otel_env(
    env: Mapping[str, str],
    *,
    otlp_endpoint: str | None = None,
) -> OtelSettings:
    """Parse the OpenTelemetry variables of ``env``; ``otlp_endpoint`` (an argument) wins
    over every endpoint variable and is a base URL (signal paths are appended)."""
    check_environ(env, "env")
    _check_propagators(env)
    sampler_ratio = _sample_ratio(env)
    service = _get(env, "OTEL_SERVICE_NAME")
    attributes = _pairs(env, "OTEL_RESOURCE_ATTRIBUTES")
    interval = _millis(env, "OTEL_METRIC_EXPORT_INTERVAL", maximum=MAX_METRIC_INTERVAL_MS, allow_zero=False)
    # Read here, not by the SDK's reader from os.environ: it was ignored by our OTLP metric
    # sink, unchecked, and taken from the process's environment rather than ``environ``.
    metric_timeout = _millis(env, "OTEL_METRIC_EXPORT_TIMEOUT", maximum=MAX_TIMEOUT_MS, allow_zero=False)
    delay = _millis(env, "OTEL_BSP_SCHEDULE_DELAY", maximum=MAX_SCHEDULE_DELAY_MS)
    export_timeout = _millis(env, "OTEL_BSP_EXPORT_TIMEOUT", maximum=MAX_TIMEOUT_MS, allow_zero=False)
    max_batch = _count(env, "OTEL_BSP_MAX_EXPORT_BATCH_SIZE")
    max_queue = _count(env, "OTEL_BSP_MAX_QUEUE_SIZE")
    if max_batch is not None and max_queue is not None and max_batch > max_queue:
        # The spec's rule, which the SDK's BatchSpanProcessor enforces; ours exported such a
        # queue only at each linger, dropping past its bound.
        raise ConfigurationError(
            f"OTEL_BSP_MAX_EXPORT_BATCH_SIZE={max_batch} is larger than OTEL_BSP_MAX_QUEUE_SIZE={max_queue}; "
            "a batch must fit in the queue: lower the batch size or raise the queue size"
        )
    batch = BatchSettings(
        linger_s=None if delay is None else delay / 1000,
        max_export_batch=max_batch,
        max_buffer=max_queue,
        export_timeout_s=None if export_timeout is None else export_timeout / 1000,
    )
    if _bool(env, "OTEL_SDK_DISABLED"):
        return OtelSettings(sdk_disabled=True, sample_ratio=sampler_ratio)
    base = otlp_endpoint is not None or _get(env, "OTEL_EXPORTER_OTLP_ENDPOINT") is not None
    traces = _exporters(
        env, "OTEL_TRACES_EXPORTER", base or bool(_get(env, "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"))
    )
    metrics = _exporters(
        env, "OTEL_METRICS_EXPORTER", base or bool(_get(env, "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT"))
    )
    port = _port(env, "OTEL_EXPORTER_PROMETHEUS_PORT", 9464)
    return OtelSettings(
        traces=traces,
        metrics=metrics,
        traces_otlp=_otlp(env, "traces", otlp_endpoint, "otlp_endpoint") if "otlp" in traces else None,
        metrics_otlp=_otlp(env, "metrics", otlp_endpoint, "otlp_endpoint") if "otlp" in metrics else None,
        metric_temporality=_choice(env, ENV_TEMPORALITY, TEMPORALITIES),
        batch=batch,
        attribute_limits=_attribute_limits(env),
        sample_ratio=sampler_ratio,
        service_name=service,
        resource_attributes=attributes,
        metric_interval_ms=DEFAULT_METRIC_INTERVAL_MS if interval is None else interval,
        metric_export_timeout_ms=metric_timeout,
        prometheus_host=_prometheus_host(env),
        prometheus_port=port,
        prometheus_ports=_prometheus_ports(env, port),
    )


# Pickles, reprs and tracebacks name the public module (_public_home.py says why).
publish("ckpt_events.sinks", OtelSettings, read_otel_env, sample_ratio_from_env)
