"""The scenarios of the MQTT comparison: what load each puts on a broker and which numbers it
reports. Every scenario is bounded in message count and in time (`Sizes`).
"""

from __future__ import annotations

import resource
import socket
import struct
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from brokers import BrokerUnderTest
from loadgen import hold_connections, run


@dataclass(frozen=True)
class Sizes:
    """Counts and time bounds of one bench mode (full, quick, smoke)."""

    duration: float  # seconds of sending in a throughput scenario
    count: int  # most messages a throughput scenario sends
    fanout_subs: int = 100
    fanin_pubs: int = 100
    latency_rate: float = 5000.0
    latency_low_rate: float = 1000.0  # the paced QoS 1 flow's other, lighter rate
    latency_duration: float = 3.0
    latency_warmup: float = 0.5
    idle_conns: int = 10_000
    many_conns: int = 100_000
    retained_topics: int = 10_000
    retained_branches: int = 100
    retained_subs: int = 1_000
    queued: int = 10_000
    # Seconds of full-speed QoS 1 in each half of the stalled-subscriber scenario: a session
    # that stops reading costs the broker more the longer it stays stalled.
    stall_duration: float = 20.0
    timeout: float = 30.0  # the most one run may take, setup included
    # The most opening the idle connections may take: a separated proxy sets up state in the
    # brokers for every client (a client id lease), so it connects at a few hundred a second.
    conns_timeout: float = 90.0
    # The most the retained scenario may take, setup included: through a separated proxy every
    # retained publish also writes the retained table in the brokers, and every wildcard
    # subscriber gets a consumer on each matching topic, so it runs for minutes there.
    retained_timeout: float = 240.0


FULL = Sizes(duration=3.0, count=2_000_000)
QUICK = Sizes(
    duration=1.0,
    count=500_000,
    latency_duration=1.5,
    idle_conns=2_000,
    retained_topics=2_000,
    retained_branches=20,
    retained_subs=200,
    queued=2_000,
    stall_duration=5.0,
    timeout=20.0,
    conns_timeout=30.0,
    retained_timeout=120.0,
)
SMOKE = Sizes(
    duration=0.4,
    count=20_000,
    fanout_subs=10,
    fanin_pubs=10,
    latency_rate=1000.0,
    latency_low_rate=500.0,
    latency_duration=0.5,
    latency_warmup=0.1,
    idle_conns=100,
    retained_topics=100,
    retained_branches=10,
    retained_subs=10,
    queued=100,
    stall_duration=0.4,
    timeout=10.0,
    conns_timeout=10.0,
    retained_timeout=40.0,
)


@dataclass(frozen=True)
class Metric:
    key: str
    label: str  # the row of the table
    kind: str  # rate | us | s | kb | count: how values are printed
    higher_is_better: bool


@dataclass
class RunContext:
    broker: BrokerUnderTest
    loadgen: Path
    sizes: Sizes
    prefix: str  # unique per run: topics and client ids never meet an earlier run's

    def ports(self) -> dict[str, int]:
        """The generator's port options: subscribers (and every other idle connection) go to
        the broker's second node when it has one (a separated deployment's second proxy)."""
        if self.broker.sub_port == self.broker.port:
            return {}
        return {"port2": self.broker.sub_port}


@dataclass
class RunResult:
    values: dict[str, float | None]
    detail: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    marked: list[str] = field(default_factory=list)  # metrics to flag: rate not sustained


class Skipped(Exception):
    """The scenario cannot run on this machine; the message says why."""


@dataclass(frozen=True)
class Scenario:
    key: str
    title: str
    metrics: tuple[Metric, ...]
    run: Callable[[RunContext], RunResult]
    expected_s: float  # rough wall time of one run, for the plan printed before the bench
    # Whether the trio floor (bench/floor_server.py) runs it: the connection scenarios and the
    # message flows it relays; not those that need retained messages or sessions, which it
    # does not keep.
    floor: bool = False


