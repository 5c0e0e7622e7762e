"""Typed, frozen settings for every part of a node.

`mop.config` builds these from the settings files and the environment; everything else receives
them as arguments (there is no global configuration object).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Final, Literal

Mode = Literal["merged", "separated"]
# Field metadata of a setting that is a secret: never in a repr, hidden by `mop config`.
SECRET: Final = MappingProxyType({"secret": True})


def _no_table() -> Mapping[str, Any]:
    """An empty table setting. Tables are read-only (`mop.config` wraps them too); no mapping
    is hashable, so such fields stay out of the settings' hash (equal settings still hash
    equal: the other fields decide)."""
    return MappingProxyType({})


FsyncPolicy = Literal["always", "interval", "never"]
LogFormat = Literal["text", "json"]
QuotaPolicyName = Literal[
    "producer_request_hold", "producer_exception", "consumer_backlog_eviction"
]
# Pulsar's schema compatibility strategies (see `mop.schemas.Compatibility`).
SchemaCompatibility = Literal[
    "ALWAYS_INCOMPATIBLE",
    "ALWAYS_COMPATIBLE",
    "BACKWARD",
    "FORWARD",
    "FULL",
    "BACKWARD_TRANSITIVE",
    "FORWARD_TRANSITIVE",
    "FULL_TRANSITIVE",
]


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
    # MQTT over WebSocket over TLS; used when ws_enabled and `tls` has a certfile and keyfile.
    wss_port: int = 8084
    tls_port: int = 8883
    tls: TlsSettings = field(default_factory=TlsSettings)
    # Limits, with the defaults production brokers ship.
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
    # Whether clients may publish to `$` topics other than `$SYS/...` and `$share/...`.
    publish_dollar_topics: bool = True
    sys_interval: float = 10.0
    # Client connected/disconnected events under `$SYS/brokers/{node}/clients/{clientid}/...`.
    sys_events: bool = False
    # The {node} of those topics; unset: "mop@" and the host name.
    sys_node_name: str | None = None
    # Separated mode: seconds a proxy may send no heartbeat before the others take it for dead
    # and the sessions of its clients go offline (their wills, their expiry).
    node_timeout: float = 10.0


@dataclass(frozen=True, slots=True)
class LimitsSettings:
    """Limits of the whole node, whichever protocol its clients speak."""

    # Client connections at once, of every protocol together.
    max_connections: int = 100_000
    # New connections each listener accepts a second (0: no limit), in bursts of up to
    # `connection_burst` (0: one second's worth); the others are refused before any protocol
    # work.
    connection_rate: float = 0.0
    connection_burst: int = 0
    # Messages (MQTT PUBLISH, Pulsar messages) and bytes each client may send a second (0: no
    # limit), with their bursts (0: one second's worth). A client over its rate is not read
    # from until it is back within it: TCP pushes back, nothing is dropped.
    client_message_rate: float = 0.0
    client_message_burst: int = 0
    client_byte_rate: float = 0.0
    client_byte_burst: int = 0
    # Memory (the node's RSS, once it gave back what it freed) at which it pushes back on
    # publishers and refuses new MQTT clients, until it is below the low mark: up to 1 a
    # fraction of the machine's memory, above 1 a number of bytes (high 0: no mark; low 0:
    # 90% of the high mark).
    memory_high_watermark: float = 0.0
    memory_low_watermark: float = 0.0
    # Seconds between samples of the node's memory.
    memory_check_interval: float = 0.5
    # Merged mode: payload bytes queued for one subscriber (beyond its receive queue) up to
    # which the publishers whose messages it has not taken yet wait for it, their reads paused,
    # instead of its QoS 0 messages being dropped (0: nobody waits) ...
    subscriber_backlog_bytes: int = 8 * 1024 * 1024
    # ... unless it took nothing for this many seconds while they waited (its client reads
    # nothing): then it is stalled, and nobody waits for it until it takes messages again.
    subscriber_stall_timeout: float = 1.0


@dataclass(frozen=True, slots=True)
class PulsarSettings:
    host: str = "127.0.0.1"
    port: int = 6650
    # Pulsar over TLS (pulsar+ssl://); used when `tls` has a certfile and a keyfile.
    tls_port: int = 6651
    tls: TlsSettings = field(default_factory=TlsSettings)
    # Seconds between checks of each connection's credentials: an expired token is asked to
    # refresh (AuthChallenge), and a connection that cannot is closed.
    auth_refresh_interval: float = 60.0
    # The schema compatibility rule of namespaces that set none (Pulsar's
    # schemaCompatibilityStrategy): which new schema may follow a topic's schemas.
    schema_compatibility: SchemaCompatibility = "FULL"
    # The largest schema definition (bytes) a producer or consumer may bring; larger ones are
    # refused (IncompatibleSchema). Comparing Avro definitions costs about the square of their
    # field count, so this bounds the work one client can ask of the broker.
    schema_max_bytes: int = 65536
    # Partitioned topics this node declares at start: name (a Pulsar topic name, or a local
    # name of the default namespace) -> number of partitions. Created when missing, grown when
    # fewer; more are never taken away. Topics stay non-partitioned unless named here or
    # created through the admin API (PUT /admin/v2/persistent/{tenant}/{ns}/{topic}/partitions).
    partitioned_topics: Mapping[str, int] = field(default_factory=_no_table, hash=False)
    # Advertised listeners: name -> "pulsar://host:port" (or "pulsar+ssl://host:port", or one of
    # each, comma-separated). A lookup naming a listener (pulsar-client's listener_name) gets
    # its URLs; a lookup naming no listener gets the URL of the listener it came in on.
    advertised_listeners: Mapping[str, str] = field(default_factory=_no_table, hash=False)


@dataclass(frozen=True, slots=True)
class GrpcSettings:
    host: str = "127.0.0.1"
    port: int = 50051
    # gRPC over TLS (HTTP/2 negotiated with ALPN "h2"); used when `tls` has a certfile and a
    # keyfile, with client certificates (mTLS) when it has a cafile.
    tls_port: int = 50052
    tls: TlsSettings = field(default_factory=TlsSettings)
    # The largest message (bytes, after decompression) a call may send or receive; larger
    # ones end the call with RESOURCE_EXHAUSTED. Pulsar's default message size.
    max_message_bytes: int = 5 * 1024 * 1024
    # How many calls (HTTP/2 streams) one connection may have open at once.
    max_concurrent_streams: int = 100
    # Seconds a connection may stay silent before the node PINGs it (0: never), and how long
    # the node then waits for the answer before it closes the connection.
    keepalive_interval: float = 60.0
    keepalive_timeout: float = 20.0


@dataclass(frozen=True, slots=True)
class JwtSettings:
    """JSON Web Tokens as credentials (MQTT password, Pulsar AuthenticationToken)."""

    # HS256/384/512: the shared secret (base64 when `secret_base64`, as Pulsar's tokens use).
    secret: str | None = field(default=None, repr=False, metadata=SECRET)
    secret_base64: bool = False
    # RS256/ES256 (and RS/ES/PS 384/512): a PEM public key file, or a JWKS file of keys.
    public_key_file: str | None = None
    jwks_file: str | None = None
    # Algorithms accepted; HS* only with a secret, the others only with public keys.
    algorithms: tuple[str, ...] = ("HS256", "HS384", "HS512", "RS256", "ES256")
    # Checked when set: the token's `iss` must be this, its `aud` must contain this.
    issuer: str | None = None
    audience: str | None = None
    # The claim that names the user (the Pulsar role).
    username_claim: str = "sub"
    # The claim that may carry ACL rules (EMQX's formats); "" turns them off.
    acl_claim: str = "acl"
    # Seconds of clock difference tolerated on `exp` and `nbf`.
    leeway: float = 0.0

    @property
    def enabled(self) -> bool:
        return bool(self.secret or self.public_key_file or self.jwks_file)


@dataclass(frozen=True, slots=True)
class FlappingSettings:
    """A client id that connects too often in a window is banned for a while (EMQX's rule and
    defaults)."""

    enabled: bool = False
    max_count: int = 15
    window: float = 60.0
    ban_time: float = 300.0


@dataclass(frozen=True, slots=True)
class AuthSettings:
    # Whether a client that presents no credentials may connect (as the anonymous user).
    allow_anonymous: bool = True
    # mosquitto-compatible password file ($7$ PBKDF2-SHA512 lines, `mop passwd`).
    password_file: str | None = None
    # mosquitto-syntax ACL file; once set, whatever it does not allow is denied.
    acl_file: str | None = None
    # The providers tried in order for credentials: "password_file", "jwt", "certificate".
    providers: tuple[str, ...] = ("password_file", "jwt", "certificate")
    # Where a client certificate's user name comes from: its subject's CN, or its first SAN.
    certificate_identity: Literal["cn", "san"] = "cn"
    # Users (roles) that are proxies of this deployment: brokers take their requests on
    # behalf of the clients the proxies authorized. Nobody else gets these powers.
    proxy_roles: tuple[str, ...] = ()
    # Seconds between checks of whether the password, ACL or JWT key files changed.
    reload_interval: float = 2.0
    # Failed authentications from one address within failure_window before the address is
    # refused for failure_ban seconds (0: no limit).
    max_failures: int = 10
    failure_window: float = 60.0
    failure_ban: float = 60.0
    jwt: JwtSettings = field(default_factory=JwtSettings)
    flapping: FlappingSettings = field(default_factory=FlappingSettings)


@dataclass(frozen=True, slots=True)
class AdminSettings:
    """The admin HTTP listener: /metrics, /healthz, /readyz, the admin API and the dashboard."""

    enabled: bool = True
    host: str = "127.0.0.1"
    port: int = 8080
    # Users (roles) allowed to use the admin API and the dashboard once authentication is
    # configured (`auth.password_file` or `auth.jwt`); without it, the API is open to whoever
    # reaches `host` (loopback by default).
    roles: tuple[str, ...] = ("admin",)
    # Host names (without port) requests may name in `Host`, "*" for any: the defence against
    # DNS rebinding. Empty: on a loopback `host`, localhost, 127.0.0.1 and [::1] (any port);
    # on any other, every host. /healthz and /readyz answer any host.
    allowed_hosts: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class TelemetrySettings:
    """OpenTelemetry: metrics (always served on the admin port as Prometheus text), an optional
    OTLP export, and traces."""

    # OTLP/HTTP endpoint for metrics (e.g. "http://127.0.0.1:4318/v1/metrics"); unset: none.
    otlp_metrics_endpoint: str | None = None
    # Seconds between OTLP metric exports.
    otlp_interval: float = 15.0
    # Fraction of published messages traced (0 = tracing off, 1 = every message).
    trace_sample_ratio: float = 0.0
    # OTLP/HTTP endpoint for spans (e.g. "http://127.0.0.1:4318/v1/traces"); unset: none.
    otlp_traces_endpoint: str | None = None
    # How many subscription backlogs (the largest, by subscription and topic) get a series of
    # their own in the metrics (0 = none): bounded, never one per client.
    backlog_top: int = 10
    # One publish (or delivery) in this many is timed for the latency histograms (1 = all).
    latency_sampling: int = 16


@dataclass(frozen=True, slots=True)
class ClusterAuthSettings:
    """How a separated proxy authenticates to the brokers (one of its `auth.proxy_roles`)."""

    # "none", "token" (a JWT, like pulsar-client's AuthenticationToken) or "basic".
    method: Literal["none", "token", "basic"] = "none"
    token: str | None = field(default=None, repr=False, metadata=SECRET)
    # A file holding the token (read at start; preferred over `token` in a settings file).
    token_file: str | None = None
    username: str | None = None
    password: str | None = field(default=None, repr=False, metadata=SECRET)


@dataclass(frozen=True, slots=True)
class ClusterSettings:
    # Separated mode: the brokers, "pulsar://host1:6650,host2:6650" (required there).
    service_url: str | None = None
    # Separated mode: the brokers' HTTP admin service, for the admin API's topic stats and
    # deletion: Apache Pulsar's webServiceUrl ("http://pulsar:8080"), or each mop broker's
    # admin URL, comma-separated ("http://broker-1:8080,http://broker-2:8080").
    # On a member of a mop broker cluster: every member's admin URL, so that the member keeping a
    # partitioned topic deletes the partitions the others hold.
    admin_url: str | None = None
    brokers: tuple[str, ...] = ()
    advertised_url: str | None = None
    # Separated mode: seconds between the topic-list polls that find new topics for wildcard
    # subscriptions (pulsar-client counts whole seconds).
    pattern_discovery: int = 1
    # Seconds pulsar-client gives a lookup, subscribe, producer or close before failing it.
    operation_timeout: float = 30.0
    # Seconds to open a TCP connection to a broker.
    connect_timeout: float = 10.0
    # Seconds a qos >= 1 publish waits for its receipt (retried across reconnects) before it
    # fails.
    send_timeout: float = 30.0
    # Seconds a client id taken over waits for the proxy that held it to let go.
    fence_timeout: float = 10.0
    # Seconds publishes wait to share one batch with others to the same topic (0 = no batching).
    batching_delay: float = 0.001
    # Messages pulsar-client prefetches per subscribed topic.
    receiver_queue: int = 500
    # A node's own credentials towards the brokers (a proxy's, or a broker's to its peers).
    auth: ClusterAuthSettings = field(default_factory=ClusterAuthSettings)
    # PEM CA bundle that verifies brokers on pulsar+ssl:// URLs (unset: the system's CAs).
    tls_cafile: str | None = None


@dataclass(frozen=True, slots=True)
class StorageSettings:
    fsync: FsyncPolicy = "always"
    fsync_interval: float = 0.05
    segment_bytes: int = 64 * 1024 * 1024
    # The least time a new topic, or one that no subscription holds, keeps what is written to
    # it whatever its retention policy, so that consumers which discover topics by polling
    # (pattern consumers, proxies) still find it.
    unsubscribed_grace: float = 5.0


@dataclass(frozen=True, slots=True)
class NamespaceRetentionSettings:
    """One namespace's retention policy, overriding `retention.time_seconds`/`size_bytes`."""

    namespace: str = ""
    time_seconds: int = -1
    size_bytes: int = -1


