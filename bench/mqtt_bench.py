"""MQTT broker comparison: mop merged (fsync never / interval / always) and separated (proxies in
front of mop broker nodes) next to mosquitto, aedes and amqtt on loopback, runs interleaved broker
by broker, medians, ratios to mosquitto, a chart.

    python bench/mqtt_bench.py --quick            # about 4 minutes, one run each, smaller sizes
    python bench/mqtt_bench.py                    # the full comparison, median of 3 (~15 minutes)
    python bench/mqtt_bench.py --brokers mop-never,mosquitto --scenarios qos0,fanout
    python bench/mqtt_bench.py --brokers mop-never,mop-sep-1x1,mop-sep-2x2,mosquitto
    python bench/mqtt_bench.py --profile          # py-spy profile of mop under qos0, fanout, qos1
    python bench/mqtt_bench.py --brokers mop-interval,mop-compiled,mosquitto,trio-floor \
        --mop-compiled /path/to/venv/bin/python   # a compiled build beside the checkout's mop

See bench/README.md for what each scenario does and how the numbers are taken.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import resource
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from brokers import (
    BENCH_DIR,
    BROKERS,
    DEFAULT_BROKERS,
    QUEUED_MESSAGES,
    REFERENCE,
    Broker,
    BrokerError,
    BrokerSpec,
    BrokerUnderTest,
    free_port,
    install,
    snapshot_mop,
    stop_on_sigterm,
    use_compiled_mop,
    use_installed_mop,
    version,
)
from loadgen import LoadgenError, build, relay
from loadgen import run as run_load
from profile_mop import ProfileError, record, summarize
from report import RunRecord, chart, markdown, medians
from scenarios import (
    DEFAULT_SCENARIOS,
    FULL,
    QUICK,
    SCENARIOS,
    SMOKE,
    RunContext,
    RunResult,
    Scenario,
    Sizes,
    Skipped,
)
from scrape import Scraper
from separated import SeparatedBroker
from targets import section as targets_section

CLK_TCK = os.sysconf("SC_CLK_TCK")
MODES = {"full": FULL, "quick": QUICK, "smoke": SMOKE}
RATE = 200  # py-spy samples per second


def log(message: str) -> None:
    print(message, flush=True)


def _names(text: str, known: Mapping[str, object], what: str) -> list[str]:
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
    size.add_argument(
        "--smoke", action="store_true", help="tiny sizes (the test suite's smoke run)"
    )
    parser.add_argument(
        "--brokers",
        default=",".join(DEFAULT_BROKERS),
        help="comma-separated, from: " + ", ".join(BROKERS),
    )
    parser.add_argument(
        "--scenarios",
        default=",".join(DEFAULT_SCENARIOS),
        help="comma-separated, from: " + ", ".join(SCENARIOS),
    )
    parser.add_argument(
        "--runs", type=int, help="runs per broker and scenario (default 3, quick 1)"
    )
    parser.add_argument("--out", type=Path, help="output directory (default bench/results/<time>)")
    parser.add_argument(
        "--deps-dir",
        type=Path,
        default=BENCH_DIR / ".deps",
        help="where the references and the generator are installed",
    )
    parser.add_argument(
        "--no-chart", action="store_true", help="skip the PNG chart (no matplotlib)"
    )
    source = parser.add_mutually_exclusive_group()
    source.add_argument(
        "--mop-commit",
        metavar="REV",
        help="run mop as committed in REV (extracted with git archive into the output "
        "directory) instead of from the working tree, which others may edit during a long run",
    )
    source.add_argument(
        "--mop-installed",
        action="store_true",
        help="run mop as installed in this Python (e.g. a compiled build, "
        "`COMPILE_MOP=1 pip install .`) instead of from the working tree",
    )
    parser.add_argument(
        "--mop-compiled",
        metavar="PYTHON",
        type=Path,
        help="the Python of an environment with a compiled build of mop "
        "(`COMPILE_MOP=1 pip install .`), which the broker mop-compiled (fsync interval) runs, "
        "beside mop from this checkout",
    )
    publish = parser.add_mutually_exclusive_group()
    publish.add_argument(
        "--publish",
        action="store_const",
        const=BENCH_DIR / "RESULTS.md",
        dest="publish_to",
        help="also write the report to bench/RESULTS.md and the chart to bench/RESULTS.png",
    )
    publish.add_argument(
        "--publish-to",
        type=Path,
        metavar="PATH",
        help="also write the report to PATH (e.g. bench/RESULTS-separated.md) and the chart "
        "next to it (PATH with .png)",
    )
    parser.add_argument(
        "--profile",
        action="store_true",
        help="only profile mop (fsync never) with py-spy under qos0 and fanout",
    )
    parser.add_argument(
        "--profile-broker",
        default="mop-never",
        help="the mop deployment to profile (mop-never, or mop-sep-1x1 / mop-sep-2x2: every "
        "proxy and broker node is profiled apart)",
    )
    parser.add_argument(
        "--report-from",
        type=Path,
        metavar="RESULTS_JSON",
        help="only write the report (and chart) again from an earlier run's results.json",
    )
    parser.add_argument(
        "--scrape-metrics",
        type=float,
        default=0.0,
        metavar="SECONDS",
        help="GET a merged mop node's /metrics every SECONDS while each run loads it; the last "
        "page is kept in <out>/metrics/ and summed up in the run's line (default: off)",
    )
    parser.add_argument("--profile-seconds", type=float, default=8.0)
    parser.add_argument(
        "--profile-scenarios",
        default="qos0,fanout,qos1",
        help="scenarios to profile under (default qos0,fanout,qos1)",
    )
    return parser.parse_args(argv)


def raise_fd_limit() -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


def busy_ticks() -> int:
    """Ticks the whole machine spent not idle (all CPUs)."""
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    return sum(fields) - fields[3] - fields[4]


def _free_ports(count: int) -> list[int]:
    """`count` different free loopback ports (a separated broker needs several)."""
    if count == 1:
        return [free_port()]
    with contextlib.ExitStack() as stack:
        socks = [stack.enter_context(socket.socket()) for _ in range(count)]
        for sock in socks:
            sock.bind(("127.0.0.1", 0))
        return [int(sock.getsockname()[1]) for sock in socks]


def children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


class Bench:
    def __init__(self, args: argparse.Namespace, sizes: Sizes) -> None:
        self.args = args
        self.sizes = sizes
        self.deps = args.deps_dir.resolve()
        self.out: Path = args.out
        self.loadgen = build(self.deps)
        self.ports: dict[str, list[int]] = {}

    def _start(self, spec: BrokerSpec, workdir: Path) -> BrokerUnderTest:
        for attempt in range(2):
            ports = self.ports.setdefault(spec.name, _free_ports(spec.port_count))
            broker: BrokerUnderTest = (
                SeparatedBroker(spec, ports, workdir, self.deps)
                if spec.separated
                else Broker(spec, ports[0], workdir, self.deps)
            )
            try:
                broker.start()
                return broker
            except BrokerError:
                if attempt:
                    raise
                # A port may have been taken meanwhile.
                self.ports[spec.name] = _free_ports(spec.port_count)
        raise AssertionError("unreachable")

    def run_one(self, sc: Scenario, spec: BrokerSpec, rnd: int) -> RunRecord:
        """One run on a fresh broker; run again once if the broker process ended during the run
        (on a shared machine something else may stop it), keeping the first attempt's note."""
        rec, died = self._attempt(sc, spec, rnd, "")
        if died:
            retry, _ = self._attempt(sc, spec, rnd, "-retry")
            retry.notes.insert(0, f"first attempt discarded: {'; '.join(rec.notes)}")
            rec = retry
        return rec

    def _attempt(
        self, sc: Scenario, spec: BrokerSpec, rnd: int, suffix: str
    ) -> tuple[RunRecord, bool]:
        workdir = self.out / "brokers" / f"{sc.key}-{spec.name}-{rnd + 1}{suffix}"
        prefix = f"{sc.key[:3]}{rnd}{suffix[:2]}{os.getpid() % 1000}"
        rec = RunRecord(sc.key, spec.name, rnd, {m.key: None for m in sc.metrics}, [])
        broker: BrokerUnderTest | None = None
        died = False
        try:
            broker = self._start(spec, workdir)
            scraper = self._scraper(broker, workdir)
            ticks, busy = broker.cpu_ticks(), busy_ticks()
            child, t0 = children_cpu(), time.monotonic()
            with scraper or contextlib.nullcontext():
                result: RunResult = sc.run(RunContext(broker, self.loadgen, self.sizes, prefix))
            wall = time.monotonic() - t0
            rec.broker_cpu = (broker.cpu_ticks() - ticks) / CLK_TCK / wall
            rec.loadgen_cpu = (children_cpu() - child) / wall
            rec.background_cpu = max(
                0.0, (busy_ticks() - busy) / CLK_TCK / wall - rec.broker_cpu - rec.loadgen_cpu
            )
            rec.values.update(result.values)
            rec.notes += result.notes
            rec.marked = result.marked
            rec.detail = result.detail
            if scraper is not None:
                self._keep_metrics(scraper, rec, workdir.name)
        except (LoadgenError, BrokerError, OSError) as exc:
            rec.notes.append(f"failed: {str(exc).strip()[:400]}")
        finally:
            if broker is not None:
                code = broker.exit_code()
                if code is not None:
                    died = True
                    rec.values = {m.key: None for m in sc.metrics}
                    rec.notes.append(f"the broker process ended during the run (exit code {code})")
                broker.stop()
        if not rec.notes and workdir.exists():
            shutil.rmtree(workdir, ignore_errors=True)  # keep a failed run's data and log
        return rec, died

    def _scraper(self, broker: BrokerUnderTest, workdir: Path) -> Scraper | None:
        """With --scrape-metrics, a scraper of a merged mop node's /metrics."""
        if not self.args.scrape_metrics or not isinstance(broker, Broker):
            return None
        if broker.spec.kind != "mop":
            return None
        return Scraper(workdir / "broker.log", self.args.scrape_metrics)

    def _keep_metrics(self, scraper: Scraper, rec: RunRecord, name: str) -> None:
        if scraper.failures:
            rec.notes.append(f"/metrics: {scraper.failures[-1]}")
        if scraper.last:
            directory = self.out / "metrics"
            directory.mkdir(exist_ok=True)
            (directory / f"{name}.prom").write_text(scraper.last)
            rec.detail["metrics"] = scraper.summary()

    def ceiling(self) -> str:
        """What the generator moves through a relay that does no broker work at all."""
        port = free_port()
        with relay(self.loadgen, port, timeout=60):
            one = run_load(
                self.loadgen,
                "flow",
                port,
                prefix="ceil",
                count=20_000_000,
                duration=1.0,
                window=20_000,
                timeout=20,
            )
            fan = run_load(
                self.loadgen,
                "flow",
                port,
                prefix="ceil",
                subs=100,
                count=1_000_000,
                duration=1.0,
                window=500,
                timeout=20,
            )
        return (
            "C, one epoll thread (bench/loadgen.c); through a null relay (no broker work) it moves "
            f"{one['msgs_per_s'] / 1e6:.1f}M msgs/s 1 -> 1 and "
            f"{fan['deliveries_per_s'] / 1e6:.1f}M deliveries/s 1 -> 100 on this machine"
        )