def _loss_notes(out: dict[str, Any]) -> list[str]:
    notes = []
    if out.get("error"):
        notes.append(str(out["error"]))
    expected, delivered = int(out.get("expected", 0)), int(out.get("delivered", 0))
    if expected and delivered < expected:
        notes.append(
            f"received {delivered} of {expected} ({100 * (1 - delivered / expected):.1f}% lost)"
        )
    if out.get("stalls"):
        notes.append(f"{out['stalls']} stalls (window full, nothing delivered for 0.5 s)")
    if out.get("failed"):
        notes.append(f"{out['failed']} connections failed")
    if out.get("lost"):
        notes.append(f"{out['lost']} connections closed by the broker")
    return notes


def _flow(ctx: RunContext, **options: Any) -> dict[str, Any]:
    s = ctx.sizes
    options.setdefault("count", s.count)
    options.setdefault("duration", s.duration)
    return run(
        ctx.loadgen,
        "flow",
        ctx.broker.port,
        prefix=ctx.prefix,
        timeout=s.timeout,
        **ctx.ports(),
        **options,
    )


def _dropped(out: dict[str, Any]) -> float | None:
    """QoS 0 messages the broker did not deliver (sent to the subscribers, never received)."""
    if out.get("error") or "expected" not in out:
        return None
    return float(max(0, int(out["expected"]) - int(out.get("delivered", 0))))


def _throughput(
    key: str, *, count_dropped: bool = False, **options: Any
) -> Callable[[RunContext], RunResult]:
    """A flow's rate as `key` ("deliveries": deliveries/s, else msgs/s); with `count_dropped`
    also the QoS 0 messages lost on the way, as "dropped"."""

    def scenario(ctx: RunContext) -> RunResult:
        if options.get("subs") == "fanout":
            opts = {**options, "subs": ctx.sizes.fanout_subs}
        elif options.get("pubs") == "fanin":
            opts = {**options, "pubs": ctx.sizes.fanin_pubs}
        else:
            opts = dict(options)
        out = _flow(ctx, **opts)
        value = out.get("deliveries_per_s" if key == "deliveries" else "msgs_per_s")
        values = {key: value if not out.get("error") else None}
        if count_dropped:
            values["dropped"] = _dropped(out)
        return RunResult(values, out, _loss_notes(out))

    return scenario


def _latency(rate_of: Callable[[Sizes], float]) -> Callable[[RunContext], RunResult]:
    """QoS 1 paced at `rate_of(sizes)` msgs/s: the rate reached, p50 and p99 latency."""

    def scenario(ctx: RunContext) -> RunResult:
        s = ctx.sizes
        rate = rate_of(s)
        total = s.latency_duration + s.latency_warmup
        out = _flow(
            ctx,
            qos=1,
            inflight=100,
            window=int(rate),
            rate=rate,
            count=int(rate * total),
            duration=total,
            warmup=s.latency_warmup,
        )
        achieved = float(out.get("msgs_per_s", 0.0))
        notes = _loss_notes(out)
        marked = []
        if achieved < 0.95 * rate:
            notes.append(f"cannot sustain {rate:.0f} msgs/s: reached {achieved:.0f}")
            marked = ["lat_p50", "lat_p99"]
        ok = not out.get("error") and out.get("lat_count", 0) > 0
        return RunResult(
            {
                "lat_rate": achieved,
                "lat_p50": out["lat_p50_us"] if ok else None,
                "lat_p99": out["lat_p99_us"] if ok else None,
            },
            out,
            notes,
            marked,
        )

    return scenario


def _latency_metrics(rate: str) -> tuple[Metric, ...]:
    return (
        _rate("lat_rate", f"QoS 1 at {rate} msgs/s: msgs/s reached"),
        Metric("lat_p50", f"QoS 1 at {rate} msgs/s: p50 latency, us", "us", False),
        Metric("lat_p99", f"QoS 1 at {rate} msgs/s: p99 latency, us", "us", False),
    )


def _settled_rss(broker: BrokerUnderTest, settle: float = 0.5) -> int:
    """RSS (of all the broker's processes) once it stops moving (a broker may still be
    allocating for the last connections)."""
    last = broker.rss_kb()
    deadline = time.monotonic() + 5 * settle
    while time.monotonic() < deadline:
        time.sleep(settle)
        now = broker.rss_kb()
        if abs(now - last) < 64:
            return now
        last = now
    return last


