"""Settings files and MOP_* environment variables -> the typed `mop.settings.Settings`.

Files use dynaconf's format (settings in the [default] environment table) and dynaconf parses
every value; this module layers the sources key by key and checks each value against the
dataclasses, reporting the first problem as a one-line `ConfigError`.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import json
import logging
import math
import os
import re
import tomllib
import types
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any, Final, Literal, TypeVar, get_args, get_origin, get_type_hints

from dynaconf.utils.parse_conf import boolean_fix, parse_conf_data

from mop.advertised_listeners import listener_urls
from mop.partitioned import MAX_PARTITIONS
from mop.settings import (
    LimitsSettings,
    NamespaceRetentionSettings,
    RetentionSettings,
    Settings,
    TelemetrySettings,
    TlsSettings,
)

ENV_PREFIX: Final = "MOP_"
# Names of the fields that hold secrets, never echoed in an error.
_SECRET_NAMES: Final = frozenset({"secret", "token", "password"})
ENV_NESTING: Final = "__"
# The dynaconf environment (top-level TOML table) that holds mop's settings.
ENVIRONMENT: Final = "default"
DEFAULTS_FILE: Final = Path(__file__).with_name("default_settings.toml")
LOCAL_FILE: Final = "settings.toml"

# Keys that moved, by old dotted name: the old name still works, with a warning in the log.
MOVED_KEYS: Final = {"mqtt.max_connections": "limits.max_connections"}
# Keys that are gone, by old dotted name, with what to use instead: setting one is an error.
REMOVED_KEYS: Final = {
    "storage.retention_seconds": (
        "retention.time_seconds (it now keeps acknowledged history only: unacknowledged"
        " messages stay until their subscriptions acknowledge them)"
    ),
    "storage.retention_bytes": (
        "retention.size_bytes (it now keeps acknowledged history only: unacknowledged"
        " messages stay until their subscriptions acknowledge them)"
    ),
}

_T = TypeVar("_T")
Tree = dict[str, Any]

log = logging.getLogger("mop.config")


class ConfigError(Exception):
    """A setting mop cannot use, named by its dotted key (or by the file that is wrong)."""

    def __init__(self, key: str, problem: str) -> None:
        super().__init__(key, problem)
        self.key = key
        self.problem = problem

    def __str__(self) -> str:
        return f"{self.key}: {self.problem}"


def load_settings(
    config_file: str | os.PathLike[str] | None = None,
    *,
    environ: Mapping[str, str] | None = None,
) -> Settings:
    """Build the effective settings, or raise `ConfigError`.

    Sources, each overriding the ones before it key by key: the embedded defaults,
    `./settings.toml` if the working directory has one, `config_file`, then the `MOP_*` entries
    of `environ` (default: `os.environ`), with `__` between nesting levels.
    """
    tree: Tree = {}
    for source, layer in _layers(config_file, os.environ if environ is None else environ):
        _merge(tree, _with_moved_keys(layer, source), source, Settings, "")
    return _build(Settings, tree, "")


def dump_settings(settings: Settings) -> str:
    """`settings` as a settings file (TOML, in the [default] table) that loads back to them."""
    lines: list[str] = []
    _dump_table(settings, ENVIRONMENT, lines)
    return "\n".join(lines) + "\n"


# --- reading the sources -------------------------------------------------------------------------


def _layers(
    config_file: str | os.PathLike[str] | None, environ: Mapping[str, str]
) -> Iterator[tuple[str, Mapping[str, Any]]]:
    # The sources are not handed to a Dynaconf object: it would take SETTINGS_FILE_FOR_DYNACONF
    # and ENV_FOR_DYNACONF from the process environment (defeating `environ`), and between files
    # it replaces whole tables or, when merging, appends lists instead of replacing them.
    files = [DEFAULTS_FILE]
    local = Path.cwd() / LOCAL_FILE
    if local.is_file():
        files.append(local)
    if config_file is not None:
        path = Path(config_file)
        if not path.is_file():
            raise ConfigError(os.fspath(config_file), "settings file not found")
        files.append(path)
    for path in files:
        yield f"file {path}", _read_file(path)
    # Sorted so that a whole table (MOP_MQTT) comes before the keys that refine it (MOP_MQTT__PORT).
    for name in sorted(environ):
        if name.startswith(ENV_PREFIX):
            yield f"environment variable {name}", _read_variable(name, environ[name])


def _read_file(path: Path) -> Mapping[str, Any]:
    """The [default] table of a settings file, its values parsed as dynaconf parses them."""
    try:
        with path.open("rb") as file:
            document = tomllib.load(file)
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise ConfigError(str(path), f"cannot read settings file ({exc})") from None
    # A misplaced [mqtt] or a misspelt [defualt] would otherwise be ignored without a word.
    for key in document:
        if key != ENVIRONMENT:
            raise ConfigError(
                str(path), f"unexpected top-level key {key!r}: settings go in the [default] table"
            )
    table = document.get(ENVIRONMENT, {})
    if not isinstance(table, dict):
        raise ConfigError(str(path), "[default] must be a table")
    parsed: Mapping[str, Any] = parse_conf_data(table, tomlfy=False, box_settings={})
    return parsed


def _read_variable(name: str, raw: str) -> Mapping[str, Any]:
    """One MOP_A__B=value variable as {"a": {"b": value}}; values are parsed as TOML by dynaconf."""
    value: Any = parse_conf_data(boolean_fix(raw), tomlfy=True, box_settings={})
    for part in reversed(name[len(ENV_PREFIX) :].split(ENV_NESTING)):
        value = {part: value}
    layer: Mapping[str, Any] = value
    return layer


def _with_moved_keys(layer: Mapping[str, Any], source: str) -> Mapping[str, Any]:
    """`layer` with each key of `MOVED_KEYS` under its new name (unless the layer sets that
    too), saying so in the log."""
    for old, new in MOVED_KEYS.items():
        value = _value_at(layer, old.split("."))
        if value is None:
            continue
        log.warning("%s: %s is deprecated; use %s", source, old, new)
        layer = _with(layer, old.split("."), None)
        if _value_at(layer, new.split(".")) is None:
            layer = _with(layer, new.split("."), value)
    return layer


def _find_key(table: Mapping[str, Any], name: str) -> str | None:
    """The key of `table` that is `name` in any case (environment variables are upper case)."""
    return next((key for key in table if str(key).lower() == name), None)


def _value_at(layer: Mapping[str, Any], path: list[str]) -> Any:
    """The value at the dotted `path` of `layer`, or None."""
    value: Any = layer
    for name in path:
        key = None if not isinstance(value, Mapping) else _find_key(value, name)
        if key is None:
            return None
        value = value[key]
    return value


def _with(layer: Mapping[str, Any], path: list[str], value: Any) -> dict[str, Any]:
    """A copy of `layer` with `value` at `path` (None: without it), tables made on the way."""
    head, *rest = path
    copy = dict(layer)
    key = _find_key(copy, head) or head
    if rest:
        inner = copy.get(key)
        copy[key] = _with(inner if isinstance(inner, Mapping) else {}, rest, value)
    elif value is None:
        copy.pop(key, None)
    else:
        copy[key] = value
    return copy


def _merge(tree: Tree, layer: Mapping[str, Any], source: str, cls: type, prefix: str) -> None:
    """Overlay `layer` on `tree`: tables merge key by key; other values, lists too, replace."""
    sections = _sections(cls)
    names = _field_names(cls)
    for raw_key, value in layer.items():
        name = str(raw_key).lower()
        key = prefix + name
        if name not in names:
            if key in REMOVED_KEYS:
                raise ConfigError(key, f"was removed (from {source}); use {REMOVED_KEYS[key]}")
            raise ConfigError(key, f"unknown key (from {source})")
        section = sections.get(name)
        if section is not None and isinstance(value, Mapping):
            subtree = tree.get(name)
            if not isinstance(subtree, dict):
                subtree = tree[name] = {}
            _merge(subtree, value, source, section, key + ".")
        else:
            tree[name] = value


def _field_names(cls: type) -> frozenset[str]:
    return frozenset(field.name for field in dataclasses.fields(cls))


def _sections(cls: type) -> dict[str, type]:
    """The fields of `cls` that are tables (nested settings dataclasses)."""
    hints = get_type_hints(cls)
    return {
        field.name: hints[field.name]
        for field in dataclasses.fields(cls)
        if dataclasses.is_dataclass(hints[field.name])
    }


# --- checking values -----------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True, slots=True)
class _Bounds:
    low: int
    high: int | None = None

    def describe(self) -> str:
        if self.high is not None:
            return f"must be an integer between {self.low} and {self.high}"
        if self.low == 1:
            return "must be a positive integer"
        return f"must be an integer >= {self.low}"


_PORT: Final = _Bounds(0, 65535)
_POSITIVE: Final = _Bounds(1)
_UINT32: Final = _Bounds(0, 0xFFFFFFFF)
# Integer bounds, by dotted key or by field name; any other integer must be positive.
_INT_BOUNDS: Final[Mapping[str, _Bounds]] = {
    "port": _PORT,
    "ws_port": _PORT,
    "wss_port": _PORT,
    "tls_port": _PORT,
    "mqtt.max_packet_size": _Bounds(1, 268_435_460),  # MQTT's largest remaining length + header
    "mqtt.max_inflight": _Bounds(1, 65535),
    "mqtt.max_topic_length": _Bounds(1, 65535),
    "mqtt.max_keep_alive": _Bounds(0, 65535),
    "mqtt.topic_alias_maximum": _Bounds(0, 65535),
    "mqtt.default_session_expiry": _UINT32,
    "mqtt.max_session_expiry": _UINT32,
    # Retention limits: -1 is "no limit", 0 "keep nothing".
    "time_seconds": _Bounds(-1),
    "size_bytes": _Bounds(-1),
    # Backlog quota limits: -1 is "no limit".
    "backlog_quota.limit_bytes": _Bounds(-1),
    "backlog_quota.limit_seconds": _Bounds(-1),
    "auth.max_failures": _Bounds(0),
    "limits.connection_burst": _Bounds(0),
    "limits.client_message_burst": _Bounds(0),
    "limits.client_byte_burst": _Bounds(0),
    "limits.subscriber_backlog_bytes": _Bounds(0),
    "telemetry.backlog_top": _Bounds(0, 1000),
    "telemetry.latency_sampling": _Bounds(1, 1_000_000),
    "pulsar.partitioned_topics": _Bounds(1, MAX_PARTITIONS),
    "pulsar.schema_max_bytes": _Bounds(1, 16 * 1024 * 1024),
    # A gRPC message's length is a uint32; above 1 GiB the node would hold far too much.
    "grpc.max_message_bytes": _Bounds(1, 1024 * 1024 * 1024),
    # HTTP/2 SETTINGS_MAX_CONCURRENT_STREAMS is a uint31; a connection's calls are tasks.
    "grpc.max_concurrent_streams": _Bounds(1, 100_000),
}

_NAMESPACE: Final = re.compile(r"[-=:.\w]+/[-=:.\w]+", re.ASCII)
_LOG_LEVELS: Final = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
_PULSAR_SCHEMES: Final = ("pulsar://", "pulsar+ssl://")
_HTTP_SCHEMES: Final = ("http://", "https://")


def _http_urls(value: str) -> bool:
    """One http(s):// URL, or several comma-separated (later ones may leave the scheme out,
    as in Pulsar's "http://host1:8080,host2:8080")."""
    first, *rest = (part.strip() for part in value.split(","))
    return (
        first.startswith(_HTTP_SCHEMES)
        and len(first) > len("https://")
        and all(part and ("://" not in part or part.startswith(_HTTP_SCHEMES)) for part in rest)
    )


