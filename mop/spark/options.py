"""The options of the `mop` Spark data source, parsed once into frozen settings.

Spark hands a data source its options as strings with lower-cased names. Parsing them here,
before any connection is made, turns a misspelt name or a bad value into one clear error at
`load()` / `start()` time instead of a failure inside a Spark task.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

from mop.message import MessageId
from mop.spark.positions import EARLIEST, parse_position
from mop.topic_names import mqtt_to_pulsar
from mop.topics import TopicError, validate_topic_filter

__all__ = [
    "DEFAULT_SERVICE_URL",
    "ClientSecurity",
    "EARLIEST_NAME",
    "LATEST_NAME",
    "OptionError",
    "ReadOptions",
    "Selection",
    "StartSpec",
    "WriteOptions",
    "parse_read_options",
    "parse_write_options",
]

DEFAULT_SERVICE_URL: Final = "pulsar://127.0.0.1:6650"
EARLIEST_NAME: Final = "earliest"
LATEST_NAME: Final = "latest"


class OptionError(ValueError):
    """An option of the `mop` data source is unknown, missing or has a bad value."""


@dataclass(frozen=True, slots=True)
class Selection:
    """Which topics to read: exact names (MQTT or Pulsar), MQTT filters, a Pulsar regex."""

    names: tuple[str, ...] = ()
    filters: tuple[str, ...] = ()
    pattern: str | None = None

    @property
    def needs_listing(self) -> bool:
        """True when the topics can only be found by listing a namespace."""
        return bool(self.filters) or self.pattern is not None


@dataclass(frozen=True, slots=True)
class StartSpec:
    """Where each topic starts (or ends): `default` for every topic `per_topic` does not name.

    Values are "earliest", "latest" or a position (a message id).
    """

    default: str
    per_topic: tuple[tuple[str, str | MessageId], ...] = ()

    def for_topic(self, topic: str, parent: str | None = None) -> str | MessageId:
        """The value for `topic`; a partition of a partitioned topic may be named by its
        `parent`."""
        for name, value in self.per_topic:
            if name in (topic, parent):
                return value
        return self.default

    def position(self, topic: str, parent: str, last: MessageId | None) -> MessageId:
        """The position this gives `topic` (whose name without partition is `parent`) when its
        last message is `last` (None: it has none)."""
        value = self.for_topic(topic, parent)
        if isinstance(value, MessageId):
            return value
        if value == EARLIEST_NAME or last is None:
            return EARLIEST
        return last


@dataclass(frozen=True, slots=True)
class ClientSecurity:
    """How the data source's connections prove who they are and check the brokers: one of a
    token (`token`, or `token_file`, read again whenever a connection is made) or a user name
    and password, and for pulsar+ssl:// the CA file to trust (None: the system's) and whether
    the broker's host name must match its certificate. Secrets stay out of `repr`."""

    token: str | None = field(default=None, repr=False)
    token_file: str | None = None
    username: str | None = None
    password: str | None = field(default=None, repr=False)
    tls_trust_certs_file_path: str | None = None
    tls_validate_hostname: bool = True

    @property
    def method(self) -> str | None:
        """The authentication method: "token", "basic" or None."""
        if self.token is not None or self.token_file is not None:
            return "token"
        return "basic" if self.username is not None else None


NO_SECURITY: Final = ClientSecurity()


@dataclass(frozen=True, slots=True)
class ReadOptions:
    service_url: str
    selection: Selection
    starting: StartSpec
    ending: StartSpec
    tenant: str = "public"
    namespace: str = "default"
    max_records_per_trigger: int | None = None
    max_records_per_partition: int | None = None
    subscription: str | None = None
    timeout_ms: int = 30_000
    security: ClientSecurity = NO_SECURITY


@dataclass(frozen=True, slots=True)
class WriteOptions:
    service_url: str
    topic: str | None
    tenant: str = "public"
    namespace: str = "default"
    producer_name: str = "spark"
    batching_max_messages: int = 1000
    batching_max_publish_delay_ms: int = 10
    timeout_ms: int = 30_000
    security: ClientSecurity = NO_SECURITY


# Spark hides the values of options whose names match spark.redaction.regex (by default
# "secret", "password", "token"...) in plans and its UI: both secrets' names do.
_SECURITY: Final = frozenset(
    {
        "auth_token",
        "auth_token_file",
        "auth_username",
        "auth_password",
        "tls_trust_certs_file_path",
        "tls_validate_hostname",
    }
)
_COMMON: Final = frozenset({"service_url", "tenant", "namespace", "timeout_ms"}) | _SECURITY
_READ: Final = _COMMON | {
    "topics",
    "topics_pattern",
    "path",
    "starting_offsets",
    "ending_offsets",
    "max_records_per_trigger",
    "max_records_per_partition",
    "subscription",
}
_WRITE: Final = _COMMON | {
    "topic",
    "path",
    "producer_name",
    "batching_max_messages",
    "batching_max_publish_delay_ms",
}
# Spark adds these to a streaming sink's options on its own.
_SPARK_WRITE: Final = frozenset({"checkpointlocation", "queryname"})