def run_bench(args: argparse.Namespace) -> int:
    mode = "smoke" if args.smoke else "quick" if args.quick else "full"
    sizes = MODES[mode]
    runs = args.runs or (3 if mode == "full" else 1)
    broker_names = _names(args.brokers, BROKERS, "brokers")
    scenario_names = _names(args.scenarios, SCENARIOS, "scenarios")
    specs = [BROKERS[n] for n in broker_names]
    scenarios = [SCENARIOS[n] for n in scenario_names]
    started = datetime.now(UTC)
    args.out = (args.out or BENCH_DIR / "results" / started.strftime("%Y%m%d-%H%M%S")).resolve()
    args.out.mkdir(parents=True, exist_ok=True)
    raise_fd_limit()
    if "mop-compiled" in broker_names:
        log(f"mop-compiled: {use_compiled_mop(args.mop_compiled)}")
    if args.mop_commit:
        commit = snapshot_mop(args.mop_commit, args.out / "mop-source")
        log(f"mop from commit {commit}, extracted into {args.out / 'mop-source'}")
    install(specs, args.deps_dir.resolve(), log)
    bench = Bench(args, sizes)
    versions = {s.name: version(s, bench.deps) for s in specs}
    ceiling = "C, one epoll thread (bench/loadgen.c)" if mode == "smoke" else bench.ceiling()
    estimate = (
        sum((sc.expected_s + 2) * sum(1 for spec in specs if _serves(spec, sc)) for sc in scenarios)
        * runs
    )
    log(
        f"{mode} bench: {len(scenarios)} scenarios x {len(specs)} brokers x {runs} runs, "
        f"about {estimate / 60:.0f} minutes; output in {args.out}"
    )
    log(f"load generator: {ceiling}")
    records: list[RunRecord] = []
    skipped: dict[str, str] = {}
    t_start = time.monotonic()
    for sc in scenarios:
        for rnd in range(runs):
            for spec in specs:
                if not _serves(spec, sc):
                    continue
                try:
                    rec = bench.run_one(sc, spec, rnd)
                except Skipped as exc:
                    skipped[sc.key] = str(exc)
                    log(f"  {sc.key}: skipped: {exc}")
                    break
                records.append(rec)
                shown = ", ".join(
                    f"{k}={v:.6g}" if v is not None else f"{k}=-" for k, v in rec.values.items()
                )
                metrics = rec.detail.get("metrics")
                if metrics:
                    shown += " /metrics " + ", ".join(f"{k}={v:.0f}" for k, v in metrics.items())
                log(
                    f"  {sc.key:9} {spec.name:13} run {rnd + 1}: {shown}"
                    + (f"  [{'; '.join(rec.notes)}]" if rec.notes else "")
                )
            if sc.key in skipped:
                break
    results = {
        "command": " ".join(["python", "bench/mqtt_bench.py", *sys.argv[1:]]),
        "mode": mode,
        "runs_per_broker": runs,
        "started": started.strftime("%Y-%m-%d %H:%M UTC"),
        "elapsed_s": time.monotonic() - t_start,
        "brokers": broker_names,
        "scenarios": scenario_names,
        "sizes": dataclasses.asdict(sizes),
        "versions": versions,
        "ceiling": ceiling,
        "skipped": skipped,
        "runs": [dataclasses.asdict(r) for r in records],
    }
    (args.out / "results.json").write_text(json.dumps(results, indent=1))
    write_reports(results, args.out, chart_png=not args.no_chart, publish_to=args.publish_to)
    return 0


