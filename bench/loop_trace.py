"""Where a trio broker's event loop spends one message at a steady rate: the anatomy behind the
latency rows of bench/mqtt_bench.py.

A broker (a merged mop node, or the trio floor of bench/floor_server.py) runs in a child process
whose `trio.run` gets an instrument that records every task step and every wait for I/O during
the measured window; the C load generator sends a paced QoS 1 flow (one publisher, one
subscriber, as the `latency1k` scenario) through it. A message's work is one busy period of the
loop: from the wakeup that ends an idle wait to the next idle wait. Printed per broker: the
generator's p50/p99 latency, and per message the loop's busy time, scheduler passes and task
steps by task; then what the slowest busy periods had in them, and the steps per second of each
task, background ones included (timers, storage upkeep).

    python bench/loop_trace.py [--brokers mop,floor] [--rate 1000] [--seconds 4] [--fsync interval]

mop runs from this checkout unless `--mop-source` names another (to compare two trees) or
`--mop-compiled` another environment's Python (a compiled build). The instrument costs a
microsecond or two per step, so the times are a little above those of bench/mqtt_bench.py; the
counts are exact.
"""

from __future__ import annotations

import argparse
import json
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

BENCH_DIR = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH_DIR))

from brokers import MOP_MQTT_SETTINGS, MOP_SOURCE, accepts, free_port, mop_environ  # noqa: E402
from loadgen import build, run  # noqa: E402

# Steps and waits recorded at most (a few seconds at 5k msgs/s); recording stops after.
MAX_EVENTS = 400_000
# A wait for I/O longer than this ends a busy period (the loop had nothing to do).
IDLE_US = 30.0


# -- the child: a broker whose event loop is traced ---------------------------------------------


def _child(kind: str, port: int, warmup: float, seconds: float, out: Path) -> None:
    """Serve as the broker `kind` on `port` with the loop traced; SIGUSR1 opens the measured
    window `warmup` seconds later, for `seconds`; the trace goes to `out` when it stops."""
    import trio

    events: list[tuple[str, int, str]] = []
    clock = time.perf_counter_ns
    window = {"from": 0, "to": 0}

    def open_window(signum: int, frame: object) -> None:
        window["from"] = clock() + int(warmup * 1e9)
        window["to"] = window["from"] + int(seconds * 1e9)

    signal.signal(signal.SIGUSR1, open_window)

    class Recorder(trio.abc.Instrument):  # type: ignore[misc]
        def before_task_step(self, task: trio.lowlevel.Task) -> None:
            self._note("S", task.name)

        def after_task_step(self, task: trio.lowlevel.Task) -> None:
            self._note("E", task.name)

        def before_io_wait(self, timeout: float) -> None:
            self._note("W", "")

        def after_io_wait(self, timeout: float) -> None:
            self._note("A", "")

        def _note(self, kind: str, name: str) -> None:
            now = clock()
            if window["from"] <= now < window["to"] and len(events) < MAX_EVENTS:
                events.append((kind, now, name))

    real_run = trio.run

    def traced_run(*args: Any, **kwargs: Any) -> Any:
        kwargs.setdefault("instruments", [Recorder()])
        return real_run(*args, **kwargs)

    trio.run = traced_run
    try:
        if kind == "floor":
            import floor_server

            trio.run(floor_server.main, port)
        else:
            from mop.cli import main

            sys.argv = ["mop", "run"]
            main()
    finally:
        out.write_text(json.dumps(events))


# -- the parent: load, then the anatomy ---------------------------------------------------------


def _short(name: str) -> str:
    """A task's name without its module path (`ClientHandler.run`, `loop`...)."""
    name = name.split(" ", 1)[0].strip("<>")
    parts = name.split(".")
    keep = [p for p in parts if p != "<locals>"]
    return ".".join(keep[-2:])


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * q))] if ordered else float("nan")


def analyse(raw: list[list[Any]], messages: int) -> dict[str, Any]:
    periods: list[dict[str, Any]] = []
    current: dict[str, Any] | None = None
    waited_from: int | None = None
    step_from: tuple[int, str] | None = None
    steps_per_task: Counter[str] = Counter()
    busy_per_task: Counter[str] = Counter()
    passes = 0
    for kind, at, name in raw:
        if kind == "W":
            waited_from = at
        elif kind == "A":
            passes += 1
            idle = waited_from is not None and (at - waited_from) / 1e3 > IDLE_US
            if idle or current is None:
                if current is not None:
                    periods.append(current)
                current = {"start": at, "end": at, "passes": 0, "steps": Counter()}
            current["passes"] += 1
        elif kind == "S":
            step_from = (at, name)
        elif kind == "E" and step_from is not None:
            task = _short(step_from[1])
            steps_per_task[task] += 1
            busy_per_task[task] += at - step_from[0]
            if current is not None:
                current["end"] = at
                current["steps"][task] += 1
            step_from = None
    if current is not None:
        periods.append(current)
    span = (raw[-1][1] - raw[0][1]) / 1e9 if raw else 0.0
    durations = [(p["end"] - p["start"]) / 1e3 for p in periods]
    with_work = [p for p in periods if p["steps"]]
    p50 = _percentile(durations, 0.5)
    slow = [p for p in with_work if (p["end"] - p["start"]) / 1e3 > 2 * p50]
    slow_steps: Counter[str] = Counter()
    for p in slow:
        slow_steps.update(p["steps"].keys())
    return {
        "span_s": span,
        "messages": messages,
        "periods": len(with_work),
        "busy_p50_us": p50,
        "busy_p99_us": _percentile(durations, 0.99),
        "busy_per_msg_us": sum(busy_per_task.values()) / 1e3 / max(messages, 1),
        "passes_per_msg": passes / max(messages, 1),
        "steps_per_msg": {t: n / max(messages, 1) for t, n in steps_per_task.most_common()},
        "us_per_step": {t: busy_per_task[t] / 1e3 / n for t, n in steps_per_task.items()},
        "steps_per_s": {t: n / span for t, n in steps_per_task.most_common()} if span else {},
        "slow_periods": len(slow),
        "slow_with_task": dict(slow_steps.most_common(8)),
    }


