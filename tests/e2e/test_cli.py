"""The `mop` command as users run it: a real process, real sockets, real signals."""

from __future__ import annotations

import json
import os
import queue
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

import mop
from tests.e2e.clients import Client

pytestmark = pytest.mark.e2e

STARTUP_TIMEOUT = 20.0
STOP_TIMEOUT = 10.0
LISTENING = re.compile(r"mqtt listening on tcp (?P<host>\S+):(?P<port>\d+)")


def node_environ(tmp_path: Path, **overrides: str) -> dict[str, str]:
    """The test process's environment without MOP_* variables, plus free ports and a data dir."""
    environ = {name: value for name, value in os.environ.items() if not name.startswith("MOP_")}
    # Import the same mop as this test process, installed or not.
    package_root = str(Path(mop.__file__).resolve().parents[1])
    environ["PYTHONPATH"] = os.pathsep.join(
        filter(None, [package_root, os.environ.get("PYTHONPATH")])
    )
    environ.update(
        MOP_DATA_DIR=str(tmp_path / "data"),
        MOP_MQTT__PORT="0",
        MOP_MQTT__WS_PORT="0",
        MOP_MQTT__TLS_PORT="0",
        MOP_PULSAR__PORT="0",
        MOP_ADMIN__PORT="0",
    )
    environ.update(overrides)
    return environ


def run_mop(tmp_path: Path, *args: str, **overrides: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "mop", *args],
        cwd=tmp_path,
        env=node_environ(tmp_path, **overrides),
        capture_output=True,
        text=True,
        timeout=STARTUP_TIMEOUT,
        check=False,
    )


class Node:
    """A `mop run` process whose merged stdout and stderr are read line by line in a thread."""

    def __init__(self, process: subprocess.Popen[str]) -> None:
        self.process = process
        self.output: list[str] = []
        self._lines: queue.Queue[str | None] = queue.Queue()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self._lines.put(line)
        self._lines.put(None)

    def wait_for(self, pattern: re.Pattern[str], timeout: float) -> re.Match[str]:
        deadline = time.monotonic() + timeout
        while (remaining := deadline - time.monotonic()) > 0:
            try:
                line = self._lines.get(timeout=remaining)
            except queue.Empty:
                break
            if line is None:
                break
            self.output.append(line)
            if match := pattern.search(line):
                return match
        pytest.fail(f"no line matching {pattern.pattern!r}; output so far:\n{''.join(self.output)}")

    def rest(self) -> list[str]:
        """Every line not read yet, once the process has ended; `output` holds them all then."""
        while (line := self._lines.get(timeout=STOP_TIMEOUT)) is not None:
            self.output.append(line)
        self._lines.put(None)  # for a later call
        return self.output

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()
        self._reader.join(timeout=STOP_TIMEOUT)
        assert self.process.stdout is not None
        self.process.stdout.close()