@dataclass(frozen=True, slots=True)
class RetentionSettings:
    """Pulsar's retention policy (`mop.retention`): what a topic keeps once every subscription
    acknowledged it, or while it has none. -1: no limit, 0: nothing."""

    time_seconds: int = 24 * 3600
    size_bytes: int = 256 * 1024 * 1024  # per topic
    # The least seconds between two checks of an idle topic's history against the time
    # limit (checked when its oldest kept message ages out).
    check_interval: float = 10.0
    namespaces: tuple[NamespaceRetentionSettings, ...] = ()


@dataclass(frozen=True, slots=True)
class BacklogQuotaSettings:
    """Pulsar's backlog quotas (`mop.backlog_quota`), the default of every namespace: limits
    on each topic's unacknowledged backlog. -1: no limit."""

    limit_bytes: int = -1
    limit_seconds: int = -1
    policy: QuotaPolicyName = "producer_request_hold"


@dataclass(frozen=True, slots=True)
class Settings:
    mode: Mode = "merged"
    data_dir: str = "./data"
    protocols: tuple[str, ...] = ("mqtt", "pulsar")
    default_tenant: str = "public"
    default_namespace: str = "default"
    log_level: str = "INFO"
    # "text" lines, or "json": one object per line (`mop.observability.logs`).
    log_format: LogFormat = "text"
    mqtt: MqttSettings = field(default_factory=MqttSettings)
    pulsar: PulsarSettings = field(default_factory=PulsarSettings)
    grpc: GrpcSettings = field(default_factory=GrpcSettings)
    admin: AdminSettings = field(default_factory=AdminSettings)
    telemetry: TelemetrySettings = field(default_factory=TelemetrySettings)
    cluster: ClusterSettings = field(default_factory=ClusterSettings)
    storage: StorageSettings = field(default_factory=StorageSettings)
    retention: RetentionSettings = field(default_factory=RetentionSettings)
    backlog_quota: BacklogQuotaSettings = field(default_factory=BacklogQuotaSettings)
    limits: LimitsSettings = field(default_factory=LimitsSettings)
    auth: AuthSettings = field(default_factory=AuthSettings)