def parse_read_options(options: Mapping[str, str], *, streaming: bool) -> ReadOptions:
    """Options of `spark.read` / `spark.readStream` (`streaming` changes the defaults)."""
    opts = _lowered(options)
    _reject_unknown(opts, _READ)
    tenant = opts.get("tenant", "public")
    namespace = opts.get("namespace", "default")
    if streaming and "ending_offsets" in opts:
        raise OptionError("ending_offsets applies to batch reads only")
    # Kafka's convention: a batch job reads what is there, a stream what comes next.
    starting = _start_spec(
        opts.get("starting_offsets", LATEST_NAME if streaming else EARLIEST_NAME),
        "starting_offsets",
        tenant,
        namespace,
    )
    ending = _start_spec(
        opts.get("ending_offsets", LATEST_NAME), "ending_offsets", tenant, namespace
    )
    if EARLIEST_NAME in (ending.default, *(value for _, value in ending.per_topic)):
        raise OptionError("ending_offsets cannot be 'earliest'")
    if not streaming:
        for name in ("max_records_per_trigger", "subscription"):
            if name in opts:
                raise OptionError(f"{name} applies to streaming reads only")
    limit = opts.get("max_records_per_trigger")
    split = opts.get("max_records_per_partition")
    return ReadOptions(
        service_url=_service_url(opts),
        selection=_selection(opts),
        starting=starting,
        ending=ending,
        tenant=tenant,
        namespace=namespace,
        max_records_per_trigger=(
            None if limit is None else _positive(limit, "max_records_per_trigger")
        ),
        max_records_per_partition=(
            None if split is None else _positive(split, "max_records_per_partition")
        ),
        subscription=opts.get("subscription") or None,
        timeout_ms=_positive(opts.get("timeout_ms", "30000"), "timeout_ms"),
        security=_security(opts),
    )


def parse_write_options(options: Mapping[str, str]) -> WriteOptions:
    """Options of `df.write` / `df.writeStream`."""
    opts = _lowered(options)
    _reject_unknown({k: v for k, v in opts.items() if k not in _SPARK_WRITE}, _WRITE)
    if "topic" in opts and "path" in opts:
        raise OptionError("give the topic either as the 'topic' option or as save(path), not both")
    topic = opts.get("topic") or opts.get("path") or None
    tenant = opts.get("tenant", "public")
    namespace = opts.get("namespace", "default")
    return WriteOptions(
        service_url=_service_url(opts),
        topic=None if topic is None else mqtt_to_pulsar(topic, tenant=tenant, namespace=namespace),
        tenant=tenant,
        namespace=namespace,
        producer_name=opts.get("producer_name", "spark"),
        batching_max_messages=_positive(
            opts.get("batching_max_messages", "1000"), "batching_max_messages"
        ),
        batching_max_publish_delay_ms=_positive(
            opts.get("batching_max_publish_delay_ms", "10"), "batching_max_publish_delay_ms"
        ),
        timeout_ms=_positive(opts.get("timeout_ms", "30000"), "timeout_ms"),
        security=_security(opts),
    )


# --- parts ---------------------------------------------------------------------------------------


def _lowered(options: Mapping[str, str]) -> dict[str, str]:
    return {str(key).lower(): str(value) for key, value in options.items()}


def _reject_unknown(opts: Mapping[str, str], known: frozenset[str]) -> None:
    unknown = sorted(set(opts) - known)
    if unknown:
        raise OptionError(
            f"unknown option(s) {', '.join(unknown)} for format 'mop'; known: "
            + ", ".join(sorted(known))
        )


def _service_url(opts: Mapping[str, str]) -> str:
    url = opts.get("service_url", DEFAULT_SERVICE_URL).strip()
    if not url.startswith(("pulsar://", "pulsar+ssl://")):
        raise OptionError(f"service_url must start with pulsar:// or pulsar+ssl://, not {url!r}")
    return url