@pytest.fixture
def start_node(tmp_path: Path) -> Iterator[Callable[..., Node]]:
    nodes: list[Node] = []

    def start(**overrides: str) -> Node:
        process = subprocess.Popen(
            [sys.executable, "-m", "mop", "run"],
            cwd=tmp_path,
            env=node_environ(tmp_path, **overrides),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        nodes.append(Node(process))
        return nodes[-1]

    yield start
    for node in nodes:
        node.stop()


def test_run_serves_until_sigterm(start_node: Callable[..., Node]) -> None:
    node = start_node()
    listening = node.wait_for(LISTENING, STARTUP_TIMEOUT)
    port = int(listening["port"])
    assert port != 0
    with socket.create_connection((listening["host"], port), timeout=STARTUP_TIMEOUT):
        pass
    node.process.send_signal(signal.SIGTERM)
    assert node.process.wait(timeout=STOP_TIMEOUT) == 0


def test_run_stops_on_sigint(start_node: Callable[..., Node]) -> None:
    node = start_node()
    node.wait_for(LISTENING, STARTUP_TIMEOUT)
    node.process.send_signal(signal.SIGINT)
    assert node.process.wait(timeout=STOP_TIMEOUT) == 0


def test_run_writes_one_json_object_per_line(start_node: Callable[..., Node]) -> None:
    node = start_node(MOP_LOG_FORMAT="json")
    port = int(node.wait_for(LISTENING, STARTUP_TIMEOUT)["port"])
    Client(port, "json-log-client", username="jo").disconnect()
    node.wait_for(re.compile(r"client\.disconnected"), STARTUP_TIMEOUT)
    node.process.send_signal(signal.SIGTERM)
    assert node.process.wait(timeout=STOP_TIMEOUT) == 0
    lines = [json.loads(line) for line in node.rest()]
    assert all({"time", "level", "logger", "message"} <= line.keys() for line in lines)
    [connected] = [line for line in lines if line.get("event") == "client.connected"]
    assert connected["logger"] == "mop.mqtt.connections"
    assert connected["level"] == "INFO"
    assert (connected["client_id"], connected["username"]) == ("json-log-client", "jo")
    assert "json-log-client" in connected["message"]
    [gone] = [line for line in lines if line.get("event") == "client.disconnected"]
    assert gone["reason"] == "normal"
    assert "received SIGTERM, stopping" in [line["message"] for line in lines]


def test_separated_mode_needs_a_service_url(tmp_path: Path) -> None:
    result = run_mop(tmp_path, "run", MOP_MODE="separated")
    assert result.returncode == 1
    errors = [line for line in result.stderr.splitlines() if line.startswith("mop: error:")]
    assert len(errors) == 1, result.stderr
    assert "cluster.service_url" in errors[0]
    assert "Traceback" not in result.stderr


def test_invalid_setting_exits_2_with_one_line(tmp_path: Path) -> None:
    result = run_mop(tmp_path, "run", MOP_MQTT__PORT="abc")
    assert result.returncode == 2
    assert result.stderr.splitlines() == [
        "mop: error: mqtt.port: must be an integer between 0 and 65535 (got 'abc')"
    ]


def test_missing_config_file_exits_2(tmp_path: Path) -> None:
    result = run_mop(tmp_path, "run", "--config", "missing.toml")
    assert result.returncode == 2
    assert result.stderr.splitlines() == ["mop: error: missing.toml: settings file not found"]


def test_version(tmp_path: Path) -> None:
    result = run_mop(tmp_path, "--version")
    assert result.returncode == 0
    assert re.fullmatch(r"mop \S+\n", result.stdout)


def test_config_prints_effective_settings(tmp_path: Path) -> None:
    result = run_mop(tmp_path, "config", MOP_MQTT__PORT="1884")
    assert result.returncode == 0
    assert "[default.mqtt]" in result.stdout
    assert "\nport = 1884\n" in result.stdout


def test_run_logs_the_storage_recovery_once(start_node: Callable[..., Node]) -> None:
    node = start_node()
    node.wait_for(LISTENING, STARTUP_TIMEOUT)
    node.process.send_signal(signal.SIGTERM)
    assert node.process.wait(timeout=STOP_TIMEOUT) == 0
    recovery = [line for line in node.rest() if "recovered 0 topics" in line]
    assert len(recovery) == 1, recovery
    assert " mop.storage: " in recovery[0]


@pytest.mark.parametrize("setting", ["MOP_MQTT__PORT", "MOP_PULSAR__PORT", "MOP_ADMIN__PORT"])
def test_a_port_in_use_stops_the_start_before_anything_is_written(
    tmp_path: Path, setting: str
) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = run_mop(tmp_path, "run", **{setting: str(port)})
    assert result.returncode == 1
    errors = [line for line in result.stderr.splitlines() if line.startswith("mop: error:")]
    assert len(errors) == 1 and f"127.0.0.1:{port}" in errors[0], result.stderr
    assert "Address already in use" in errors[0]
    # No storage files: the next start must not find a data directory of a node never served.
    assert not (tmp_path / "data").exists(), sorted((tmp_path / "data").rglob("*"))
