"""deploy/separated/run-local: the documented way to try the separated topology on one machine.

It starts 2 mop brokers and 2 MQTT proxies from deploy/separated/*.toml; an MQTT message published
through one proxy must reach a subscriber of the other, over topics owned by both brokers, and
Ctrl-C must stop all four processes cleanly.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import os
import queue
import random
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest

from mop.membership import Membership
from mop.settings import Settings
from mop.topic_names import mqtt_to_pulsar
from tests.e2e.clients import Client

pytestmark = pytest.mark.e2e

LAUNCHER = Path(__file__).resolve().parents[3] / "deploy" / "separated" / "run-local"
READY = re.compile(r"run-local: brokers (?P<brokers>.+); MQTT proxies (?P<proxies>.+); Ctrl-C")
STARTUP_TIMEOUT = 90.0


def consecutive_free_ports(count: int, attempts: int = 50) -> int:
    """The first of `count` consecutive loopback ports that are free right now."""
    for _ in range(attempts):
        base = random.randrange(20000, 60000 - count)
        sockets = []
        try:
            for port in range(base, base + count):
                sock = socket.socket()
                sockets.append(sock)
                sock.bind(("127.0.0.1", port))
        except OSError:
            continue
        finally:
            for sock in sockets:
                sock.close()
        return base
    raise RuntimeError(f"no {count} consecutive free ports found")


class Launcher:
    def __init__(self, tmp_path: Path) -> None:
        self.broker_port = consecutive_free_ports(2)
        self.mqtt_port = consecutive_free_ports(2)
        admin_port = consecutive_free_ports(4)
        environ = {k: v for k, v in os.environ.items() if not k.startswith("MOP_")}
        self.process = subprocess.Popen(
            [
                sys.executable,
                str(LAUNCHER),
                f"--broker-port={self.broker_port}",
                f"--mqtt-port={self.mqtt_port}",
                f"--admin-port={admin_port}",
                "--fsync=never",
                f"--data-dir={tmp_path / 'data'}",
            ],
            env=environ,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        self.lines: queue.Queue[str] = queue.Queue()
        self.output: list[str] = []
        self._pumping = threading.Thread(target=self._pump, daemon=True)
        self._pumping.start()

    def _pump(self) -> None:
        assert self.process.stdout is not None
        with self.process.stdout:
            for line in self.process.stdout:
                self.output.append(line)
                self.lines.put(line)

    def wait_ready(self) -> re.Match[str]:
        deadline = time.monotonic() + STARTUP_TIMEOUT
        while (remaining := deadline - time.monotonic()) > 0:
            try:
                line = self.lines.get(timeout=min(remaining, 1.0))
            except queue.Empty:
                assert self.process.poll() is None, "".join(self.output)
                continue
            if ready := READY.search(line):
                return ready
        raise AssertionError("launcher not ready:\n" + "".join(self.output))

    def interrupt(self) -> int:
        self.process.send_signal(signal.SIGINT)
        return self.process.wait(60)

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()
        self._pumping.join(10)  # it reads up to the end of the output, then closes the pipe


@pytest.fixture
def launcher(tmp_path: Path) -> Iterator[Launcher]:
    running = Launcher(tmp_path)
    try:
        yield running
    finally:
        running.kill()


def test_run_local_serves_mqtt_across_proxies_and_brokers_and_stops_cleanly(
    launcher: Launcher,
) -> None:
    ready = launcher.wait_ready()
    brokers = [url.strip() for url in ready["brokers"].split(",")]
    assert brokers == [f"pulsar://127.0.0.1:{launcher.broker_port + i}" for i in range(2)]
    # Topics whose owners cover both brokers, so the proxies must follow lookup redirects.
    ownership = Membership(brokers, brokers[0])
    topics = [f"launcher/t{i}" for i in range(16)]
    owners = {ownership.owner(mqtt_to_pulsar(topic)) for topic in topics}
    assert owners == set(brokers)

    subscriber = Client(launcher.mqtt_port + 1, "launcher-sub", version=5)
    subscriber.subscribe("launcher/#", qos=1)
    publisher = Client(launcher.mqtt_port, "launcher-pub", version=5)
    # A wildcard subscription in separated mode finds new topics by polling: publish until the
    # first message arrives (bounded), then check every topic delivers.
    deadline = time.monotonic() + 30
    first: list[bytes] = []
    while not first:
        assert time.monotonic() < deadline, "no message crossed the proxies"
        assert publisher.publish("launcher/warmup", b"warm", qos=1) == 0
        try:
            first.append(subscriber.messages.get(timeout=1.0).payload)
        except queue.Empty:
            continue
    for topic in topics:
        assert publisher.publish(topic, topic.encode(), qos=1) == 0
    received: dict[str, bytes] = {}
    deadline = time.monotonic() + 30
    while set(received) != set(topics):
        remaining = deadline - time.monotonic()
        assert remaining > 0, f"missing {sorted(set(topics) - set(received))}"
        try:
            message = subscriber.messages.get(timeout=remaining)
        except queue.Empty:
            continue
        if message.topic != "launcher/warmup":
            received[message.topic] = message.payload
    assert received == {topic: topic.encode() for topic in topics}

    subscriber.disconnect()
    publisher.disconnect()
    assert launcher.interrupt() == 0, "".join(launcher.output)
    text = "".join(launcher.output)
    assert "run-local: stopped" in text
    assert "stopped with status" not in text


def launcher_module() -> ModuleType:
    """run-local as a module (it is a script without the .py suffix), for its pure parts."""
    loader = importlib.machinery.SourceFileLoader("run_local", str(LAUNCHER))
    spec = importlib.util.spec_from_loader("run_local", loader)
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["run_local"] = module  # its dataclasses look their module up
    loader.exec_module(module)
    return module


def test_the_default_ports_are_not_those_of_mop_run(tmp_path: Path) -> None:
    run_local = launcher_module()
    members = run_local.plan(run_local.parser().parse_args([]), tmp_path)
    ports = set(run_local.planned_ports(members))
    assert len(ports) == 8  # 2 brokers and 2 proxies, each with its admin port
    defaults = Settings()
    taken_by_mop_run = {
        defaults.mqtt.port,
        defaults.mqtt.ws_port,
        defaults.mqtt.tls_port,
        defaults.pulsar.port,
        defaults.admin.port,
    }
    assert not ports & taken_by_mop_run


def test_a_port_in_use_stops_it_before_anything_starts(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = subprocess.run(
            [
                sys.executable,
                str(LAUNCHER),
                f"--broker-port={consecutive_free_ports(2)}",
                f"--mqtt-port={port}",
                f"--admin-port={consecutive_free_ports(4)}",
                f"--python={sys.executable}",
            ],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
    assert done.returncode == 2, done
    assert f"{port} (proxy-1 MQTT)" in done.stderr and "in use" in done.stderr, done.stderr
    assert "[broker-1]" not in done.stdout


def test_without_a_python_that_can_run_mop_it_says_what_to_do_in_one_line(tmp_path: Path) -> None:
    python = tmp_path / "python"
    python.write_text("#!/bin/sh\necho 'ModuleNotFoundError: trio' >&2\nexit 1\n")
    python.chmod(0o755)
    done = subprocess.run(
        [sys.executable, str(LAUNCHER), f"--python={python}"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 2, done
    [line] = done.stderr.splitlines()
    assert line.startswith(f"run-local: no Python here can import mop (tried {python})"), line
    assert "pip install -e ." in line
    assert done.stdout == ""


def test_it_runs_mop_with_the_first_python_that_can_import_it(tmp_path: Path) -> None:
    run_local = launcher_module()
    python = tmp_path / "python"
    python.write_text("#!/bin/sh\nexit 1\n")
    python.chmod(0o755)
    assert run_local.find_python([str(python), sys.executable]) == sys.executable
    assert run_local.find_python([str(python)]) is None
