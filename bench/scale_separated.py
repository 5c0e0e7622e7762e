"""Scale of a separated deployment: M mop broker nodes behind P MQTT proxies on loopback hold N
idle MQTT clients (a fraction with persistent sessions, one QoS 1 subscription each); then one
proxy is killed and its clients reconnect through the others.

    python bench/scale_separated.py --quick       # 4k clients, about 30 s
    python bench/scale_separated.py               # 50k clients over 4 proxies, 1 broker node

What it reports (a table on stdout, everything in bench/results/scale-<time>/results.json):
- the brokers' and the proxies' resident memory and CPU time before the clients, once all are
  connected, and after --idle seconds of idling: bytes and CPU per connection, and whether the
  brokers stay flat while the clients idle;
- after SIGKILL of one proxy: how long its clients' reconnect storm takes (first loss to last
  CONNACK), how many resumed their persistent session (CONNACK session present), failures;
- with --check-delivery K: one QoS 1 message to each of K reconnected persistent sessions,
  which must all arrive;
- how long the proxies take to close every connection when all clients leave at once.

The clients come from the C load generator (loadgen.c, mode `fleet`), several processes so that
none needs more file descriptors than the limit allows. Every wait is bounded in time.
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import resource
import signal
import subprocess
import sys
import threading
import time
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from brokers import (
    BENCH_DIR,
    BrokerError,
    BrokerSpec,
    cpu_ticks,
    free_port,
    rss_kb,
    stop_on_sigterm,
)
from loadgen import LoadgenError, build
from separated import Member, SeparatedBroker

TICK = os.sysconf("SC_CLK_TCK")
FD_MARGIN = 1000  # descriptors a process needs beyond its client sockets


class FleetError(RuntimeError):
    """A load generator process failed or did not answer in time."""


@dataclass
class Sample:
    """Resident memory (KB), CPU time (ticks) and open descriptors of each process at one
    moment."""

    at: float
    rss_kb: dict[str, int]
    cpu_ticks: dict[str, int]
    fds: dict[str, int]


def open_fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def sample(members: list[Member]) -> Sample:
    alive = [m for m in members if m.exit_code() is None]
    return Sample(
        time.monotonic(),
        {m.name: rss_kb(m.pid) for m in alive},
        {m.name: cpu_ticks(m.pid) for m in alive},
        {m.name: open_fds(m.pid) for m in alive},
    )


def log_count(members: list[Member], text: str) -> dict[str, int]:
    """How often `text` occurs in each process's log."""
    counts = {}
    for m in members:
        path = m.workdir / "broker.log"
        counts[m.name] = path.read_text(errors="replace").count(text) if path.exists() else 0
    return counts


def settled(members: list[Member], settle: float = 1.0, rounds: int = 10) -> Sample:
    """A sample once the processes' total RSS moves by less than 256 KB per `settle` seconds."""
    last = sample(members)
    for _ in range(rounds):
        time.sleep(settle)
        now = sample(members)
        if abs(sum(now.rss_kb.values()) - sum(last.rss_kb.values())) < 256:
            return now
        last = now
    return last