def _serves(spec: BrokerSpec, sc: Scenario) -> bool:
    """Whether `spec` runs `sc`: the trio floor runs only the scenarios marked `floor`."""
    return spec.kind != "floor" or sc.floor


def write_reports(
    results: dict[str, Any], out: Path, *, chart_png: bool, publish_to: Path | None
) -> None:
    """report.md (and chart.png) in `out` from a results.json; with `publish_to` also that
    file and the chart next to it (bench/RESULTS.md and RESULTS.png for --publish)."""
    records = [RunRecord(**r) for r in results["runs"]]
    scenarios = [SCENARIOS[k] for k in results["scenarios"]]
    brokers: list[str] = results["brokers"]
    labels = {name: BROKERS[name].label for name in brokers}
    sizes = Sizes(**results["sizes"])
    chart_name = None
    if chart_png:
        _ensure_matplotlib()
        chart_name = "chart.png"
        chart(
            out / chart_name,
            records=records,
            scenarios=scenarios,
            brokers=brokers,
            labels=labels,
            sizes=sizes,
            skipped=results["skipped"],
        )
    report: dict[str, Any] = dict(
        title="MQTT brokers side by side",
        records=records,
        scenarios=scenarios,
        brokers=brokers,
        labels=labels,
        versions=results["versions"],
        sizes=sizes,
        sizes_name=f"{results['mode']}, {results['runs_per_broker']} runs per broker and scenario",
        reference=REFERENCE,
        started=results["started"],
        elapsed_s=results["elapsed_s"],
        ceiling=results["ceiling"],
        skipped=results["skipped"],
        command=results["command"],
        hop=_hop(brokers),
        notes=_separated_notes(brokers, results["scenarios"], sizes),
        targets=targets_section(
            medians(records),
            brokers,
            labels,
            REFERENCE,
            sizes,
            results["scenarios"],
            results["skipped"],
        ),
    )
    (out / "report.md").write_text(markdown(**report, chart=chart_name))
    if publish_to is not None:
        published = None
        if chart_name:
            published = publish_to.with_suffix(".png").name
            shutil.copyfile(out / chart_name, publish_to.with_name(published))
        publish_to.write_text(markdown(**report, chart=published))
        log(f"published: {publish_to}")
    log(f"report: {out / 'report.md'}")