def _connections(count: Callable[[Sizes], int], src_ips: int) -> Callable[[RunContext], RunResult]:
    def scenario(ctx: RunContext) -> RunResult:
        n = count(ctx.sizes)
        hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
        if hard < n + 1000:
            raise Skipped(
                f"needs {n + 1000} file descriptors in the generator and in the broker; the hard "
                f"limit here is {hard} and cannot be raised without CAP_SYS_RESOURCE"
            )
        before = _settled_rss(ctx.broker)
        with hold_connections(
            ctx.loadgen,
            ctx.broker.port,
            prefix=ctx.prefix,
            conns=n,
            concurrency=64,
            src_ips=src_ips,
            timeout=ctx.sizes.conns_timeout,
            hold=60,
            **ctx.ports(),
        ) as out:
            after = _settled_rss(ctx.broker)
        connected = int(out.get("connected", 0))
        per_conn = (after - before) / connected if connected else None
        out.update(rss_before_kb=before, rss_after_kb=after)
        notes = _loss_notes(out)
        lost = int(out.get("held", {}).get("lost", out.get("lost", 0)))
        if connected < n or lost:
            notes.append(f"{connected} of {n} connected, {lost} closed by the broker")
            return RunResult({"conn_rate": None, "conn_kb": None}, out, notes)
        return RunResult({"conn_rate": out.get("connects_per_s"), "conn_kb": per_conn}, out, notes)

    return scenario


def _retained(ctx: RunContext) -> RunResult:
    s = ctx.sizes
    out = run(
        ctx.loadgen,
        "retained",
        ctx.broker.port,
        prefix=ctx.prefix,
        topics=s.retained_topics,
        branches=s.retained_branches,
        subs=s.retained_subs,
        sub_qos=0,
        inflight=100,
        concurrency=64,
        timeout=s.retained_timeout,
        drain_idle=2.0,
        **ctx.ports(),
    )
    done = not out.get("error") and out.get("delivered", 0) >= out.get("expected", 1)
    notes = _loss_notes(out)
    if not done and out.get("subscribed_s", 0) < 0:
        # Not lost: the time bound came before every subscriber had even joined.
        joined = int(out.get("connected", 1)) - 1  # the publisher's connection is one
        notes = [
            f"the run's time bound ({s.retained_timeout:.0f} s) came first: publishing the "
            f"retained topics took {out.get('setup_s', 0):.1f} s, then {joined} of "
            f"{s.retained_subs} subscribers joined and {out.get('delivered', 0)} of "
            f"{out.get('expected', 0)} retained messages arrived"
        ]
    return RunResult(
        {
            "retained_s": out["storm_s"] if done else None,
            "retained_rate": out.get("deliveries_per_s") if done else None,
        },
        out,
        notes,
    )


def _session(ctx: RunContext) -> RunResult:
    s = ctx.sizes
    out = run(
        ctx.loadgen,
        "session",
        ctx.broker.port,
        prefix=ctx.prefix,
        qos=1,
        count=s.queued,
        inflight=100,
        timeout=s.timeout + 30,
        drain_idle=2.0,
        **ctx.ports(),
    )
    done = not out.get("error") and out.get("delivered", 0) >= s.queued
    out.setdefault("expected", s.queued)
    return RunResult({"session_s": out["drain_s"] if done else None}, out, _loss_notes(out))


def _mqtt_string(text: str) -> bytes:
    raw = text.encode()
    return struct.pack("!H", len(raw)) + raw


def _mqtt_packet(first: int, body: bytes) -> bytes:
    length, size = b"", len(body)
    while True:
        size, digit = divmod(size, 128)
        length += bytes((digit | (0x80 if size else 0),))
        if not size:
            return bytes((first,)) + length + body


