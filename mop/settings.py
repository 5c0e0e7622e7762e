"""Typed, frozen settings for every part of a node.

`mop.config` builds these from the settings files and the environment; everything else receives
them as arguments (there is no global configuration object).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

Mode = Literal["merged", "separated"]
FsyncPolicy = Literal["always", "interval", "never"]


@dataclass(frozen=True, slots=True)
class TlsSettings:
    certfile: str | None = None
    keyfile: str | None = None
    cafile: str | None = None
    require_client_cert: bool = False

    @property
    def enabled(self) -> bool:
        return self.certfile is not None and self.keyfile is not None


@dataclass(frozen=True, slots=True)
class MqttSettings:
    host: str = "127.0.0.1"
    port: int = 1883
    ws_enabled: bool = False
    ws_port: int = 8083
    ws_path: str = "/mqtt"
    tls_port: int = 8883
    tls: TlsSettings = field(default_factory=TlsSettings)
    # Limits, with the defaults production brokers ship.
    max_connections: int = 100_000
    max_packet_size: int = 1_048_576
    max_inflight: int = 32
    max_queued_messages: int = 1000
    max_topic_length: int = 65535
    max_topic_levels: int = 128
    max_subscriptions_per_client: int = 10_000
    max_keep_alive: int = 65535
    topic_alias_maximum: int = 10
    connect_timeout: float = 10.0
    # Session expiry for MQTT 3.1.1 persistent sessions (which carry no expiry of their own),
    # and the cap applied to what MQTT 5 clients ask for.
    default_session_expiry: int = 86_400
    max_session_expiry: int = 0xFFFFFFFF
    retain_available: bool = True
    sys_interval: float = 10.0


@dataclass(frozen=True, slots=True)
class PulsarSettings:
    host: str = "127.0.0.1"
    port: int = 6650


@dataclass(frozen=True, slots=True)
class AdminSettings:
    host: str = "127.0.0.1"
    port: int = 8080


@dataclass(frozen=True, slots=True)
class ClusterSettings:
    service_url: str | None = None
    brokers: tuple[str, ...] = ()
    advertised_url: str | None = None


@dataclass(frozen=True, slots=True)
class StorageSettings:
    fsync: FsyncPolicy = "always"
    fsync_interval: float = 0.05
    segment_bytes: int = 64 * 1024 * 1024
    retention_bytes: int = 0  # per topic; 0 = unlimited
    retention_seconds: int = 0  # 0 = unlimited


@dataclass(frozen=True, slots=True)
class Settings:
    mode: Mode = "merged"
    data_dir: str = "./data"
    protocols: tuple[str, ...] = ("mqtt", "pulsar")
    default_tenant: str = "public"
    default_namespace: str = "default"
    log_level: str = "INFO"
    mqtt: MqttSettings = field(default_factory=MqttSettings)
    pulsar: PulsarSettings = field(default_factory=PulsarSettings)
    admin: AdminSettings = field(default_factory=AdminSettings)
    cluster: ClusterSettings = field(default_factory=ClusterSettings)
    storage: StorageSettings = field(default_factory=StorageSettings)