def _hop(brokers: list[str]) -> tuple[str, list[str]] | None:
    """(merged, separated brokers) when the run has both: the report then shows the hop's cost
    against the merged node with the same storage settings as the separated brokers."""
    separated = [b for b in brokers if BROKERS[b].separated]
    merged = {
        BROKERS[b].fsync: b
        for b in brokers
        if BROKERS[b].kind == "mop" and b not in separated and not BROKERS[b].compiled
    }
    fsyncs = {BROKERS[b].fsync for b in separated}
    if not separated or len(fsyncs) != 1 or fsyncs.isdisjoint(merged):
        return None
    return merged[fsyncs.pop()], separated


def _separated_notes(brokers: list[str], scenarios: list[str], sizes: Sizes) -> list[str]:
    specs = [BROKERS[b] for b in brokers if BROKERS[b].separated]
    if not specs:
        return []
    notes = [
        "; ".join(
            f"{s.label}: {s.proxies} MQTT prox{'y' if s.proxies == 1 else 'ies'} in front of "
            + ("1 mop broker node" if s.nodes == 1 else f"{s.nodes} mop broker nodes (one cluster)")
            + f" that serve only the Pulsar protocol, fsync {s.fsync}"
            for s in specs
        )
        + "; all started from this checkout with default settings plus the bench's. Publishers "
        "connect to the first proxy, subscribers to the last, idle connections alternate. Their "
        "broker CPU (Every run) and RSS per connection are sums over all their processes.",
    ]
    if "session" in scenarios:
        notes.append(
            "session: a separated proxy does not bound the messages queued for a session "
            "(`mqtt.max_queued_messages` is applied by a merged node only); the scenario "
            f"queues {sizes.queued}, under the {QUEUED_MESSAGES} every broker is given, so the "
            "bound plays no part in any broker's number."
        )
    return notes