def _listener_urls(value: str) -> bool:
    try:
        listener_urls(value)
    except ValueError:
        return False
    return True


def _host_name(value: str) -> bool:
    """A host name or address without port (an IPv6 address with or without brackets), or
    "*" for any: an entry of `admin.allowed_hosts`."""
    if value == "*":
        return True
    inner = value[1:-1] if value.startswith("[") and value.endswith("]") else value
    if ":" in inner:
        try:
            ipaddress.IPv6Address(inner)
        except ValueError:
            return False
        return True
    return bool(inner) and all(c.isascii() and (c.isalnum() or c in "-._") for c in inner)


# Rules for string values (and the strings in lists), by field name: (accepts, problem).
_STRING_RULES: Final[Mapping[str, tuple[Callable[[str], bool], str]]] = {
    "log_level": (
        lambda value: value in _LOG_LEVELS,
        "must be one of " + ", ".join(repr(level) for level in _LOG_LEVELS),
    ),
    "service_url": (lambda value: value.startswith(_PULSAR_SCHEMES), "must be a pulsar:// URL"),
    "advertised_url": (lambda value: value.startswith(_PULSAR_SCHEMES), "must be a pulsar:// URL"),
    "brokers": (lambda value: value.startswith(_PULSAR_SCHEMES), "must be pulsar:// URLs"),
    "admin_url": (_http_urls, "must be http:// or https:// URLs, comma-separated"),
    "protocols": (bool, "must be protocol names"),
    "otlp_metrics_endpoint": (
        lambda value: value.startswith(("http://", "https://")),
        "must be an http:// or https:// URL",
    ),
    "otlp_traces_endpoint": (
        lambda value: value.startswith(("http://", "https://")),
        "must be an http:// or https:// URL",
    ),
    "roles": (bool, "must be user names"),
    "advertised_listeners": (
        _listener_urls,
        "must map listener names to a pulsar:// URL, a pulsar+ssl:// URL or one of each"
        " (comma-separated)",
    ),
    "allowed_hosts": (_host_name, 'must be host names or addresses without a port, or "*"'),
    "sys_node_name": (
        lambda value: bool(value) and not any(c in value for c in "/+#"),
        'must be one topic level (not empty, no "/", "+" or "#")',
    ),
    "namespace": (
        lambda value: bool(_NAMESPACE.fullmatch(value)),
        'must be "tenant/namespace"',
    ),
    "providers": (
        lambda value: value in ("password_file", "jwt", "certificate"),
        'must be "password_file", "jwt" or "certificate"',
    ),
}