def _security(opts: Mapping[str, str]) -> ClientSecurity:
    """The credentials and TLS trust the options give. Errors name options, never values."""
    token = opts.get("auth_token") or None
    token_file = opts.get("auth_token_file") or None
    username = opts.get("auth_username") or None
    password = opts.get("auth_password")
    if token is not None and token_file is not None:
        raise OptionError("give auth_token or auth_token_file, not both")
    if (token or token_file) and (username or password is not None):
        raise OptionError("give a token (auth_token*) or a user (auth_username), not both")
    if (username is None) != (password is None):
        raise OptionError("auth_username and auth_password go together")
    if username is not None and ":" in username:
        raise OptionError("auth_username must not contain ':'")
    if token_file is not None:
        _readable(token_file, "auth_token_file")
    trust = opts.get("tls_trust_certs_file_path") or None
    if trust is not None:
        _readable(trust, "tls_trust_certs_file_path")
    return ClientSecurity(
        token=token,
        token_file=token_file,
        username=username,
        password=password,
        tls_trust_certs_file_path=trust,
        tls_validate_hostname=_boolean(
            opts.get("tls_validate_hostname", "true"), "tls_validate_hostname"
        ),
    )


def _readable(path: str, name: str) -> None:
    if not Path(path).is_file():
        raise OptionError(f"{name}: no file at {path}")


def _boolean(text: str, name: str) -> bool:
    word = text.strip().lower()
    if word not in ("true", "false"):
        raise OptionError(f"{name} must be true or false, not {text!r}")
    return word == "true"


def _positive(text: str, name: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise OptionError(f"{name} must be an integer, not {text!r}") from None
    if value <= 0:
        raise OptionError(f"{name} must be > 0, not {value}")
    return value


def _topic_list(text: str, name: str) -> list[str]:
    """A JSON list of strings, or a comma-separated list (MQTT names may hold commas: use JSON)."""
    text = text.strip()
    if text.startswith("["):
        try:
            items = json.loads(text)
        except ValueError as exc:
            raise OptionError(f"{name} is not a JSON list: {exc}") from None
        if not isinstance(items, list) or not all(isinstance(i, str) for i in items):
            raise OptionError(f"{name} must be a JSON list of strings")
        return [item for item in items if item]
    return [item.strip() for item in text.split(",") if item.strip()]


def _selection(opts: Mapping[str, str]) -> Selection:
    if "topics" in opts and "path" in opts:
        raise OptionError("give the topics either as the 'topics' option or as load(path)")
    entries = _topic_list(opts.get("topics") or opts.get("path") or "", "topics")
    pattern = opts.get("topics_pattern") or None
    if not entries and pattern is None:
        raise OptionError(
            "say what to read: the 'topics' option (names or MQTT filters) or"
            " 'topics_pattern' (a Pulsar regex)"
        )
    if entries and pattern is not None:
        raise OptionError("'topics' and 'topics_pattern' exclude each other")
    if pattern is not None:
        _check_pattern(pattern)
    filters = tuple(e for e in entries if _is_filter(e))
    names = tuple(e for e in entries if not _is_filter(e))
    for topic_filter in filters:
        try:
            validate_topic_filter(topic_filter)
        except TopicError as exc:
            raise OptionError(f"topics: {exc}") from None
    return Selection(names=names, filters=filters, pattern=pattern)


def _is_filter(entry: str) -> bool:
    # MQTT topic names cannot hold wildcards; Pulsar names are given with their scheme.
    return ("+" in entry or "#" in entry) and not entry.startswith(
        ("persistent://", "non-persistent://")
    )


def _check_pattern(pattern: str) -> None:
    try:
        re.compile(pattern)
    except re.error as exc:
        raise OptionError(f"topics_pattern is not a regular expression: {exc}") from None
    if not re.match(r"(non-)?persistent://[^/]+/[^/]+/", pattern):
        raise OptionError(
            "topics_pattern must name its namespace, as Pulsar requires:"
            f" 'persistent://tenant/namespace/<regex>', not {pattern!r}"
        )


def _start_spec(text: str, name: str, tenant: str, namespace: str) -> StartSpec:
    text = text.strip()
    if text.lower() in (EARLIEST_NAME, LATEST_NAME):
        return StartSpec(text.lower())
    try:
        loaded = json.loads(text)
    except ValueError:
        raise OptionError(
            f"{name} must be 'earliest', 'latest' or a JSON object of topic -> position,"
            f" not {text!r}"
        ) from None
    if not isinstance(loaded, dict):
        raise OptionError(f"{name} must be a JSON object of topic -> position")
    per_topic: list[tuple[str, str | MessageId]] = []
    for topic, value in loaded.items():
        pulsar_topic = mqtt_to_pulsar(str(topic), tenant=tenant, namespace=namespace)
        word = str(value).strip().lower()
        if word in (EARLIEST_NAME, LATEST_NAME):
            per_topic.append((pulsar_topic, word))
            continue
        try:
            per_topic.append((pulsar_topic, parse_position(str(value))))
        except ValueError as exc:
            raise OptionError(f"{name}[{topic!r}]: {exc}") from None
    default = EARLIEST_NAME if name == "starting_offsets" else LATEST_NAME
    return StartSpec(default, tuple(sorted(per_topic, key=lambda item: item[0])))
