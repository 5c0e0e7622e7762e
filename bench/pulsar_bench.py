"""Pulsar protocol benchmark: pulsar-client producers -> one consumer on one topic, 100-byte
messages, against mop merged (storage.fsync never and always) and the Rust `pulsar-lite` broker,
runs interleaved broker by broker (A B C A B C), medians, ratios to pulsar-lite, a chart.

    python bench/pulsar_bench.py --quick          # about 2 minutes, one run each, smaller sizes
    python bench/pulsar_bench.py                  # median of 3 runs (about 8 minutes)
    python bench/pulsar_bench.py --brokers mop-never,pulsar-lite --scenarios batched

Scenarios (`--scenarios`):
- unbatched: producers with batching off, `send_async` with a bounded number in flight each;
- batched: the same with batching on (the client packs up to 1000 messages per entry);
- paced: one unbatched producer at a fixed rate the brokers can all sustain, for latency
  without queueing;
- backlog: a subscription is made and left (it holds the messages), the producers store the
  batched load, then a reader reads it from the earliest: the broker's read path from storage
  (msgs/s from the reader's creation; no latency, the messages waited by design).

Every message carries the send time (CLOCK_MONOTONIC, shared by the processes of one machine)
in its first 8 bytes; the consumer turns receive times into publish -> receive latencies. The
throughput is what the consumer received over the time from the first send to the last
receive. Producers and the consumer are separate processes (`--producers`), since one Python
process with pulsar-client tops out below what a broker may take.

pulsar-lite is installed by this script, pinned, into bench/.deps/pulsar-lite-venv (git-ignored),
and runs with its metrics endpoint off (it would bind 0.0.0.0:8080). Output goes to
bench/results/pulsar-<time>/: report.md, chart.png, results.json.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shutil
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import brokers
from brokers import BENCH_DIR, REPO_DIR, BrokerError, cpu_ticks, free_port
from report import machine

PULSAR_LITE_VERSION = "0.2.0"
PAYLOAD = 100
CLK_TCK = os.sysconf("SC_CLK_TCK")
TOPIC = "persistent://public/default/bench"


def log(message: str) -> None:
    print(message, flush=True)


# ---- sizes and scenarios ------------------------------------------------------------------------


@dataclass(frozen=True)
class Sizes:
    unbatched: int  # messages per run
    batched: int
    paced: int
    paced_rate: int  # messages per second
    in_flight: int  # send_async window per producer
    timeout: float  # seconds a run may take at most


FULL = Sizes(
    unbatched=100_000, batched=400_000, paced=10_000, paced_rate=1000, in_flight=1000, timeout=180
)
QUICK = Sizes(
    unbatched=20_000, batched=80_000, paced=3_000, paced_rate=1000, in_flight=1000, timeout=90
)
SMOKE = Sizes(unbatched=500, batched=2000, paced=200, paced_rate=500, in_flight=100, timeout=60)
MODES = {"full": FULL, "quick": QUICK, "smoke": SMOKE}


@dataclass(frozen=True)
class Scenario:
    key: str
    title: str
    batched: bool
    paced: bool = False
    backlog: bool = False  # the consumer drains what the producers stored before it came back

    def count(self, sizes: Sizes) -> int:
        return sizes.paced if self.paced else sizes.batched if self.batched else sizes.unbatched


SCENARIOS = {
    sc.key: sc
    for sc in (
        Scenario("unbatched", "unbatched, send_async", batched=False),
        Scenario("batched", "batched, send_async", batched=True),
        Scenario("paced", "unbatched at a fixed rate", batched=False, paced=True),
        Scenario("backlog", "batched, drained from storage", batched=True, backlog=True),
    )
}
# (key, label, higher is better, unit format)
METRICS = (
    ("msgs_per_s", "msgs/s", True),
    ("p50_us", "p50 latency, us", False),
    ("p99_us", "p99 latency, us", False),
)


# ---- brokers ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class BrokerSpec:
    name: str
    kind: str  # mop | pulsar-lite
    fsync: str | None = None

    @property
    def label(self) -> str:
        return f"mop ({self.fsync})" if self.kind == "mop" else self.name


BROKERS = {
    spec.name: spec
    for spec in (
        BrokerSpec("mop-never", "mop", "never"),
        BrokerSpec("mop-always", "mop", "always"),
        BrokerSpec("pulsar-lite", "pulsar-lite"),
    )
}
REFERENCE = "pulsar-lite"


def _lite_python(deps: Path) -> Path:
    return deps / "pulsar-lite-venv" / "bin" / "python"


def pulsar_lite_binary(deps: Path) -> Path:
    """The pulsar-lite binary, installed into its own venv first if needed (the wheel ships it;
    its Python wrapper and dependencies are not needed)."""
    python = _lite_python(deps)
    find = "import pulsar_lite, pathlib; print(pathlib.Path(pulsar_lite.__file__).parent)"
    for attempt in range(2):
        if python.exists():
            done = subprocess.run(
                [str(python), "-c", find], capture_output=True, text=True, check=False
            )
            binary = Path(done.stdout.strip()) / "bin" / "pulsar-lite"
            if done.returncode == 0 and binary.exists():
                return binary
        if attempt:
            break
        log(f"installing pulsar-lite {PULSAR_LITE_VERSION} with pip into {python.parent.parent}")
        subprocess.run(
            [sys.executable, "-m", "venv", "--clear", str(python.parent.parent)], check=True
        )
        subprocess.run(
            [
                str(python),
                "-m",
                "pip",
                "install",
                "-q",
                "--no-deps",
                f"pulsar-lite=={PULSAR_LITE_VERSION}",
            ],
            check=True,
        )
    raise BrokerError("pulsar-lite did not install a binary")


class Broker(brokers.Broker):
    """One broker process on a fresh loopback port and data directory, for one run (the MQTT
    bench's process handling, with the commands of this bench's brokers)."""

    def __init__(self, spec: BrokerSpec, workdir: Path, deps: Path) -> None:
        super().__init__(spec, free_port(), workdir, deps)  # type: ignore[arg-type]

    @property
    def url(self) -> str:
        return f"pulsar://127.0.0.1:{self.port}"

    def command(self) -> tuple[list[str], dict[str, str]]:
        env = dict(os.environ)
        if self.spec.kind == "mop":
            env.update(
                PYTHONPATH=os.pathsep.join(filter(None, [str(REPO_DIR), env.get("PYTHONPATH")])),
                MOP_PROTOCOLS='["pulsar"]',
                MOP_PULSAR__HOST="127.0.0.1",
                MOP_PULSAR__PORT=str(self.port),
                MOP_ADMIN__PORT="0",
                MOP_DATA_DIR=str(self.workdir / "data"),
                MOP_STORAGE__FSYNC=self.spec.fsync or "always",
                MOP_LOG_LEVEL="WARNING",
            )
            return [sys.executable, "-m", "mop", "run"], env
        config = self.workdir / "pulsar-lite.toml"
        config.write_text("[metrics]\nenabled = false\n")
        binary = pulsar_lite_binary(self.deps_dir)
        return [
            str(binary),
            "--config",
            str(config),
            "--addr",
            f"127.0.0.1:{self.port}",
            "--db-path",
            str(self.workdir / "data"),
            "--log-level",
            "warn",
        ], env


def version(spec: BrokerSpec, deps: Path) -> str:
    if spec.kind == "mop":
        done = subprocess.run(
            [sys.executable, "-m", "mop", "--version"],
            capture_output=True,
            text=True,
            cwd=REPO_DIR,
            check=False,
        )
        rev = subprocess.run(
            ["git", "-C", str(REPO_DIR), "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            check=False,
        ).stdout.strip()
        return f"{done.stdout.strip()} (commit {rev or '?'})"
    return f"pulsar-lite {PULSAR_LITE_VERSION}"


# ---- the load: worker processes -----------------------------------------------------------------


def _client(url: str) -> Any:
    import pulsar

    return pulsar.Client(
        url,
        operation_timeout_seconds=30,
        io_threads=1,
        logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error),
    )


def produce(
    url: str,
    count: int,
    batched: bool,
    in_flight: int,
    rate: float,
    deadline: float,
    go: float,
    index: int,
) -> dict[str, Any]:
    """Send `count` messages (at `rate` per second when > 0) with at most `in_flight` unanswered;
    each starts with its send time in ns (CLOCK_MONOTONIC), the producer's `index` and its
    sequence number (8 + 4 + 4 bytes)."""
    import pulsar

    client = _client(url)
    producer = client.create_producer(
        TOPIC,
        batching_enabled=batched,
        batching_max_messages=1000,
        batching_max_publish_delay_ms=1,
        max_pending_messages=max(in_flight, 1),
        block_if_queue_full=True,
    )
    window = threading.BoundedSemaphore(in_flight)
    errors: list[str] = []
    padding = bytes(PAYLOAD - 16)
    tag = index.to_bytes(4, "big")

    def sent(result: Any, _: Any) -> None:
        if result != pulsar.Result.Ok and len(errors) < 10:
            errors.append(str(result))
        window.release()

    while time.monotonic() < go:  # every producer starts together
        time.sleep(0.001)
    start = time.monotonic()
    for n in range(count):
        if rate > 0:
            due = start + n / rate
            while (now := time.monotonic()) < due:
                time.sleep(min(due - now, 0.001))
        if not window.acquire(timeout=max(0.0, deadline - time.monotonic())):
            errors.append("timed out waiting for receipts")
            break
        stamp = time.monotonic_ns().to_bytes(8, "big")
        producer.send_async(stamp + tag + n.to_bytes(4, "big") + padding, sent)
    producer.flush()
    end = time.monotonic()
    client.close()
    return {"start": start, "end": end, "errors": errors}


def consume(
    url: str, count: int, deadline: float, ready: Callable[[], None], backlog: bool = False
) -> dict[str, Any]:
    """Receive `count` distinct messages (or until `deadline`), acknowledging them; latencies in
    us. A message received again (a broker may redeliver) is counted apart, not measured.
    With `backlog` the consumer leaves its (durable) subscription once made, and when a line
    arrives on stdin (the producers are done) a reader reads what was stored meanwhile."""
    import pulsar

    client = _client(url)

    def subscribe() -> Any:
        return client.subscribe(
            TOPIC, "bench", receiver_queue_size=5000, consumer_type=pulsar.ConsumerType.Exclusive
        )

    consumer = subscribe()
    back = 0.0
    if backlog:
        # The subscription holds the messages; a reader from the earliest reads them, which
        # makes the broker read them from storage.
        consumer.close()
        ready()
        sys.stdin.readline()
        back = time.monotonic()
        consumer = _Reader(
            client.create_reader(TOPIC, pulsar.MessageId.earliest, receiver_queue_size=5000)
        )
    else:
        ready()
    latencies: list[float] = []
    seen: set[bytes] = set()
    duplicates = 0
    first = last = 0.0
    while len(latencies) < count:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            break
        try:
            message = consumer.receive(timeout_millis=int(min(remaining, 5) * 1000))
        except pulsar.Timeout:
            continue
        now = time.monotonic_ns()
        data = message.data()
        if data[8:16] in seen:
            duplicates += 1
            continue
        seen.add(data[8:16])
        latencies.append((now - int.from_bytes(data[:8], "big")) / 1000)
        consumer.acknowledge(message)  # the client sends acks grouped
        last = now / 1e9
        if not first:
            first = last
    client.close()
    latencies.sort()
    return {
        "received": len(latencies),
        "duplicates": duplicates,
        "back": back,
        "first": first,
        "last": last,
        "p50_us": _percentile(latencies, 0.50),
        "p99_us": _percentile(latencies, 0.99),
    }


class _Reader:
    """A reader with the consumer calls `consume` makes (it acknowledges nothing)."""

    def __init__(self, reader: Any) -> None:
        self.reader = reader

    def receive(self, timeout_millis: int) -> Any:
        return self.reader.read_next(timeout_millis)

    def acknowledge(self, message: Any) -> None:
        pass


def _percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    return values[min(len(values) - 1, int(q * len(values)))]


def worker(argv: list[str]) -> int:
    """`--worker produce|consume JSON`: one side of the load, its result as JSON on stdout."""
    role, raw = argv
    job = json.loads(raw)
    if role == "consume":
        result = consume(
            job["url"],
            job["count"],
            job["deadline"],
            lambda: print("ready", flush=True),
            job.get("backlog", False),
        )
    else:
        result = produce(
            job["url"],
            job["count"],
            job["batched"],
            job["in_flight"],
            job["rate"],
            job["deadline"],
            job["go"],
            job["index"],
        )
    print(json.dumps(result), flush=True)
    return 0


def _spawn(role: str, job: dict[str, Any]) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, __file__, "--worker", role, json.dumps(job)],
        stdin=subprocess.PIPE if job.get("backlog") else None,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=BENCH_DIR,
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
        raise BrokerError(f"a load process failed ({proc.returncode}): {err[-400:]}")
    result: dict[str, Any] = json.loads(lines[-1])
    return result


# ---- one run ------------------------------------------------------------------------------------


@dataclass
class RunRecord:
    scenario: str
    broker: str
    round: int
    values: dict[str, float | None]
    notes: list[str] = field(default_factory=list)
    broker_cpu: float | None = None


def run_load(broker: Broker, sc: Scenario, sizes: Sizes, producers: int) -> dict[str, Any]:
    count = sc.count(sizes)
    deadline = time.monotonic() + sizes.timeout
    consumer = _spawn(
        "consume",
        {"url": broker.url, "count": count, "deadline": deadline, "backlog": sc.backlog},
    )
    try:
        assert consumer.stdout is not None
        line = consumer.stdout.readline()  # "ready" once subscribed (or EOF on failure)
        if line.strip() != "ready":
            raise BrokerError(f"the consumer did not subscribe: {_result(consumer, 5)}")
        writers = 1 if sc.paced else producers
        shares = [count // writers + (1 if i < count % writers else 0) for i in range(writers)]
        go = time.monotonic() + 1.0
        procs = [
            _spawn(
                "produce",
                {
                    "url": broker.url,
                    "count": share,
                    "batched": sc.batched,
                    "in_flight": sizes.in_flight,
                    "rate": sizes.paced_rate if sc.paced else 0,
                    "deadline": deadline,
                    "go": go,
                    "index": index,
                },
            )
            for index, share in enumerate(shares)
        ]
        sent = [_result(proc, deadline - time.monotonic() + 5) for proc in procs]
        if sc.backlog:
            assert consumer.stdin is not None
            consumer.stdin.write("go\n")
            consumer.stdin.flush()
        received = _result(consumer, deadline - time.monotonic() + 5)
    finally:
        if consumer.poll() is None:
            consumer.kill()
            consumer.wait()
    start = received["back"] if sc.backlog else min(s["start"] for s in sent)
    errors = [e for s in sent for e in s["errors"]]
    elapsed = received["last"] - start if received["received"] else 0.0
    return {
        "msgs_per_s": received["received"] / elapsed if elapsed > 0 else None,
        # Drained messages waited in storage by design: their age says nothing.
        "p50_us": None if sc.backlog else received["p50_us"],
        "p99_us": None if sc.backlog else received["p99_us"],
        "received": received["received"],
        "duplicates": received["duplicates"],
        "expected": count,
        "errors": errors,
    }


class Bench:
    def __init__(self, args: argparse.Namespace, sizes: Sizes) -> None:
        self.args = args
        self.sizes = sizes
        self.deps: Path = args.deps_dir.resolve()
        self.out: Path = args.out

    def run_one(self, sc: Scenario, spec: BrokerSpec, rnd: int) -> RunRecord:
        workdir = self.out / "brokers" / f"{sc.key}-{spec.name}-{rnd + 1}"
        rec = RunRecord(sc.key, spec.name, rnd, {key: None for key, _, _ in METRICS})
        broker = Broker(spec, workdir, self.deps)
        try:
            broker.start()
            ticks, t0 = cpu_ticks(broker.pid), time.monotonic()
            result = run_load(broker, sc, self.sizes, self.args.producers)
            rec.broker_cpu = (cpu_ticks(broker.pid) - ticks) / CLK_TCK / (time.monotonic() - t0)
            rec.values.update({key: result[key] for key, _, _ in METRICS})
            if result["received"] < result["expected"]:
                rec.notes.append(f"received {result['received']} of {result['expected']}")
            if result["duplicates"]:
                rec.notes.append(f"{result['duplicates']} messages received twice (not counted)")
            if result["errors"]:
                rec.notes.append(f"send errors: {', '.join(sorted(set(result['errors'])))}")
        except (BrokerError, OSError) as exc:
            rec.notes.append(f"failed: {str(exc).strip()[:400]}")
        finally:
            code = broker.exit_code()
            if code is not None:
                rec.notes.append(f"the broker process ended during the run (exit code {code})")
            broker.stop()
        if not rec.notes:
            shutil.rmtree(workdir, ignore_errors=True)  # keep a failed run's data and log
        return rec


# ---- the report ---------------------------------------------------------------------------------


def _median(records: list[RunRecord], sc: str, broker: str, key: str) -> float | None:
    values = [r.values[key] for r in records if r.scenario == sc and r.broker == broker]
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


def markdown(results: dict[str, Any], chart: str | None) -> str:
    records = [RunRecord(**r) for r in results["runs"]]
    brokers: list[str] = results["brokers"]
    sizes = Sizes(**results["sizes"])
    labels = {name: BROKERS[name].label for name in brokers}
    lines = [
        "# Pulsar protocol: mop next to pulsar-lite",
        "",
        f"- date: {results['started']}, {results['elapsed_s'] / 60:.1f} minutes:"
        f" `{results['command']}`",
        f"- machine: {machine()}",
        f"- mode: {results['mode']}, {results['runs_per_broker']} runs per broker and scenario;"
        " runs interleaved broker by broker, each on a fresh broker process and data directory;"
        " cells are medians",
        f"- load: pulsar-client {results['client']}, {results['producers']} producer processes"
        f" ({sizes.in_flight} sends in flight each) -> 1 consumer process (Exclusive), one topic,"
        f" {PAYLOAD}-byte messages; unbatched {sizes.unbatched:,}, batched {sizes.batched:,}"
        f" messages per run; paced: 1 producer at {sizes.paced_rate:,} msgs/s, {sizes.paced:,}"
        " messages",
        "- versions: " + "; ".join(f"{labels[n]}: {results['versions'][n]}" for n in brokers),
        "",
        f"Ratios are value / {REFERENCE}'s: above 1 is better for rates, below 1 for latencies."
        " Latency is publish (send_async call) -> receive; under the unbatched and batched loads"
        " it includes the time messages queue in the clients' send windows.",
        "",
        "| scenario | " + " | ".join(labels[b] for b in brokers) + " |",
        "|---|" + "---:|" * len(brokers),
    ]
    for key in results["scenarios"]:
        sc = SCENARIOS[key]
        for metric, name, _ in METRICS:
            ref = _median(records, key, REFERENCE, metric) if REFERENCE in brokers else None
            cells = []
            for broker in brokers:
                value = _median(records, key, broker, metric)
                cell = _fmt(value)
                if ref and value is not None and broker != REFERENCE:
                    cell += f" ({value / ref:.2f}x)"
                cells.append(cell)
            lines.append(f"| {sc.title}: {name} | " + " | ".join(cells) + " |")
    if chart:
        lines += ["", f"![chart]({chart})"]
    notes = [
        f"- {r.scenario} / {labels[r.broker]} / run {r.round + 1}: {'; '.join(r.notes)}"
        for r in records
        if r.notes
    ]
    if notes:
        lines += ["", "## Notes", "", *notes]
    lines += [
        "",
        "## Every run",
        "",
        "| scenario | broker | run | msgs/s | p50 us | p99 us | broker CPU |",
        "|---|---|---:|---:|---:|---:|---:|",
    ]
    for r in records:
        cpu = "-" if r.broker_cpu is None else f"{r.broker_cpu:.2f}"
        lines.append(
            f"| {r.scenario} | {labels[r.broker]} | {r.round + 1} | "
            + " | ".join(_fmt(r.values[m]) for m, _, _ in METRICS)
            + f" | {cpu} |"
        )
    return "\n".join(lines) + "\n"


def chart(path: Path, results: dict[str, Any]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    records = [RunRecord(**r) for r in results["runs"]]
    brokers: list[str] = results["brokers"]
    scenarios: list[str] = results["scenarios"]
    fig, axes = plt.subplots(
        len(METRICS), len(scenarios), squeeze=False, figsize=(4 * len(scenarios), 3 * len(METRICS))
    )
    for row, (metric, name, higher) in enumerate(METRICS):
        for col, key in enumerate(scenarios):
            ax = axes[row][col]
            values = [_median(records, key, b, metric) or 0 for b in brokers]
            ax.bar(
                [BROKERS[b].label for b in brokers],
                values,
                color=["#4c72b0", "#55a868", "#c44e52"][: len(brokers)],
            )
            ax.set_title(
                f"{SCENARIOS[key].title}\n{name} ({'higher' if higher else 'lower'} is better)",
                fontsize=8,
            )
            ax.tick_params(labelsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


# ---- main ---------------------------------------------------------------------------------------


def _names(text: str, known: dict[str, Any], what: str) -> list[str]:
    names = [n.strip() for n in text.split(",") if n.strip()]
    unknown = [n for n in names if n not in known]
    if unknown:
        raise SystemExit(f"unknown {what}: {', '.join(unknown)} (known: {', '.join(known)})")
    return names


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    size = parser.add_mutually_exclusive_group()
    size.add_argument("--quick", action="store_true", help="smaller sizes, one run per broker")
    size.add_argument("--smoke", action="store_true", help="tiny sizes, to check the script")
    parser.add_argument(
        "--brokers", default=",".join(BROKERS), help="comma-separated, from: " + ", ".join(BROKERS)
    )
    parser.add_argument(
        "--scenarios",
        default=",".join(SCENARIOS),
        help="comma-separated, from: " + ", ".join(SCENARIOS),
    )
    parser.add_argument(
        "--runs", type=int, help="runs per broker and scenario (default 3, quick 1)"
    )
    parser.add_argument(
        "--producers",
        type=int,
        default=2,
        help="producer processes for the unbatched and batched loads",
    )
    parser.add_argument("--out", type=Path, help="output directory")
    parser.add_argument(
        "--deps-dir", type=Path, default=BENCH_DIR / ".deps", help="where pulsar-lite is installed"
    )
    parser.add_argument("--no-chart", action="store_true", help="skip the PNG chart")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--worker"]:
        return worker(argv[1:])
    args = parse_args(argv)
    mode = "smoke" if args.smoke else "quick" if args.quick else "full"
    sizes = MODES[mode]
    runs = args.runs or (3 if mode == "full" else 1)
    brokers = _names(args.brokers, BROKERS, "brokers")
    scenarios = _names(args.scenarios, SCENARIOS, "scenarios")
    started = datetime.now(UTC)
    args.out = (args.out or BENCH_DIR / "results" / f"pulsar-{started:%Y%m%d-%H%M%S}").resolve()
    args.out.mkdir(parents=True, exist_ok=True)
    bench = Bench(args, sizes)
    try:
        versions = {name: version(BROKERS[name], bench.deps) for name in brokers}
        if "pulsar-lite" in brokers:
            pulsar_lite_binary(bench.deps)
    except (BrokerError, subprocess.CalledProcessError) as exc:
        print(f"pulsar_bench: {exc}", file=sys.stderr)
        return 1
    import pulsar

    log(
        f"{mode} bench: {len(scenarios)} scenarios x {len(brokers)} brokers x {runs} runs;"
        f" output in {args.out}"
    )
    records: list[RunRecord] = []
    t_start = time.monotonic()
    for key in scenarios:
        for rnd in range(runs):
            for name in brokers:
                rec = bench.run_one(SCENARIOS[key], BROKERS[name], rnd)
                records.append(rec)
                shown = ", ".join(f"{k}={_fmt(v)}" for k, v in rec.values.items())
                log(
                    f"  {key:9} {name:11} run {rnd + 1}: {shown}"
                    + (f"  [{'; '.join(rec.notes)}]" if rec.notes else "")
                )
    results = {
        "command": " ".join(["python", "bench/pulsar_bench.py", *argv]),
        "mode": mode,
        "runs_per_broker": runs,
        "producers": args.producers,
        "client": pulsar.__version__,
        "started": started.strftime("%Y-%m-%d %H:%M UTC"),
        "elapsed_s": time.monotonic() - t_start,
        "brokers": brokers,
        "scenarios": scenarios,
        "sizes": dataclasses.asdict(sizes),
        "versions": versions,
        "runs": [dataclasses.asdict(r) for r in records],
    }
    (args.out / "results.json").write_text(json.dumps(results, indent=1))
    chart_name = None
    if not args.no_chart:
        chart_name = "chart.png"
        chart(args.out / chart_name, results)
    (args.out / "report.md").write_text(markdown(results, chart_name))
    log(f"report: {args.out / 'report.md'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
