"""gRPC (PIP-59) next to the Pulsar binary protocol on the same mop node: one merged node per
round serves both (`protocols = ["pulsar", "grpc"]`), and each scenario runs once with grpcio
and once with pulsar-client against it, on topics of their own, in alternating order.

    python bench/grpc_bench.py --quick     # about 1 minute: one round, smaller sizes
    python bench/grpc_bench.py             # medians of 3 rounds (about 4 minutes)
    python bench/grpc_bench.py --fsync always --scenarios produce,paced

Scenarios (`--scenarios`), 100-byte messages, one producer and one consumer:
- produce: one pipelined producer (gRPC: one produce stream; Pulsar: send_async, batching off,
  as gRPC has no batching) with at most `in_flight` unanswered sends; msgs/s from the first
  send to the last result;
- consume: a stored backlog drained by one consumer from the earliest (gRPC: one consume
  stream acknowledging every 100 messages in one Ack; Pulsar: a consumer acknowledging each
  message, which the client groups); msgs/s from the subscription to the last message;
- paced: a producer at a fixed rate every client sustains and a consumer: publish -> receive
  latency, p50 and p99, without queueing.
Every message carries its send time (CLOCK_MONOTONIC, shared by the processes of one machine)
in its first 8 bytes. Producers and consumers are processes of their own (`--worker`), so that
one Python process's GIL does not limit both sides. Output goes to bench/results/grpc-<time>/:
report.md (also printed) and results.json.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import queue
import shutil
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import brokers
from brokers import BENCH_DIR, REPO_DIR, BrokerError, cpu_ticks, free_port
from report import machine

PAYLOAD = 100
CLK_TCK = os.sysconf("SC_CLK_TCK")
PROTOCOLS = ("grpc", "pulsar")
LABELS = {"grpc": "gRPC (grpcio)", "pulsar": "Pulsar (pulsar-client)"}
PRODUCE_PATH = "/mop.grpc.v1.PulsarGrpcService/produce"
CONSUME_PATH = "/mop.grpc.v1.PulsarGrpcService/consume"
ACK_EVERY = 100


def log(message: str) -> None:
    print(message, flush=True)


# ---- sizes and scenarios ------------------------------------------------------------------------


@dataclass(frozen=True)
class Sizes:
    produce: int  # messages per run
    consume: int
    paced: int
    paced_rate: int  # messages per second
    in_flight: int  # unanswered sends per producer
    timeout: float  # seconds a run may take at most


FULL = Sizes(
    produce=50_000, consume=50_000, paced=5_000, paced_rate=1000, in_flight=1000, timeout=120
)
QUICK = Sizes(
    produce=20_000, consume=20_000, paced=2_000, paced_rate=1000, in_flight=1000, timeout=60
)
SMOKE = Sizes(produce=300, consume=300, paced=100, paced_rate=200, in_flight=100, timeout=30)
MODES = {"full": FULL, "quick": QUICK, "smoke": SMOKE}

SCENARIOS = {
    "produce": "produce, pipelined",
    "consume": "consume a stored backlog",
    "paced": "paced produce -> consume",
}
# (scenario, metric key, label, higher is better)
METRICS = (
    ("produce", "msgs_per_s", "msgs/s", True),
    ("consume", "msgs_per_s", "msgs/s", True),
    ("paced", "p50_us", "p50 latency, us", False),
    ("paced", "p99_us", "p99 latency, us", False),
)


# ---- the node -----------------------------------------------------------------------------------


class Node(brokers.Broker):
    """A merged mop node serving Pulsar and gRPC on fresh loopback ports, for one round."""

    def __init__(self, fsync: str, workdir: Path) -> None:
        spec = brokers.BrokerSpec(f"mop-{fsync}", "mop", fsync)
        super().__init__(spec, free_port(), workdir, workdir)
        self.grpc_port = free_port()

    @property
    def pulsar_url(self) -> str:
        return f"pulsar://127.0.0.1:{self.port}"

    @property
    def grpc_target(self) -> str:
        return f"127.0.0.1:{self.grpc_port}"

    def command(self) -> tuple[list[str], dict[str, str]]:
        env = dict(os.environ)
        env.update(
            PYTHONPATH=_pythonpath(),
            MOP_PROTOCOLS='["pulsar", "grpc"]',
            MOP_PULSAR__HOST="127.0.0.1",
            MOP_PULSAR__PORT=str(self.port),
            MOP_GRPC__HOST="127.0.0.1",
            MOP_GRPC__PORT=str(self.grpc_port),
            MOP_ADMIN__PORT="0",
            MOP_DATA_DIR=str(self.workdir / "data"),
            MOP_STORAGE__FSYNC=self.spec.fsync or "never",
            MOP_LOG_LEVEL="WARNING",
        )
        return [sys.executable, "-m", "mop", "run"], env

    def wait_ready(self, deadline: float) -> None:
        super().wait_ready(deadline)  # the Pulsar port
        while not brokers.accepts(self.grpc_port):
            if self.exit_code() is not None or time.monotonic() > deadline:
                self.stop()
                raise BrokerError(f"the gRPC port did not open:\n{self.log_tail()}")
            time.sleep(0.05)


def _pythonpath() -> str:
    return os.pathsep.join(filter(None, [str(REPO_DIR), os.environ.get("PYTHONPATH")]))


def mop_version() -> str:
    rev = subprocess.run(
        ["git", "-C", str(REPO_DIR), "rev-parse", "--short", "HEAD"],
        capture_output=True,
        text=True,
        check=False,
    ).stdout.strip()
    return f"commit {rev or '?'}"


# ---- the load: worker processes -----------------------------------------------------------------


def _stamped(n: int) -> bytes:
    return time.monotonic_ns().to_bytes(8, "big") + n.to_bytes(8, "big") + bytes(PAYLOAD - 16)


def _pace(start: float, n: int, rate: float) -> None:
    if rate <= 0:
        return
    due = start + n / rate
    while (now := time.monotonic()) < due:
        time.sleep(min(due - now, 0.001))


def _percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    return values[min(len(values) - 1, int(q * len(values)))]


def produce_grpc(job: dict[str, Any]) -> dict[str, Any]:
    """One produce stream; at most `in_flight` Sends unanswered (`rate` per second if > 0)."""
    import grpc

    from mop.protocols.grpc.proto.mop_grpc_pb2 import Send, SendResult

    count, window = job["count"], threading.BoundedSemaphore(job["in_flight"])
    errors: list[str] = []
    channel = grpc.insecure_channel(job["target"])
    grpc.channel_ready_future(channel).result(timeout=10)  # connected, as a Pulsar producer is
    start = time.monotonic()

    def sends() -> Iterator[Any]:
        for n in range(count):
            _pace(start, n, job["rate"])
            if not window.acquire(timeout=max(0.0, job["deadline"] - time.monotonic())):
                errors.append("timed out waiting for results")
                return
            yield Send(payload=_stamped(n), sequence_id=n + 1)

    with channel:
        call = channel.stream_stream(
            PRODUCE_PATH,
            request_serializer=Send.SerializeToString,
            response_deserializer=SendResult.FromString,
        )(sends(), metadata=(("pulsar-topic", job["topic"]),))
        try:
            for result in call:
                if result.WhichOneof("result") != "message_id" and len(errors) < 10:
                    errors.append(f"{result.error.code}: {result.error.message}")
                window.release()
        except grpc.RpcError as error:
            errors.append(f"produce ended: {error.code()}")
    return {"start": start, "end": time.monotonic(), "errors": errors}


def produce_pulsar(job: dict[str, Any]) -> dict[str, Any]:
    """One producer, batching off, send_async with at most `in_flight` unanswered."""
    import pulsar

    client = _pulsar_client(job["url"])
    producer = client.create_producer(
        job["topic"],
        batching_enabled=False,
        max_pending_messages=max(job["in_flight"], 1),
        block_if_queue_full=True,
    )
    window = threading.BoundedSemaphore(job["in_flight"])
    errors: list[str] = []

    def sent(result: Any, _: Any) -> None:
        if result != pulsar.Result.Ok and len(errors) < 10:
            errors.append(str(result))
        window.release()

    start = time.monotonic()
    for n in range(job["count"]):
        _pace(start, n, job["rate"])
        if not window.acquire(timeout=max(0.0, job["deadline"] - time.monotonic())):
            errors.append("timed out waiting for receipts")
            break
        producer.send_async(_stamped(n), sent)
    producer.flush()
    end = time.monotonic()
    client.close()
    return {"start": start, "end": end, "errors": errors}


def _pulsar_client(url: str) -> Any:
    import pulsar

    return pulsar.Client(
        url,
        operation_timeout_seconds=30,
        io_threads=1,
        logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error),
    )


class _Received:
    """Latencies of distinct messages (by sequence number), and when the first and last came."""

    def __init__(self) -> None:
        self.latencies: list[float] = []
        self.seen: set[bytes] = set()
        self.duplicates = 0
        self.first = self.last = 0.0

    def add(self, data: bytes) -> None:
        now = time.monotonic_ns()
        if data[8:16] in self.seen:
            self.duplicates += 1
            return
        self.seen.add(data[8:16])
        self.latencies.append((now - int.from_bytes(data[:8], "big")) / 1000)
        self.last = now / 1e9
        self.first = self.first or self.last

    def result(self, subscribed: float) -> dict[str, Any]:
        self.latencies.sort()
        return {
            "received": len(self.latencies),
            "duplicates": self.duplicates,
            "subscribed": subscribed,
            "first": self.first,
            "last": self.last,
            "p50_us": _percentile(self.latencies, 0.50),
            "p99_us": _percentile(self.latencies, 0.99),
        }


def consume_grpc(job: dict[str, Any], ready: Callable[[], None]) -> dict[str, Any]:
    """One consume stream from the earliest, acknowledging every ACK_EVERY messages."""
    import grpc

    from mop.protocols.grpc.proto.mop_grpc_pb2 import Ack, Message

    acks: queue.Queue[Any] = queue.Queue()

    def requests() -> Iterator[Any]:
        while (ack := acks.get()) is not None:
            yield ack

    received = _Received()
    subscribed = time.monotonic()
    with grpc.insecure_channel(job["target"]) as channel:
        call = channel.stream_stream(
            CONSUME_PATH,
            request_serializer=Ack.SerializeToString,
            response_deserializer=Message.FromString,
        )(
            requests(),
            metadata=(
                ("pulsar-topic", job["topic"]),
                ("pulsar-subscription", "bench"),
                ("pulsar-initial-position", "earliest"),
            ),
            timeout=max(1.0, job["deadline"] - time.monotonic()),
        )
        ready()
        pending: list[Any] = []
        try:
            for message in call:
                received.add(message.payload)
                pending.append(message.message_id)
                if len(pending) >= ACK_EVERY:
                    acks.put(Ack(message_ids=pending))
                    pending = []
                if len(received.latencies) >= job["count"]:
                    break
        except grpc.RpcError as error:
            if error.code() != grpc.StatusCode.DEADLINE_EXCEEDED:
                raise
        acks.put(None)
        call.cancel()
    return received.result(subscribed)


def consume_pulsar(job: dict[str, Any], ready: Callable[[], None]) -> dict[str, Any]:
    import pulsar

    client = _pulsar_client(job["url"])
    subscribed = time.monotonic()
    consumer = client.subscribe(
        job["topic"],
        "bench",
        receiver_queue_size=1000,
        initial_position=pulsar.InitialPosition.Earliest,
    )
    ready()
    received = _Received()
    while len(received.latencies) < job["count"]:
        remaining = job["deadline"] - time.monotonic()
        if remaining <= 0:
            break
        try:
            message = consumer.receive(timeout_millis=int(min(remaining, 5) * 1000))
        except pulsar.Timeout:
            continue
        received.add(message.data())
        consumer.acknowledge(message)
    client.close()
    return received.result(subscribed)


def worker(argv: list[str]) -> int:
    """`--worker produce|consume JSON`: one side of the load, its result as JSON on stdout."""
    role, raw = argv
    job = json.loads(raw)
    grpc_side = job["protocol"] == "grpc"
    if role == "consume":

        def ready() -> None:
            print("ready", flush=True)

        result = (consume_grpc if grpc_side else consume_pulsar)(job, ready)
    else:
        result = (produce_grpc if grpc_side else produce_pulsar)(job)
    print(json.dumps(result), flush=True)
    return 0


def _spawn(role: str, job: dict[str, Any]) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, __file__, "--worker", role, json.dumps(job)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=BENCH_DIR,
        env={**os.environ, "PYTHONPATH": _pythonpath()},
    )


def _result(proc: subprocess.Popen[str], timeout: float) -> dict[str, Any]:
    try:
        out, err = proc.communicate(timeout=max(1.0, timeout))
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
        raise BrokerError(f"a load process did not finish in time: {err[-400:]}") from None
    lines = [line for line in out.splitlines() if line.startswith("{")]
    if proc.returncode != 0 or not lines:
        raise BrokerError(f"a load process failed ({proc.returncode}): {err[-600:]}")
    result: dict[str, Any] = json.loads(lines[-1])
    return result


def _wait_ready(proc: subprocess.Popen[str]) -> None:
    assert proc.stdout is not None
    if proc.stdout.readline().strip() != "ready":
        raise BrokerError(f"the consumer did not subscribe: {_result(proc, 5)}")


# ---- one run ------------------------------------------------------------------------------------


@dataclass
class RunRecord:
    scenario: str
    protocol: str
    round: int
    values: dict[str, float | None]
    notes: list[str] = field(default_factory=list)
    node_cpu: float | None = None


def _job(node: Node, protocol: str, topic: str, count: int, deadline: float) -> dict[str, Any]:
    return {
        "protocol": protocol,
        "target": node.grpc_target,
        "url": node.pulsar_url,
        "topic": topic,
        "count": count,
        "deadline": deadline,
    }


def run_load(node: Node, scenario: str, protocol: str, sizes: Sizes, topic: str) -> dict[str, Any]:
    deadline = time.monotonic() + sizes.timeout
    count = {"produce": sizes.produce, "consume": sizes.consume, "paced": sizes.paced}[scenario]
    job = _job(node, protocol, topic, count, deadline)
    rate = sizes.paced_rate if scenario == "paced" else 0
    producer_job = {**job, "in_flight": sizes.in_flight, "rate": rate}
    if scenario == "produce":
        sent = _result(_spawn("produce", producer_job), sizes.timeout + 5)
        elapsed = sent["end"] - sent["start"]
        return {
            "msgs_per_s": count / elapsed if elapsed > 0 and not sent["errors"] else None,
            "received": count,
            "errors": sent["errors"],
            "duplicates": 0,
            "expected": count,
        }
    if scenario == "consume":
        # The backlog is stored first; the consumer subscribes afterwards, from the earliest.
        sent = _result(_spawn("produce", producer_job), sizes.timeout + 5)
        received = _result(_spawn("consume", job), deadline - time.monotonic() + 5)
    else:
        consumer = _spawn("consume", job)
        try:
            _wait_ready(consumer)
            sent = _result(_spawn("produce", producer_job), sizes.timeout + 5)
            received = _result(consumer, deadline - time.monotonic() + 5)
        finally:
            if consumer.poll() is None:
                consumer.kill()
                consumer.wait()
    values: dict[str, Any] = {
        "received": received["received"],
        "duplicates": received["duplicates"],
        "errors": sent["errors"],
        "expected": count,
    }
    if scenario == "consume":
        elapsed = received["last"] - received["subscribed"] if received["received"] else 0.0
        values["msgs_per_s"] = received["received"] / elapsed if elapsed > 0 else None
    else:
        values.update(p50_us=received["p50_us"], p99_us=received["p99_us"])
    return values


class Bench:
    def __init__(self, args: argparse.Namespace, sizes: Sizes) -> None:
        self.args = args
        self.sizes = sizes
        self.out: Path = args.out

    def run_round(self, rnd: int, scenarios: list[str]) -> list[RunRecord]:
        """One fresh node; every scenario with both protocols, their order alternating."""
        workdir = self.out / "nodes" / f"round-{rnd + 1}"
        node = Node(self.args.fsync, workdir)
        records: list[RunRecord] = []
        try:
            node.start()
            for index, scenario in enumerate(scenarios):
                order = PROTOCOLS if (rnd + index) % 2 == 0 else PROTOCOLS[::-1]
                for protocol in order:
                    rec = self.run_one(node, rnd, scenario, protocol)
                    records.append(rec)
                    shown = ", ".join(f"{k}={_fmt(v)}" for k, v in rec.values.items())
                    extra = f"  [{'; '.join(rec.notes)}]" if rec.notes else ""
                    log(f"  round {rnd + 1} {scenario:8} {protocol:6} {shown}{extra}")
        except BrokerError as exc:
            records.append(RunRecord("node", "-", rnd, {}, [f"failed: {str(exc)[:400]}"]))
            log(f"  round {rnd + 1}: {records[-1].notes[0]}")
        finally:
            code = node.exit_code()
            if code is not None:
                records.append(RunRecord("node", "-", rnd, {}, [f"the node exited ({code})"]))
            node.stop()
        if not any(r.notes for r in records):
            shutil.rmtree(workdir, ignore_errors=True)  # keep a failed round's data and log
        return records

    def run_one(self, node: Node, rnd: int, scenario: str, protocol: str) -> RunRecord:
        rec = RunRecord(scenario, protocol, rnd, {})
        topic = f"persistent://public/default/bench-{scenario}-{protocol}-{rnd}"
        try:
            ticks, t0 = cpu_ticks(node.pid), time.monotonic()
            result = run_load(node, scenario, protocol, self.sizes, topic)
            rec.node_cpu = (cpu_ticks(node.pid) - ticks) / CLK_TCK / (time.monotonic() - t0)
            rec.values = {k: result[k] for k in ("msgs_per_s", "p50_us", "p99_us") if k in result}
            if result["received"] < result["expected"]:
                rec.notes.append(f"received {result['received']} of {result['expected']}")
            if result["duplicates"]:
                rec.notes.append(f"{result['duplicates']} messages received twice (not counted)")
            if result["errors"]:
                rec.notes.append(f"send errors: {', '.join(sorted(set(result['errors'])))}")
        except (BrokerError, OSError) as exc:
            rec.notes.append(f"failed: {str(exc).strip()[:400]}")
        return rec


# ---- the report ---------------------------------------------------------------------------------


def _median(records: list[RunRecord], scenario: str, protocol: str, key: str) -> float | None:
    values = [
        r.values.get(key) for r in records if r.scenario == scenario and r.protocol == protocol
    ]
    present = [v for v in values if v is not None]
    return statistics.median(present) if present else None


def _fmt(value: float | None) -> str:
    if value is None:
        return "-"
    if value >= 100_000:
        return f"{value / 1000:.0f}k"
    if value >= 10_000:
        return f"{value / 1000:.1f}k"
    return f"{value:,.0f}"


def markdown(results: dict[str, Any]) -> str:
    records = [RunRecord(**r) for r in results["runs"]]
    sizes = Sizes(**results["sizes"])
    lines = [
        "# gRPC (PIP-59) next to the Pulsar binary protocol, on one mop node",
        "",
        f"- date: {results['started']}, {results['elapsed_s'] / 60:.1f} minutes:"
        f" `{results['command']}`",
        f"- machine: {machine()}",
        f"- node: mop {results['version']}, merged, storage.fsync {results['fsync']},"
        " Pulsar and gRPC adapters; a fresh node and data directory per round",
        f"- mode: {results['mode']}, {results['rounds']} rounds; cells are medians over rounds",
        f"- clients: grpcio {results['clients']['grpcio']}, pulsar-client"
        f" {results['clients']['pulsar']}; {PAYLOAD}-byte messages; produce {sizes.produce:,}"
        f" ({sizes.in_flight} in flight), consume {sizes.consume:,} stored, paced"
        f" {sizes.paced:,} at {sizes.paced_rate:,} msgs/s",
        "",
        "The ratio is gRPC / Pulsar: above 1 is better for rates, below 1 for latencies.",
        "",
        f"| scenario | {LABELS['grpc']} | {LABELS['pulsar']} | gRPC / Pulsar |",
        "|---|---:|---:|---:|",
    ]
    for scenario, key, name, _ in METRICS:
        if scenario not in results["scenarios"]:
            continue
        grpc_value = _median(records, scenario, "grpc", key)
        pulsar_value = _median(records, scenario, "pulsar", key)
        ratio = f"{grpc_value / pulsar_value:.2f}x" if grpc_value and pulsar_value else "-"
        lines.append(
            f"| {SCENARIOS[scenario]}: {name} | {_fmt(grpc_value)} | {_fmt(pulsar_value)}"
            f" | {ratio} |"
        )
    notes = [
        f"- round {r.round + 1} / {r.scenario} / {r.protocol}: {'; '.join(r.notes)}"
        for r in records
        if r.notes
    ]
    if notes:
        lines += ["", "## Notes", "", *notes]
    lines += [
        "",
        "## Every run",
        "",
        "| round | scenario | protocol | msgs/s | p50 us | p99 us | node CPU |",
        "|---:|---|---|---:|---:|---:|---:|",
    ]
    for r in records:
        if r.scenario == "node":
            continue
        cpu = "-" if r.node_cpu is None else f"{r.node_cpu:.2f}"
        cells = " | ".join(_fmt(r.values.get(k)) for k in ("msgs_per_s", "p50_us", "p99_us"))
        lines.append(f"| {r.round + 1} | {r.scenario} | {r.protocol} | {cells} | {cpu} |")
    return "\n".join(lines) + "\n"


# ---- main ---------------------------------------------------------------------------------------


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    size = parser.add_mutually_exclusive_group()
    size.add_argument("--quick", action="store_true", help="smaller sizes, one round")
    size.add_argument("--smoke", action="store_true", help="tiny sizes, to check the script")
    parser.add_argument(
        "--scenarios",
        default=",".join(SCENARIOS),
        help="comma-separated, from: " + ", ".join(SCENARIOS),
    )
    parser.add_argument("--runs", type=int, help="rounds (default 3, quick and smoke 1)")
    parser.add_argument(
        "--fsync", default="never", choices=("never", "interval", "always"), help="storage.fsync"
    )
    parser.add_argument("--out", type=Path, help="output directory")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--worker"]:
        return worker(argv[1:])
    args = parse_args(argv)
    mode = "smoke" if args.smoke else "quick" if args.quick else "full"
    sizes = MODES[mode]
    rounds = args.runs or (3 if mode == "full" else 1)
    scenarios = [s.strip() for s in args.scenarios.split(",") if s.strip()]
    unknown = [s for s in scenarios if s not in SCENARIOS]
    if unknown:
        raise SystemExit(f"unknown scenarios: {', '.join(unknown)} (known: {', '.join(SCENARIOS)})")
    started = datetime.now(UTC)
    args.out = (args.out or BENCH_DIR / "results" / f"grpc-{started:%Y%m%d-%H%M%S}").resolve()
    args.out.mkdir(parents=True, exist_ok=True)
    import grpc
    import pulsar

    version = mop_version()  # before the runs: the checkout may change while they run
    log(f"{mode} bench: {len(scenarios)} scenarios x 2 protocols x {rounds} rounds -> {args.out}")
    bench = Bench(args, sizes)
    records: list[RunRecord] = []
    t_start = time.monotonic()
    for rnd in range(rounds):
        records += bench.run_round(rnd, scenarios)
    results = {
        "command": " ".join(["python", "bench/grpc_bench.py", *argv]),
        "mode": mode,
        "rounds": rounds,
        "fsync": args.fsync,
        "version": version,
        "clients": {"grpcio": grpc.__version__, "pulsar": pulsar.__version__},
        "started": started.strftime("%Y-%m-%d %H:%M UTC"),
        "elapsed_s": time.monotonic() - t_start,
        "scenarios": scenarios,
        "sizes": dataclasses.asdict(sizes),
        "runs": [dataclasses.asdict(r) for r in records],
    }
    (args.out / "results.json").write_text(json.dumps(results, indent=1))
    report = markdown(results)
    (args.out / "report.md").write_text(report)
    log("")
    log(report)
    failed = [r for r in records if r.notes]
    return 1 if failed and mode == "smoke" else 0


if __name__ == "__main__":
    sys.exit(main())