# Rules that involve several fields of one table: (accepts, problem).
_TABLE_RULES: Final[Mapping[type, tuple[tuple[Callable[[Any], bool], str], ...]]] = {
    TlsSettings: (
        (
            lambda tls: (tls.certfile is None) == (tls.keyfile is None),
            "certfile and keyfile must be set together",
        ),
    ),
    TelemetrySettings: (
        (
            lambda telemetry: telemetry.trace_sample_ratio <= 1.0,
            "trace_sample_ratio must be between 0 and 1",
        ),
    ),
    NamespaceRetentionSettings: (
        (lambda entry: bool(entry.namespace), 'needs namespace = "tenant/namespace"'),
    ),
    RetentionSettings: (
        (
            lambda retention: (
                len({e.namespace for e in retention.namespaces}) == len(retention.namespaces)
            ),
            "namespaces names a namespace more than once",
        ),
    ),
    LimitsSettings: (
        (
            lambda limits: _watermarks_agree(
                limits.memory_high_watermark, limits.memory_low_watermark
            ),
            "memory_low_watermark must be below memory_high_watermark and in the same unit"
            " (both fractions of the memory up to 1, or both bytes)",
        ),
    ),
}


def _watermarks_agree(high: float, low: float) -> bool:
    """A low-water mark of 0 (90% of the high one), or one below the high one in its unit."""
    if low == 0:
        return True
    return high > 0 and (low <= 1) == (high <= 1) and low < high