def _stalled_subscriber(port: int, client_id: str, topic: str, timeout: float) -> socket.socket:
    """An MQTT 3.1.1 client with a persistent session (clean session 0, no keep alive) that
    subscribes to `topic` at QoS 1, reads its SUBACK and then nothing more: the socket stays
    open with a small receive buffer, so the broker sees it stall at once."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.settimeout(timeout)
    sock.connect(("127.0.0.1", port))
    connect = _mqtt_string("MQTT") + bytes((4, 0)) + struct.pack("!H", 0) + _mqtt_string(client_id)
    subscribe = struct.pack("!H", 1) + _mqtt_string(topic) + bytes((1,))
    sock.sendall(_mqtt_packet(0x10, connect) + _mqtt_packet(0x82, subscribe))
    answer = b""
    while len(answer) < 9:  # CONNACK (4 bytes), SUBACK with one reason code (5)
        chunk = sock.recv(9 - len(answer))
        if not chunk:
            raise ConnectionError("the broker closed the stalled subscriber's connection")
        answer += chunk
    if answer[0] != 0x20 or answer[3] != 0 or answer[4] != 0x90 or answer[8] != 1:
        raise ConnectionError(f"the stalled subscriber was refused: {answer.hex()}")
    return sock


def _stalled(ctx: RunContext) -> RunResult:
    """The same full-speed QoS 1 pub -> sub flow twice on one broker: alone, then next to a
    persistent-session QoS 1 subscriber of its topic that has stopped reading."""
    s = ctx.sizes
    options: dict[str, Any] = {
        "qos": 1,
        "inflight": 100,
        "window": 1000,
        "count": 10_000_000,
        "duration": s.stall_duration,
        "timeout": s.stall_duration + s.timeout,
    }
    alone = run(ctx.loadgen, "flow", ctx.broker.port, prefix=f"{ctx.prefix}a", **options)
    sock = _stalled_subscriber(ctx.broker.port, f"{ctx.prefix}stalled", f"{ctx.prefix}b/t/0", 10)
    try:
        beside = run(ctx.loadgen, "flow", ctx.broker.port, prefix=f"{ctx.prefix}b", **options)
    finally:
        sock.close()
    notes = [f"alone: {n}" for n in _loss_notes(alone)]
    notes += [f"next to the stalled one: {n}" for n in _loss_notes(beside)]

    def ok(out: dict[str, Any], key: str) -> float | None:
        return None if out.get("error") or not out.get("lat_count") else out.get(key)

    return RunResult(
        {
            "stall_rate_base": ok(alone, "msgs_per_s"),
            "stall_rate": ok(beside, "msgs_per_s"),
            "stall_p99_base": ok(alone, "lat_p99_us"),
            "stall_p99": ok(beside, "lat_p99_us"),
        },
        {"alone": alone, "beside": beside},
        notes,
    )


def _rate(key: str, label: str) -> Metric:
    return Metric(key, label, "rate", True)


SCENARIOS: dict[str, Scenario] = {
    sc.key: sc
    for sc in (
        Scenario(
            "qos0",
            "QoS 0, 1 pub -> 1 sub",
            (_rate("msgs", "QoS 0, 1 pub -> 1 sub, msgs/s"),),
            _throughput("msgs", qos=0, window=2000),
            4,
            floor=True,
        ),
        Scenario(
            "qos1",
            "QoS 1, 1 pub (100 in flight) -> 1 sub",
            (_rate("msgs", "QoS 1, 1 pub (100 in flight) -> 1 sub, msgs/s"),),
            _throughput("msgs", qos=1, inflight=100, window=1000),
            4,
            floor=True,
        ),
        Scenario(
            "fanout",
            "fan-out QoS 0, 1 pub -> 100 subs",
            (_rate("deliveries", "fan-out QoS 0, 1 pub -> {fanout} subs, deliveries/s"),),
            _throughput("deliveries", qos=0, subs="fanout", window=200),
            4,
            floor=True,
        ),
        Scenario(
            "fanin",
            "fan-in QoS 0, 100 pubs -> 1 wildcard sub",
            (
                _rate("msgs", "fan-in QoS 0, {fanin} pubs -> 1 wildcard sub, msgs/s"),
                Metric("dropped", "fan-in QoS 0: messages dropped", "count", False),
            ),
            # Primed: measured once the wildcard subscription knows every publisher's topic
            # (a separated proxy finds new topics by polling, within cluster.pattern_discovery).
            _throughput(
                "msgs",
                count_dropped=True,
                qos=0,
                pubs="fanin",
                topic_per_pub=1,
                wildcard=1,
                window=2000,
                prime=1,
            ),
            4,
            floor=True,
        ),
        Scenario(
            "fanin-flat",
            "fan-in QoS 0, 100 pubs flat out -> 1 wildcard sub",
            (_rate("msgs", "fan-in QoS 0 flat out, {fanin} pubs -> 1 wildcard sub, msgs/s"),),
            # No window: the publishers send as fast as the broker reads them, so this is the
            # capacity (with the queueing the `fanin` window keeps out), and any QoS 0 message
            # dropped on the way shows as not delivered.
            _throughput(
                "msgs", qos=0, pubs="fanin", topic_per_pub=1, wildcard=1, window=1_000_000, prime=1
            ),
            6,
            floor=True,
        ),
        Scenario(
            "latency1k",
            "QoS 1 at a fixed 1k msgs/s",
            _latency_metrics("{low_rate}"),
            _latency(lambda s: s.latency_low_rate),
            5,
            floor=True,
        ),
        Scenario(
            "latency",
            "QoS 1 at a fixed 5k msgs/s",
            _latency_metrics("{rate}"),
            _latency(lambda s: s.latency_rate),
            5,
            floor=True,
        ),
        Scenario(
            "conns",
            "10k idle connections",
            (
                _rate("conn_rate", "{idle} idle connections: connects/s"),
                Metric("conn_kb", "{idle} idle connections: RSS per connection, KB", "kb", False),
            ),
            _connections(lambda s: s.idle_conns, src_ips=1),
            4,
            floor=True,
        ),
        Scenario(
            "qos2",
            "QoS 2, 1 pub (100 in flight) -> 1 sub",
            (_rate("msgs", "QoS 2, 1 pub (100 in flight) -> 1 sub, msgs/s"),),
            _throughput("msgs", qos=2, inflight=100, window=1000),
            4,
            floor=True,
        ),
        Scenario(
            "retained",
            "retained subscribe storm",
            (
                Metric(
                    "retained_s",
                    "{rsubs} subs join {rtopics} retained topics: s until all delivered",
                    "s",
                    False,
                ),
                _rate(
                    "retained_rate",
                    "{rsubs} subs join {rtopics} retained topics: retained deliveries/s",
                ),
            ),
            _retained,
            6,
        ),
        Scenario(
            "session",
            "persistent session drain",
            (
                Metric(
                    "session_s", "persistent session, {queued} queued QoS 1: s to drain", "s", False
                ),
            ),
            _session,
            5,
        ),
        Scenario(
            "conns100k",
            "100k idle connections",
            (
                _rate("conn_rate", "{many} idle connections: connects/s"),
                Metric("conn_kb", "{many} idle connections: RSS per connection, KB", "kb", False),
            ),
            _connections(lambda s: s.many_conns, src_ips=8),
            10,
            floor=True,
        ),
        Scenario(
            "stalled",
            "QoS 1 pub -> sub, alone and next to a stalled persistent subscriber",
            (
                _rate("stall_rate_base", "QoS 1 pub -> sub alone, msgs/s"),
                _rate("stall_rate", "QoS 1 pub -> sub next to a stalled QoS 1 session, msgs/s"),
                Metric("stall_p99_base", "QoS 1 pub -> sub alone: p99 latency, us", "us", False),
                Metric(
                    "stall_p99",
                    "QoS 1 pub -> sub next to a stalled QoS 1 session: p99 latency, us",
                    "us",
                    False,
                ),
            ),
            _stalled,
            45,
        ),
    )
}
# The stalled-subscriber scenario runs only when asked for (`--scenarios stalled`): it takes
# two flows of `Sizes.stall_duration` each.
DEFAULT_SCENARIOS = tuple(key for key in SCENARIOS if key != "stalled")
