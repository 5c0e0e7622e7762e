"""Smoke runs of the benchmarks (bench/mqtt_bench.py, bench/pulsar_bench.py): tiny counts against
mop only (a merged node, and a separated broker node + proxy), so the suite notices when a bench
stops working. They measure nothing."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
BENCH = REPO / "bench" / "mqtt_bench.py"

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(
        shutil.which("gcc") is None and shutil.which("cc") is None,
        reason="the bench's load generator needs a C compiler",
    ),
]


def _bench(
    script: str, *args: str, timeout: float, ok: bool = True, cwd: Path = REPO
) -> subprocess.CompletedProcess[str]:
    """Run `bench/<script>` with this Python; with `ok`, assert it succeeded."""
    done = subprocess.run(
        [sys.executable, str(REPO / "bench" / script), *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    if ok:
        assert done.returncode == 0, done.stdout + done.stderr
    return done


def test_smoke_run_reports_a_rate_for_mop(tmp_path: Path) -> None:
    out = tmp_path / "report"
    options = ["--smoke", "--brokers", "mop-never", "--scenarios", "qos0", "--no-chart"]
    _bench("mqtt_bench.py", *options, "--out", str(out), "--deps-dir", str(tmp_path), timeout=180)

    results = json.loads((out / "results.json").read_text())
    [run] = results["runs"]
    assert run["values"]["msgs"] > 0, run
    assert run["detail"]["delivered"] > 0, run

    report = (out / "report.md").read_text()
    row = next(line for line in report.splitlines() if line.startswith("| QoS 0, 1 pub -> 1 sub"))
    cell = row.split("|")[2].strip()
    assert re.fullmatch(r"\d+(\.\d+)?k?", cell), row


def test_smoke_run_of_separated_mode_reports_the_hop(tmp_path: Path) -> None:
    """mop-sep-1x1 (a broker node and a proxy) must start, pass its readiness round trip,
    carry a flow and stop; next to mop-never the report must show the cost of the hop."""
    out = tmp_path / "report"
    options = ["--smoke", "--brokers", "mop-never,mop-sep-1x1", "--scenarios", "qos1"]
    paths = ["--out", str(out), "--deps-dir", str(tmp_path)]
    _bench("mqtt_bench.py", *options, "--no-chart", *paths, timeout=180)

    results = json.loads((out / "results.json").read_text())
    runs = {run["broker"]: run for run in results["runs"]}
    separated = runs["mop-sep-1x1"]
    assert not separated["notes"], separated
    assert separated["values"]["msgs"] > 0, separated
    assert separated["detail"]["delivered"] == separated["detail"]["sent"] > 0, separated
    # Its CPU is the sum over its two processes; it carried the flow, so it is not zero.
    assert separated["broker_cpu"] > 0, separated

    report = (out / "report.md").read_text()
    assert "## Separated mode: the cost of the extra hop" in report
    hop = report.split("## Separated mode", 1)[1]
    row = next(line for line in hop.splitlines() if line.startswith("| QoS 1, 1 pub"))
    assert re.fullmatch(r"\d+(\.\d+)?x", row.split("|")[2].strip()), row
    # A run that noted a failure keeps its broker directories; these runs kept none.
    assert not list(out.glob("brokers/*")), list(out.glob("brokers/*"))


@pytest.mark.skipif(shutil.which("mosquitto") is None, reason="the targets compare to mosquitto")
def test_smoke_run_reports_the_targets_with_the_trio_floor(tmp_path: Path) -> None:
    """The floor relay runs a message flow (delivering every message) and the connection
    scenario; the targets section has mop next to mosquitto and next to the floor, with a
    verdict."""
    out = tmp_path / "report"
    brokers = ["--brokers", "mop-never,mosquitto,trio-floor"]
    paths = ["--out", str(out), "--deps-dir", str(tmp_path)]
    scenarios = ["--scenarios", "qos1,fanin,conns"]
    _bench("mqtt_bench.py", "--smoke", *brokers, *scenarios, *paths, timeout=240)

    results = json.loads((out / "results.json").read_text())
    floor_runs = {run["scenario"]: run for run in results["runs"] if run["broker"] == "trio-floor"}
    assert list(floor_runs) == ["qos1", "fanin", "conns"], floor_runs
    for flow in ("qos1", "fanin"):
        run = floor_runs[flow]
        assert not run["notes"], run
        assert run["detail"]["delivered"] == run["detail"]["expected"] > 0, run
        assert run["values"]["msgs"] > 0, run
    assert floor_runs["fanin"]["values"]["dropped"] == 0, floor_runs["fanin"]
    assert floor_runs["qos1"]["detail"]["acked"] == floor_runs["qos1"]["detail"]["sent"]
    assert floor_runs["conns"]["values"]["conn_rate"] > 0, floor_runs

    targets = (out / "report.md").read_text().split("## Targets", 1)[1].split("\n## ", 1)[0]
    table = [line.split("|") for line in targets.splitlines() if line.startswith("| ")]
    rows = {cells[1].strip(): cells[2:-1] for cells in table}
    qos1 = [cell.strip() for cell in rows["QoS 1 1 -> 1 msgs/s"]]
    assert re.fullmatch(r"\d+(\.\d+)?x", qos1[2]), qos1
    assert re.fullmatch(r"\d+(\.\d+)?k?", qos1[3]), qos1  # the floor's number
    assert re.fullmatch(r"\d+(\.\d+)?x", qos1[4]), qos1  # mop / floor
    assert qos1[-1] in ("met", "missed"), qos1
    fanin = [c.strip() for c in rows["fan-in 10 -> 1 wildcard msgs/s / QoS 0 messages dropped"]]
    assert re.fullmatch(r"[\d.]+k? / 0", fanin[3]), fanin
    conns = [c.strip() for c in rows["100 idle connections: connects/s / KB per connection"]]
    assert re.fullmatch(r"[\d.]+k? / [\d.]+", conns[3]), conns
    assert conns[-2] == ">= 15.0k/s, <= 5.0 KB", conns
    assert conns[-1] in ("met", "missed") or conns[-1].startswith("missed: "), conns


def test_pulsar_bench_smoke_run_reports_rates_for_mop(tmp_path: Path) -> None:
    out = tmp_path / "pulsar-report"
    _bench(
        "pulsar_bench.py",
        *("--smoke", "--brokers", "mop-never", "--no-chart"),
        *("--out", str(out), "--deps-dir", str(tmp_path)),
        timeout=180,
    )

    results = json.loads((out / "results.json").read_text())
    scenarios = {run["scenario"]: run["values"] for run in results["runs"]}
    assert set(scenarios) == {"unbatched", "batched", "paced", "backlog"}, scenarios
    for name, values in scenarios.items():
        assert values["msgs_per_s"] > 0, values
        if name == "backlog":  # drained from storage: a rate, no latency of its own
            assert values["p50_us"] is None and values["p99_us"] is None, values
        else:
            assert 0 < values["p50_us"] <= values["p99_us"], values
    report = (out / "report.md").read_text()
    assert "| batched, send_async: msgs/s |" in report


def test_idle_memory_bench_reports_bytes_per_connection() -> None:
    done = _bench("idle_memory.py", "50", timeout=120)
    first = done.stdout.splitlines()[0]
    found = re.fullmatch(r"50 idle connections: (\d+) B per connection", first)
    assert found, first
    # Far more than nothing (a connection is a task, sockets, a session), far less than 50 KB.
    assert 1000 < int(found.group(1)) < 50_000, first
    assert "by where mop made it" in done.stdout and "ClientHandler" in done.stdout


def test_hot_path_bench_reports_every_part() -> None:
    done = _bench("hot_path.py", "--messages", "300", "--repeat", "1", timeout=120)
    first, *parts = done.stdout.splitlines()
    assert first.startswith("compiled modules: "), first
    timed = [re.fullmatch(r"\s*(\w+):\s+(\d+) ns per message", line) for line in parts]
    assert all(timed), parts
    assert [match.group(1) for match in timed if match] == [
        "decode",
        "encode",
        "match",
        "record",
        "pulsar",
        "node0",
        "node1",
    ]
    assert all(int(match.group(2)) > 0 for match in timed if match), parts


def test_the_compiled_column_needs_a_compiled_build(tmp_path: Path) -> None:
    """`mop-compiled` runs the mop installed in the Python given with `--mop-compiled`: without
    one, or with a Python whose mop is this checkout (not a compiled build), the bench says so
    and stops before running anything."""
    base = ("--smoke", "--brokers", "mop-compiled", "--no-chart")
    missing = _bench("mqtt_bench.py", *base, "--out", str(tmp_path / "a"), timeout=120, ok=False)
    assert missing.returncode == 1
    assert "give its Python with --mop-compiled" in missing.stderr
    checkout = _bench(
        "mqtt_bench.py",
        *base,
        *("--mop-compiled", sys.executable, "--out", str(tmp_path / "b")),
        timeout=120,
        ok=False,
        cwd=tmp_path,
    )
    assert checkout.returncode == 1
    assert "this checkout" in checkout.stderr or "not a compiled build" in checkout.stderr
    assert not (tmp_path / "b" / "results.json").exists()


def test_loop_trace_reports_the_anatomy_of_a_message(tmp_path: Path) -> None:
    """bench/loop_trace.py traces the event loop of mop and of the trio floor under a paced
    QoS 1 flow and counts, per message, the scheduler passes and task steps."""
    out = tmp_path / "trace.json"
    done = _bench(
        "loop_trace.py",
        *("--brokers", "mop,floor", "--rate", "200", "--seconds", "0.5", "--json", str(out)),
        timeout=300,
    )
    results = json.loads(out.read_text())
    for kind in ("mop", "floor"):
        result = results[kind]
        assert result["lat_p50_us"] > 0
        # A message wakes the loop at least once (the PUBLISH) and its steps took time.
        assert result["passes_per_msg"] >= 1
        assert result["busy_per_msg_us"] > 0
    # mop's publisher and its subscriber's delivery are different tasks: both step per message.
    assert len([n for n in results["mop"]["steps_per_msg"].values() if n >= 0.5]) >= 2
    assert "scheduler passes" in done.stdout