def _build(cls: type[_T], data: Mapping[str, Any], prefix: str) -> _T:
    hints = get_type_hints(cls)
    values = {
        field.name: _convert(prefix + field.name, hints[field.name], data[field.name])
        for field in dataclasses.fields(cls)  # type: ignore[arg-type]
        if field.name in data
    }
    settings = cls(**values)
    for accepts, problem in _TABLE_RULES.get(cls, ()):
        if not accepts(settings):
            raise ConfigError(prefix.rstrip("."), problem)
    return settings


def _convert(key: str, hint: Any, value: Any) -> Any:
    """`value` as the type `hint` describes, or a ConfigError naming `key`."""
    origin = get_origin(hint)
    if dataclasses.is_dataclass(hint):
        if not isinstance(value, Mapping):
            raise _invalid(key, "must be a table", value)
        # Tables inside lists are not merged by `_merge`, which checks the keys of the others.
        unknown = sorted(set(map(str, value)) - _field_names(hint))  # type: ignore[arg-type]
        if unknown:
            raise ConfigError(f"{key}.{unknown[0]}", "unknown key")
        return _build(hint, value, key + ".")  # type: ignore[arg-type]
    if origin is Literal:
        choices = get_args(hint)
        if value not in choices:
            raise _invalid(key, "must be one of " + ", ".join(map(repr, choices)), value)
        return value
    if origin is types.UnionType:
        if value is None:
            return None
        (present,) = (arg for arg in get_args(hint) if arg is not type(None))
        return _convert(key, present, value)
    if origin in (dict, Mapping):
        # A table of names: each value is checked by the field's rules (the key names it).
        value_hint = get_args(hint)[1]
        if not isinstance(value, Mapping):
            raise _invalid(key, "must be a table", value)
        if not all(isinstance(name, str) and name.strip() for name in value):
            raise _invalid(key, "must have names that are not empty", value)
        # Read-only, as the rest of the settings are frozen.
        return types.MappingProxyType(
            {name: _convert(key, value_hint, item) for name, item in value.items()}
        )
    if origin is tuple:
        (item,) = get_args(hint)[:1]
        if not isinstance(value, list | tuple):
            raise _invalid(key, "must be a list", value)
        return tuple(_convert(key, item, element) for element in value)
    return _SCALARS[hint](key, value)