class Generator:
    """One `loadgen --mode fleet` process: its stdout lines arrive on a queue (a reader
    thread), commands go to its stdin."""

    def __init__(self, binary: Path, index: int, options: dict[str, Any]) -> None:
        self.index = index
        self.options = options
        argv = [str(binary), "--mode", "fleet", "--port", "0"]
        for name, value in options.items():
            argv += [f"--{name.replace('_', '-')}", str(value)]
        self.argv = argv
        self.proc = subprocess.Popen(
            argv,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            bufsize=1,
        )
        self.lines: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            if line.startswith("{"):
                self.lines.put(line)
        self.lines.put(None)

    def next(self, timeout: float) -> dict[str, Any]:
        try:
            line = self.lines.get(timeout=max(timeout, 0.01))
        except queue.Empty:
            raise FleetError(f"generator {self.index}: no answer within {timeout:.0f} s") from None
        if line is None:
            err = self.proc.stderr.read() if self.proc.stderr else ""
            raise FleetError(f"generator {self.index} ended ({self.proc.poll()}): {err}")
        result: dict[str, Any] = json.loads(line)
        return result

    def send(self, command: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(command + "\n")
        self.proc.stdin.flush()

    def stop(self) -> dict[str, Any] | None:
        """Ends the hold and returns the final status (None if the process is gone)."""
        final = None
        if self.proc.poll() is None:
            try:
                self.send("done")
                final = self.next(10)
            except (FleetError, OSError):
                pass
        if self.proc.poll() is None:
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return final


@dataclass
class Fleet:
    """The generators of a run and how their clients map to proxies: client i of generator g
    starts on proxy (offset_g + i) % proxies and is persistent as loadgen.c decides."""

    generators: list[Generator] = field(default_factory=list)

    def status(self, timeout: float = 10.0) -> list[dict[str, Any]]:
        for gen in self.generators:
            gen.send("status")
        deadline = time.monotonic() + timeout
        return [gen.next(deadline - time.monotonic()) for gen in self.generators]

    def stop(self) -> list[dict[str, Any] | None]:
        return [gen.stop() for gen in self.generators]


def persistent_ids(count: int, fraction: float) -> list[int]:
    """The persistent clients of one generator (the same rule as loadgen.c's fleet mode)."""
    return [i for i in range(count) if int((i + 1) * fraction) > int(i * fraction)]


def split(total: int, parts: int) -> list[int]:
    return [total // parts + (1 if i < total % parts else 0) for i in range(parts)]


def total(statuses: list[dict[str, Any]], key: str) -> int:
    return sum(int(s.get(key, 0)) for s in statuses)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="4k clients, shorter waits")
    parser.add_argument("--conns", type=int, help="idle MQTT clients in all (default 50000)")
    parser.add_argument("--proxies", type=int, default=4, help="MQTT proxies (default 4)")
    parser.add_argument("--brokers", type=int, default=1, help="mop broker nodes (default 1)")
    parser.add_argument(
        "--persistent-fraction",
        type=float,
        default=0.2,
        help="share of clients with a persistent session and one QoS 1 subscription (0.2)",
    )
    parser.add_argument("--per-generator", type=int, default=12_500, help="clients per loadgen")
    parser.add_argument("--src-ips", type=int, default=4, help="source addresses 127.0.0.x")
    parser.add_argument(
        "--concurrency", type=int, default=128, help="handshakes in flight per generator"
    )
    parser.add_argument("--kill", type=int, default=1, help="the proxy to kill, 1-based")
    parser.add_argument("--idle", type=float, help="seconds of idling measured (default 30)")
    parser.add_argument("--connect-timeout", type=float, default=600, help="to connect all")
    parser.add_argument("--storm-timeout", type=float, default=300, help="for the reconnects")
    parser.add_argument(
        "--check-delivery", type=int, default=100, help="reconnected sessions sent a message"
    )
    parser.add_argument("--fsync", default="never", help="the broker nodes' storage.fsync")
    parser.add_argument("--keepalive", type=int, default=3600, help="the clients' keep alive")
    parser.add_argument("--out", type=Path, help="results directory")
    args = parser.parse_args(argv)
    args.conns = args.conns or (4000 if args.quick else 50_000)
    args.idle = args.idle if args.idle is not None else (5.0 if args.quick else 30.0)
    if not 1 <= args.kill <= args.proxies or args.proxies < 2:
        parser.error("needs at least 2 proxies and --kill between 1 and --proxies")
    return args


def check_limits(args: argparse.Namespace) -> None:
    """Every generator and every surviving proxy must fit under the descriptor limit."""
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    if args.per_generator + FD_MARGIN > hard:
        raise BrokerError(f"--per-generator {args.per_generator} exceeds the fd limit {hard}")
    after_kill = -(-args.conns // (args.proxies - 1))
    if after_kill + FD_MARGIN > hard:
        raise BrokerError(
            f"{args.conns} clients over {args.proxies - 1} proxies after the kill need "
            f"{after_kill + FD_MARGIN} descriptors per proxy; the limit is {hard}"
        )
    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    if soft < hard:  # the proxies inherit it
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


def start_fleet(args: argparse.Namespace, binary: Path, ports: list[int], run_id: str) -> Fleet:
    counts = split(args.conns, -(-args.conns // args.per_generator))
    fleet = Fleet()
    offset = 0
    for g, count in enumerate(counts):
        options = {
            "prefix": f"sc{run_id}g{g}",
            "conns": count,
            "ports": ",".join(map(str, ports)),
            "port_offset": offset % len(ports),
            "persistent": args.persistent_fraction,
            "sub_qos": 1,
            "keepalive": args.keepalive,
            "concurrency": args.concurrency,
            "src_ips": args.src_ips,
            "timeout": args.connect_timeout,
            "hold": args.connect_timeout + args.storm_timeout + args.idle + 600,
            "attempt_timeout": 15,
            "retries": 30,
        }
        fleet.generators.append(Generator(binary, g, options))
        offset += count
    return fleet


def homed_on(fleet: Fleet, proxy: int, proxies: int, fraction: float) -> tuple[int, list[str]]:
    """How many clients start on `proxy` (0-based), and the topics of its persistent ones."""
    clients, topics = 0, []
    for gen in fleet.generators:
        count, offset = int(gen.options["conns"]), int(gen.options["port_offset"])
        clients += sum(1 for i in range(count) if (i + offset) % proxies == proxy)
        topics += [
            f"{gen.options['prefix']}/s/{i}"
            for i in persistent_ids(count, fraction)
            if (i + offset) % proxies == proxy
        ]
    return clients, topics


def publish_sample(port: int, topics: list[str], timeout: float) -> int:
    """One QoS 1 message to each topic through the proxy on `port`; returns how many the proxy
    acknowledged."""
    import paho.mqtt.client as mqtt

    client = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=f"scale-pub-{uuid.uuid4()}")
    client.connect_timeout = timeout
    client.connect("127.0.0.1", port, keepalive=60)
    client.loop_start()
    try:
        infos = [client.publish(topic, b"scale check", qos=1) for topic in topics]
        deadline = time.monotonic() + timeout
        for info in infos:
            info.wait_for_publish(max(deadline - time.monotonic(), 0.01))
        return sum(1 for info in infos if info.is_published())
    finally:
        client.disconnect()
        client.loop_stop()


def wait_connected(fleet: Fleet, timeout: float) -> list[dict[str, Any]]:
    deadline = time.monotonic() + timeout + 30
    return [gen.next(deadline - time.monotonic()) for gen in fleet.generators]


def wait_storm(fleet: Fleet, expected: int, timeout: float) -> list[dict[str, Any]]:
    """Status lines until every lost client is back or gave up (or the time is up)."""
    deadline = time.monotonic() + timeout
    while True:
        time.sleep(0.5)
        statuses = fleet.status()
        back = total(statuses, "reconnected") + total(statuses, "gave_up")
        if (back >= expected and total(statuses, "waiting") == 0) or time.monotonic() > deadline:
            return statuses


def wait_delivered(fleet: Fleet, want: int, timeout: float) -> int:
    deadline = time.monotonic() + timeout
    while True:
        got = total(fleet.status(), "delivered")
        if got >= want or time.monotonic() > deadline:
            return got
        time.sleep(0.2)


def leave_all(
    fleet: Fleet, deployment: SeparatedBroker, base: Sample, timeout: float
) -> dict[str, Any]:
    """Every client's connection ends at once (reset): how long until the proxies have closed
    them all (their open descriptors back to where they were before the clients), and what
    it cost them."""
    members = [m for m in deployment.members if m.exit_code() is None]
    proxies = [m.name for m in deployment.proxies if m.exit_code() is None]
    before = sample(members)
    final = fleet.stop()
    deadline = time.monotonic() + timeout
    while True:
        now = sample(members)
        left = sum(now.fds[n] - base.fds[n] for n in proxies)
        if left <= 10 * len(proxies) or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    return {
        "seconds": now.at - before.at,
        "fds_left": left,
        "proxies": cost(before, now, proxies),
        "generators": final,
    }


def cost(a: Sample, b: Sample, names: list[str]) -> dict[str, float]:
    """Memory and CPU of `names` between two samples: KB, CPU seconds, cores."""
    names = [n for n in names if n in a.rss_kb and n in b.rss_kb]
    rss = sum(b.rss_kb[n] - a.rss_kb[n] for n in names)
    cpu = sum(b.cpu_ticks[n] - a.cpu_ticks[n] for n in names) / TICK
    return {
        "rss_kb": rss,
        "rss_after_kb": sum(b.rss_kb[n] for n in names),
        "cpu_s": cpu,
        "cores": cpu / max(b.at - a.at, 1e-9),
        "seconds": b.at - a.at,
    }


def run(args: argparse.Namespace) -> dict[str, Any]:
    check_limits(args)
    binary = build(BENCH_DIR / ".deps")
    run_id = uuid.uuid4().hex[:6]
    out = args.out or BENCH_DIR / "results" / f"scale-{datetime.now(UTC):%Y%m%d-%H%M%S}"
    out.mkdir(parents=True, exist_ok=True)
    spec = BrokerSpec(
        f"mop-sep-{args.proxies}x{args.brokers}",
        "mop",
        args.fsync,
        nodes=args.brokers,
        proxies=args.proxies,
    )
    ports = [free_port() for _ in range(spec.port_count)]
    deployment = SeparatedBroker(spec, ports, out / "deployment", BENCH_DIR / ".deps")
    nodes, proxies = [m.name for m in deployment.nodes], [m.name for m in deployment.proxies]
    result: dict[str, Any] = {
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "command": " ".join([Path(sys.argv[0]).name, *sys.argv[1:]]),
        "load_before": os.getloadavg(),
        "settings": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
        "out": str(out),
    }
    fleet = Fleet()
    log = print
    try:
        log(f"starting {args.brokers} broker node(s) and {args.proxies} proxies")
        deployment.start()
        base = settled(deployment.members)
        log(f"connecting {args.conns} clients ({args.persistent_fraction:.0%} persistent)")
        t0 = time.monotonic()
        fleet = start_fleet(args, binary, [p.port for p in deployment.proxies], run_id)
        connected = wait_connected(fleet, args.connect_timeout)
        result["connect"] = {
            "seconds": time.monotonic() - t0,
            "connected": total(connected, "connected"),
            "failed": total(connected, "failed"),
            "suback_failures": total(connected, "suback_failures"),
            "complete": all(c.get("complete") for c in connected),
            "generators": connected,
        }
        log(f"  {result['connect']['connected']} connected in {result['connect']['seconds']:.1f} s")
        up = settled(deployment.members)
        time.sleep(args.idle)
        idle = sample(deployment.members)
        result["phases"] = {
            "connect_brokers": cost(base, up, nodes),
            "connect_proxies": cost(base, up, proxies),
            "idle_brokers": cost(up, idle, nodes),
            "idle_proxies": cost(up, idle, proxies),
        }
        victim = deployment.proxies[args.kill - 1]
        expected, topics = homed_on(fleet, args.kill - 1, args.proxies, args.persistent_fraction)
        log(f"killing {victim.name} (pid {victim.pid}) with its {expected} clients")
        before_kill = sample(deployment.members)
        kill_ns = time.monotonic_ns()
        os.kill(victim.pid, signal.SIGKILL)
        statuses = wait_storm(fleet, expected, args.storm_timeout)
        after_storm = sample(deployment.members)
        first = min((s["first_loss_ns"] for s in statuses if s["first_loss_ns"]), default=0)
        last = max((s["last_reconnect_ns"] for s in statuses), default=0)
        survivors = [n for n in proxies if n != victim.name]
        result["storm"] = {
            "killed": victim.name,
            "clients_of_killed": expected,
            "persistent_of_killed": len(topics),
            "reconnected": total(statuses, "reconnected"),
            "resumed": total(statuses, "resumed"),
            "not_resumed": total(statuses, "not_resumed"),
            "gave_up": total(statuses, "gave_up"),
            "failed_attempts": total(statuses, "failed_attempts"),
            "refused": total(statuses, "refused"),
            "still_waiting": total(statuses, "waiting"),
            "open_after": total(statuses, "open"),
            "storm_s": (last - first) / 1e9 if first and last > first else None,
            "kill_to_last_s": (last - kill_ns) / 1e9 if last > kill_ns else None,
            "reconnect_min_ms": min(
                (s["reconnect_min_ms"] for s in statuses if s["reconnect_min_ms"] >= 0), default=-1
            ),
            "reconnect_p50_ms": max(s["reconnect_p50_ms"] for s in statuses),
            "reconnect_p99_ms": max(s["reconnect_p99_ms"] for s in statuses),
            "reconnect_max_ms": max(s["reconnect_max_ms"] for s in statuses),
            "brokers": cost(before_kill, after_storm, nodes),
            "proxies": cost(before_kill, after_storm, survivors),
            "generators": statuses,
        }
        storm = result["storm"]
        log(f"  {storm['reconnected']} reconnected, {storm['resumed']} resumed")
        if args.check_delivery and topics:
            chosen = topics[:: max(1, len(topics) // args.check_delivery)][: args.check_delivery]
            already = total(fleet.status(), "delivered")
            port = deployment.proxies[args.kill % args.proxies].port
            try:
                acked = publish_sample(port, chosen, 30)
            except OSError as exc:
                result["delivery"] = {"sent": len(chosen), "error": repr(exc), "delivered": 0}
            else:
                got = wait_delivered(fleet, already + len(chosen), 30) - already
                result["delivery"] = {"sent": len(chosen), "acked": acked, "delivered": got}
            got = result["delivery"]["delivered"]
            log(f"  delivery check: {got} of {len(chosen)} delivered")
        result["exit_codes"] = {m.name: m.exit_code() for m in deployment.members}
        result["fds_after_storm"] = after_storm.fds
        result["emfile_log_lines"] = log_count(deployment.members, "EMFILE")
        result["teardown"] = leave_all(fleet, deployment, base, args.storm_timeout)
        log(f"  every client left; the proxies were done in {result['teardown']['seconds']:.1f} s")
    finally:
        result["final"] = fleet.stop()
        deployment.stop()
        result["load_after"] = os.getloadavg()
        result["log_tail"] = deployment.log_tail(40)
        (out / "results.json").write_text(json.dumps(result, indent=2, default=str))
    return result


def kb_per(kb: float, n: int) -> str:
    return f"{kb * 1024 / n:,.0f} B" if n else "-"


def table(result: dict[str, Any]) -> str:
    s = result["settings"]
    n = result["connect"]["connected"]
    persistent = int(n * float(s["persistent_fraction"]))
    ph = result["phases"]
    cb, cp, ib, ip = (
        ph["connect_brokers"],
        ph["connect_proxies"],
        ph["idle_brokers"],
        ph["idle_proxies"],
    )
    st = result.get("storm", {})
    rows = [
        ("clients connected", f"{n:,} of {s['conns']:,} ({persistent:,} persistent)"),
        (
            "connect time",
            f"{result['connect']['seconds']:.1f} s ({n / result['connect']['seconds']:,.0f}/s)",
        ),
        ("brokers: RSS after connect", f"{cb['rss_after_kb'] / 1024:,.0f} MB"),
        ("brokers: RSS per connection", kb_per(cb["rss_kb"], n)),
        ("brokers: RSS growth / persistent sessions", kb_per(cb["rss_kb"], persistent)),
        ("brokers: CPU per connection (connect)", f"{cb['cpu_s'] * 1e6 / max(n, 1):,.0f} us"),
        ("proxies: RSS after connect", f"{cp['rss_after_kb'] / 1024:,.0f} MB"),
        ("proxies: RSS per connection", kb_per(cp["rss_kb"], n)),
        ("proxies: CPU per connection (connect)", f"{cp['cpu_s'] * 1e6 / max(n, 1):,.0f} us"),
        (f"idle {ib['seconds']:.0f} s: brokers CPU", f"{ib['cores'] * 100:.1f}% of a core"),
        (f"idle {ib['seconds']:.0f} s: brokers RSS change", f"{ib['rss_kb']:+,} KB"),
        (f"idle {ip['seconds']:.0f} s: proxies CPU", f"{ip['cores'] * 100:.1f}% of a core"),
        (f"idle {ip['seconds']:.0f} s: proxies RSS change", f"{ip['rss_kb']:+,} KB"),
    ]
    if st:
        storm_s = f"{st['storm_s']:.2f} s" if st["storm_s"] is not None else "-"
        rows += [
            (
                f"kill {st['killed']}: its clients",
                f"{st['clients_of_killed']:,} ({st['persistent_of_killed']:,} persistent)",
            ),
            ("reconnect storm (first loss -> last CONNACK)", storm_s),
            (
                "reconnected",
                f"{st['reconnected']:,}, {st['gave_up']} gave up, "
                f"{st['still_waiting']} still waiting",
            ),
            (
                "sessions resumed (session present)",
                f"{st['resumed']:,} of {st['persistent_of_killed']:,}, {st['not_resumed']} not",
            ),
            ("failed attempts / refused CONNACKs", f"{st['failed_attempts']} / {st['refused']}"),
            (
                "reconnect time min / p50 / p99 / max",
                " / ".join(f"{st[f'reconnect_{q}_ms']:.0f}" for q in ("min", "p50", "p99", "max"))
                + " ms",
            ),
            (
                "storm: brokers CPU / RSS change",
                f"{st['brokers']['cpu_s']:.1f} s / {st['brokers']['rss_kb']:+,} KB",
            ),
            (
                "storm: surviving proxies CPU / RSS change",
                f"{st['proxies']['cpu_s']:.1f} s / {st['proxies']['rss_kb']:+,} KB",
            ),
            ("clients open after the storm", f"{st['open_after']:,}"),
        ]
    if "fds_after_storm" in result:
        fds = result["fds_after_storm"]
        rows.append(("open fds after the storm", ", ".join(f"{k} {v:,}" for k, v in fds.items())))
        emfile = sum(result["emfile_log_lines"].values())
        rows.append(("accepts refused for want of fds (EMFILE)", f"{emfile}"))
    if "teardown" in result:
        td = result["teardown"]
        rows.append(
            (
                "all clients leave at once: proxies done in",
                f"{td['seconds']:.1f} s, {td['proxies']['cpu_s']:.1f} s CPU"
                + (f", {td['fds_left']} fds still open" if td["fds_left"] > 40 else ""),
            )
        )
    if "delivery" in result:
        d = result["delivery"]
        rows.append(("QoS 1 to resumed sessions", f"{d['delivered']} of {d['sent']} delivered"))
    rows.append(
        (
            "load average before / after",
            " / ".join(
                " ".join(f"{x:.2f}" for x in result[k]) for k in ("load_before", "load_after")
            ),
        )
    )
    width = max(len(r[0]) for r in rows)
    return "\n".join(f"| {name:<{width}} | {value} |" for name, value in rows)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    stop_on_sigterm()
    try:
        result = run(args)
    except (LoadgenError, BrokerError, FleetError) as exc:
        print(f"scale_separated: {exc}", file=sys.stderr)
        return 1
    print(table(result))
    print(f"results: {result['out']}/results.json")
    return 0


if __name__ == "__main__":
    sys.exit(main())