def _ensure_matplotlib() -> None:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        log("installing matplotlib with pip for the chart")
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", "matplotlib"], check=True)


def run_profile(args: argparse.Namespace) -> int:
    """Profile mop (fsync never) with py-spy while it serves each scenario in turn."""
    started = datetime.now(UTC)
    out = (
        args.out or BENCH_DIR / "results" / f"profile-{started.strftime('%Y%m%d-%H%M%S')}"
    ).resolve()
    out.mkdir(parents=True, exist_ok=True)
    args.out = out
    bench = Bench(args, FULL)
    seconds = args.profile_seconds
    sizes = dataclasses.replace(FULL, duration=seconds, count=100_000_000, timeout=seconds + 30)
    spec = BROKERS[args.profile_broker]
    parts = [f"# mop profile ({version(spec, bench.deps)}), {started:%Y-%m-%d %H:%M} UTC", ""]
    for key in _names(args.profile_scenarios, SCENARIOS, "scenarios"):
        sc = SCENARIOS[key]
        broker = bench._start(spec, out / f"broker-{key}")
        # One sampler per process: a separated deployment's proxies and nodes apart.
        members = (
            [(m.name, m.pid) for m in broker.members]
            if isinstance(broker, SeparatedBroker)
            else [("mop", broker.pid)]
        )
        raws = {name: out / f"{key}-{name}.collapsed.txt" for name, _pid in members}
        try:
            samplers = [record(pid, seconds, raws[name], RATE) for name, pid in members]
            time.sleep(0.3)
            result = sc.run(RunContext(broker, bench.loadgen, sizes, f"prof{key}"))
            for sampler in samplers:
                sampler.wait(seconds + 30)
        finally:
            broker.stop()
        shown = ", ".join(f"{k} = {v:,.0f}" for k, v in result.values.items() if v is not None)
        parts += [f"## {sc.title} ({shown} while sampled)", ""]
        for name, raw in raws.items():
            if len(raws) > 1:
                parts += [f"### {name}", ""]
            parts += [summarize(raw, seconds, RATE)]
        log(f"  profiled {key}: {shown}")
    (out / "profile.md").write_text("\n".join(parts))
    log(f"profile: {out / 'profile.md'}")
    return 0


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    stop_on_sigterm()
    try:
        if args.report_from:
            results = json.loads(args.report_from.read_text())
            out = args.report_from.resolve().parent
            write_reports(results, out, chart_png=not args.no_chart, publish_to=args.publish_to)
            return 0
        if args.mop_installed:
            log(f"mop as installed: {use_installed_mop()}")
        return run_profile(args) if args.profile else run_bench(args)
    except (LoadgenError, BrokerError, ProfileError) as exc:
        print(f"mqtt_bench: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