def _to_bool(key: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise _invalid(key, "must be true or false", value)
    return value


def _to_int(key: str, value: Any) -> int:
    bounds = _INT_BOUNDS.get(key) or _INT_BOUNDS.get(key.rpartition(".")[2]) or _POSITIVE
    # bool is an int subclass, but `port = true` is a mistake, not 1.
    if (
        isinstance(value, bool)
        or not isinstance(value, int)
        or value < bounds.low
        or (bounds.high is not None and value > bounds.high)
    ):
        raise _invalid(key, bounds.describe(), value)
    return value


# Floats where 0 means "off"; every other float must be positive.
_ZERO_DISABLES: Final = frozenset(
    {
        "mqtt.sys_interval",
        "cluster.batching_delay",
        "storage.unsubscribed_grace",
        "auth.jwt.leeway",
        "auth.reload_interval",
        "telemetry.trace_sample_ratio",
        "limits.connection_rate",
        "limits.client_message_rate",
        "limits.client_byte_rate",
        "limits.memory_high_watermark",
        "limits.memory_low_watermark",
        "grpc.keepalive_interval",
    }
)


def _to_float(key: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value < math.inf:
        raise _invalid(key, "must be a positive number", value)
    if value == 0 and key not in _ZERO_DISABLES:
        raise _invalid(key, "must be a positive number", value)
    return float(value)


def _to_str(key: str, value: Any) -> str:
    if not isinstance(value, str):
        raise _invalid(key, "must be a string", value)
    rule = _STRING_RULES.get(key.rpartition(".")[2])
    if rule is not None and not rule[0](value):
        raise _invalid(key, rule[1], value)
    return value


_SCALARS: Final[Mapping[Any, Callable[[str, Any], Any]]] = {
    bool: _to_bool,
    int: _to_int,
    float: _to_float,
    str: _to_str,
}


def _invalid(key: str, problem: str, value: Any) -> ConfigError:
    shown = "a value that is not shown" if key.rpartition(".")[2] in _SECRET_NAMES else repr(value)
    return ConfigError(key, f"{problem} (got {shown})")


def hide_secrets(settings: _T) -> _T:
    """`settings` with every secret (see `mop.settings.SECRET`) that is set replaced by
    "<hidden>", for printing."""
    changes: dict[str, Any] = {}
    for field in dataclasses.fields(settings):  # type: ignore[arg-type]
        value = getattr(settings, field.name)
        if dataclasses.is_dataclass(value):
            changes[field.name] = hide_secrets(value)
        elif field.metadata.get("secret") and value is not None:
            changes[field.name] = "<hidden>"
    return dataclasses.replace(settings, **changes)  # type: ignore[type-var]


# --- writing -------------------------------------------------------------------------------------


def settings_document(settings: object) -> Any:
    """`settings` as plain JSON values (`mop config --json`): tables as objects, tuples as
    lists. (`dataclasses.asdict` cannot copy the read-only tables.)"""
    if dataclasses.is_dataclass(settings) and not isinstance(settings, type):
        return {
            field.name: settings_document(getattr(settings, field.name))
            for field in dataclasses.fields(settings)
        }
    if isinstance(settings, Mapping):
        return {str(key): settings_document(value) for key, value in settings.items()}
    if isinstance(settings, tuple | list):
        return [settings_document(item) for item in settings]
    return settings


def _dump_table(table: object, name: str, lines: list[str]) -> None:
    if lines:
        lines.append("")
    lines.append(f"[{name}]")
    subtables: list[tuple[str, object]] = []
    arrays: list[tuple[str, tuple[object, ...]]] = []
    for field in dataclasses.fields(table):  # type: ignore[arg-type]
        value = getattr(table, field.name)
        if dataclasses.is_dataclass(value):
            subtables.append((field.name, value))
        elif isinstance(value, tuple) and value and dataclasses.is_dataclass(value[0]):
            arrays.append((field.name, value))
        elif value is None:
            lines.append(f"# {field.name} is not set")
        else:
            lines.append(f"{field.name} = {_toml_value(value)}")
    for key, subtable in subtables:
        _dump_table(subtable, f"{name}.{key}", lines)
    for key, items in arrays:
        for item in items:
            lines.append("")
            lines.append(f"[[{name}.{key}]]")
            lines.extend(
                f"{field.name} = {_toml_value(getattr(item, field.name))}"
                for field in dataclasses.fields(item)  # type: ignore[arg-type]
            )


def _toml_value(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, Mapping):
        entries = (f"{json.dumps(str(key))} = {_toml_value(item)}" for key, item in value.items())
        return "{ " + ", ".join(entries) + " }" if value else "{}"
    if isinstance(value, tuple):
        return "[" + ", ".join(_toml_value(item) for item in value) + "]"
    if isinstance(value, str):
        # JSON string escapes are valid TOML basic-string escapes.
        return json.dumps(value)
    return repr(value)
