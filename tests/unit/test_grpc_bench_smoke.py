"""A smoke run of bench/grpc_bench.py: tiny counts on one node, so that the suite notices when
the gRPC bench stops working. It measures nothing."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.e2e


def test_grpc_bench_smoke_run_reports_both_protocols(tmp_path: Path) -> None:
    out = tmp_path / "grpc-report"
    done = subprocess.run(
        [sys.executable, str(REPO / "bench" / "grpc_bench.py"), "--smoke", "--out", str(out)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr

    results = json.loads((out / "results.json").read_text())
    runs = {(run["scenario"], run["protocol"]): run for run in results["runs"]}
    assert set(runs) == {
        (scenario, protocol)
        for scenario in ("produce", "consume", "paced")
        for protocol in ("grpc", "pulsar")
    }, runs
    for (scenario, _), run in runs.items():
        assert not run["notes"], run
        values = run["values"]
        if scenario == "paced":
            assert 0 < values["p50_us"] <= values["p99_us"], run
        else:
            assert values["msgs_per_s"] > 0, run
    report = (out / "report.md").read_text()
    assert "| produce, pipelined: msgs/s |" in report
    assert "| paced produce -> consume: p99 latency, us |" in report