def _run_one(kind: str, args: argparse.Namespace, loadgen: Path) -> dict[str, Any]:
    port = free_port()
    work = Path(tempfile.mkdtemp(prefix=f"loop-trace-{kind}-"))
    trace = work / "trace.json"
    python = str(args.mop_compiled) if kind == "mop" and args.mop_compiled else sys.executable
    # The bench's settings for mop; the child finds this directory's modules (the floor) as
    # those next to its script.
    env = mop_environ(
        work / "data",
        **MOP_MQTT_SETTINGS,
        MOP_PROTOCOLS='["mqtt"]',
        MOP_MQTT__PORT=str(port),
        MOP_PULSAR__PORT="0",
        MOP_STORAGE__FSYNC=args.fsync,
    )
    if kind == "mop" and args.mop_compiled:
        env.pop("PYTHONPATH", None)  # the installed package only
    warmup = 0.5
    argv = [python, str(Path(__file__).resolve()), "--child", kind, "--port", str(port)]
    argv += ["--warmup", str(warmup), "--seconds", str(args.seconds), "--trace", str(trace)]
    started = time.monotonic()
    log = (work / "broker.log").open("wb")
    proc = subprocess.Popen(argv, env=env, cwd=work, stdout=log, stderr=log)
    try:
        while not accepts(port):
            if proc.poll() is not None or time.monotonic() - started > 60:
                raise RuntimeError(f"{kind} did not start; see {work / 'broker.log'}")
            time.sleep(0.05)
        proc.send_signal(signal.SIGUSR1)  # startup is over: measure after the warmup
        out = run(
            loadgen,
            "flow",
            port,
            prefix=f"trace{kind}",
            timeout=args.seconds + 30,
            qos=1,
            inflight=100,
            window=int(args.rate),
            rate=args.rate,
            count=int(args.rate * (args.seconds + warmup)),
            duration=args.seconds + warmup,
            warmup=warmup,
        )
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()
    raw = json.loads(trace.read_text()) if trace.exists() else []
    result = analyse(raw, int(args.rate * args.seconds))
    result.update(lat_p50_us=out.get("lat_p50_us"), lat_p99_us=out.get("lat_p99_us"))
    return result


def _print(kind: str, r: dict[str, Any]) -> None:
    print(f"\n== {kind}: QoS 1 at {r['rate']:.0f} msgs/s, {r['messages']} messages traced")
    print(f"  generator latency p50 / p99: {r['lat_p50_us']} / {r['lat_p99_us']} us")
    print(
        f"  loop per message: {r['busy_per_msg_us']:.1f} us in task steps, "
        f"{r['passes_per_msg']:.2f} scheduler passes; busy periods p50 / p99 "
        f"{r['busy_p50_us']:.0f} / {r['busy_p99_us']:.0f} us"
    )
    print("  task steps per message (us per step):")
    for task, n in list(r["steps_per_msg"].items())[:8]:
        print(f"    {n:6.2f}  ({r['us_per_step'][task]:5.1f} us)  {task}")
    print(
        f"  busy periods over 2x the median: {r['slow_periods']}; tasks that stepped in them: "
        + (", ".join(f"{t} {n}" for t, n in r["slow_with_task"].items()) or "-")
    )
    print("  steps per second of every task:")
    print("    " + ", ".join(f"{t} {n:.0f}" for t, n in r["steps_per_s"].items()))


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--brokers", default="mop,floor", help="from: mop, floor")
    parser.add_argument("--rate", type=float, default=1000.0, help="QoS 1 msgs/s")
    parser.add_argument("--seconds", type=float, default=4.0, help="measured seconds")
    parser.add_argument("--fsync", default="interval", help="mop's storage.fsync")
    source = parser.add_mutually_exclusive_group()
    source.add_argument("--mop-compiled", type=Path, help="a Python with mop installed (compiled)")
    source.add_argument(
        "--mop-source", type=Path, help="a checkout to run mop from (default: this one)"
    )
    parser.add_argument("--deps-dir", type=Path, default=BENCH_DIR / ".deps")
    parser.add_argument("--json", type=Path, help="also write the numbers here")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--warmup", type=float, default=0.5, help=argparse.SUPPRESS)
    parser.add_argument("--trace", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        _child(args.child, args.port, args.warmup, args.seconds, args.trace)
        return 0
    if args.mop_source:
        MOP_SOURCE.root = args.mop_source.resolve()
    loadgen = build(args.deps_dir.resolve())
    results = {}
    for kind in args.brokers.split(","):
        if kind not in ("mop", "floor"):
            parser.error(f"unknown broker {kind!r}: mop or floor")
        results[kind] = _run_one(kind, args, loadgen) | {"rate": args.rate}
        _print(kind, results[kind])
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
