"""A `mop run` process on a data directory, for tests that stop, kill and restart a real node.

    node = NodeProcess(tmp_path / "data")
    port = node.start()
    ...
    node.kill()           # SIGKILL: nothing gets to clean up
    port = node.start()   # the same data directory, a new process (and a new port)
    node.stop()           # SIGTERM, which must end the process with status 0

The process's merged stdout and stderr are read line by line in a thread and kept, so a test
can look for log lines (the storage recovery summary, for instance) of every start so far.

`broker_process(data_dir)` is a node with only the Pulsar adapter, the broker of a separated
topology: `start()` returns its Pulsar port and `service_url` is what proxies connect to.
"""

from __future__ import annotations

import contextlib
import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import psutil

import mop

STARTUP_TIMEOUT = 30.0
STOP_TIMEOUT = 15.0
LISTENING = re.compile(r"mqtt listening on tcp (?P<host>\S+):(?P<port>\d+)")
PULSAR_LISTENING = re.compile(r"pulsar listening on tcp (?P<host>\S+):(?P<port>\d+)")
GRPC_LISTENING = re.compile(r"grpc listening on tcp (?P<host>\S+):(?P<port>\d+)")
RECOVERED = re.compile(
    r"recovered (?P<topics>\d+) topics, (?P<messages>\d+) messages, (?P<cursors>\d+) cursors"
    r" and (?P<table_keys>\d+) table keys .*; truncated (?P<truncated>\d+) torn bytes"
)


def node_environ(data_dir: Path, **overrides: str) -> dict[str, str]:
    """The test process's environment without MOP_* variables, plus a data dir, free ports,
    fsync on every acknowledged write and no $SYS traffic. The node runs in a directory of
    its own (see NodeProcess), so no ./settings.toml of the checkout applies."""
    environ = {name: value for name, value in os.environ.items() if not name.startswith("MOP_")}
    # Import the same mop as this test process, installed or not.
    package_root = str(Path(mop.__file__).resolve().parents[1])
    environ["PYTHONPATH"] = os.pathsep.join(
        filter(None, [package_root, os.environ.get("PYTHONPATH")])
    )
    environ.update(
        MOP_DATA_DIR=str(data_dir),
        MOP_PROTOCOLS='["mqtt"]',
        MOP_MQTT__HOST="127.0.0.1",
        MOP_MQTT__PORT="0",
        MOP_MQTT__WS_PORT="0",
        MOP_MQTT__TLS_PORT="0",
        MOP_PULSAR__PORT="0",
        MOP_GRPC__PORT="0",
        MOP_GRPC__TLS_PORT="0",
        MOP_ADMIN__PORT="0",
        MOP_MQTT__SYS_INTERVAL="0",
        MOP_STORAGE__FSYNC="always",
        MOP_LOG_LEVEL="INFO",
    )
    environ.update(overrides)
    return environ


class NodeProcess:
    """One data directory, served by at most one `mop run` process at a time."""

    def __init__(
        self,
        data_dir: Path,
        *,
        cwd: Path | None = None,
        listening: re.Pattern[str] = LISTENING,
        **overrides: str,
    ) -> None:
        self.data_dir = data_dir
        self.cwd = cwd or data_dir.parent
        self.listening = listening  # the log line that says the node is up, with its port
        self.overrides = overrides
        self.process: subprocess.Popen[str] | None = None
        self.port = 0
        self.output: list[str] = []  # every line of every run so far
        self.run_output: list[str] = []  # the lines of the current (or last) run
        self._lines: queue.Queue[str | None] = queue.Queue()
        self._reader: threading.Thread | None = None

    # -- lifecycle ---------------------------------------------------------------------------

    def start(self, timeout: float = STARTUP_TIMEOUT, **overrides: str) -> int:
        """Start the node and return its port (MQTT unless `listening` says otherwise) once
        it is listening."""
        assert not self.running, "the node is already running"
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self._lines = queue.Queue()
        self.run_output = []
        process = self.process = subprocess.Popen(
            [sys.executable, "-m", "mop", "run"],
            cwd=self.cwd,
            env=node_environ(self.data_dir, **{**self.overrides, **overrides}),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        self._reader = threading.Thread(target=self._read, args=(process, self._lines), daemon=True)
        self._reader.start()
        match = self.wait_for(self.listening, timeout)
        self.port = int(match["port"])
        return self.port

    @property
    def service_url(self) -> str:
        """The Pulsar service URL of a running broker process (see `broker_process`)."""
        assert self.listening is PULSAR_LISTENING, "not a broker process"
        return f"pulsar://127.0.0.1:{self.port}"

    def rss(self) -> int:
        """The running process's resident memory, in bytes."""
        return int(psutil.Process(self._require().pid).memory_info().rss)

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def stop(self, timeout: float = STOP_TIMEOUT) -> int:
        """SIGTERM, as an operator stops the node; returns the exit status."""
        process = self._require()
        process.send_signal(signal.SIGTERM)
        try:
            code = process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=timeout)
            raise AssertionError(f"node ignored SIGTERM for {timeout}s:\n{self.log()}") from None
        self._finish()
        return code

    def kill(self) -> None:
        """SIGKILL: the process gets no chance to write, flush or close anything."""
        process = self._require()
        process.send_signal(signal.SIGKILL)
        process.wait(timeout=STOP_TIMEOUT)
        self._finish()

    def end(self) -> None:
        """For the teardown of a node that must have run well: stop it if it still runs (exit
        status 0 expected), then release it."""
        if self.running:
            assert self.stop() == 0, self.log()
        self.close()

    @contextlib.contextmanager
    def serving(self, **overrides: str) -> Iterator[NodeProcess]:
        """`start` it, and `end` it on the way out."""
        self.start(**overrides)
        try:
            yield self
        finally:
            self.end()

    def close(self) -> None:
        """For teardown: kill the process if it still runs."""
        if self.process is None:
            return
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait(timeout=STOP_TIMEOUT)
        self._finish()

    # -- output ------------------------------------------------------------------------------

    def wait_for(self, pattern: re.Pattern[str], timeout: float) -> re.Match[str]:
        """The first line of the current run from here on that matches `pattern`."""
        deadline = time.monotonic() + timeout
        while (remaining := deadline - time.monotonic()) > 0:
            try:
                line = self._lines.get(timeout=remaining)
            except queue.Empty:
                break
            if line is None:
                break
            self._keep(line)
            if match := pattern.search(line):
                return match
        raise AssertionError(f"no line matching {pattern.pattern!r}; output:\n{self.log()}")

    def find(self, pattern: re.Pattern[str]) -> list[re.Match[str]]:
        """Every match in the lines of the current run read so far (reads what is waiting)."""
        self._drain()
        return [m for line in self.run_output if (m := pattern.search(line)) is not None]

    def recovery(self) -> re.Match[str]:
        """The storage recovery summary of the current run."""
        found = self.find(RECOVERED)
        assert found, f"no recovery summary in the output:\n{self.log()}"
        return found[0]

    def log(self) -> str:
        self._drain()
        return "".join(self.output)

    def _drain(self) -> None:
        while True:
            try:
                line = self._lines.get_nowait()
            except queue.Empty:
                return
            if line is None:
                return
            self._keep(line)

    def _keep(self, line: str) -> None:
        self.output.append(line)
        self.run_output.append(line)

    @staticmethod
    def _read(process: subprocess.Popen[str], lines: queue.Queue[str | None]) -> None:
        assert process.stdout is not None
        for line in process.stdout:
            lines.put(line)
        lines.put(None)

    def _require(self) -> subprocess.Popen[str]:
        assert self.process is not None and self.process.poll() is None, "node is not running"
        return self.process

    def _finish(self) -> None:
        if self._reader is not None:
            self._reader.join(timeout=STOP_TIMEOUT)
            self._reader = None
        self._drain()
        if self.process is not None and self.process.stdout is not None:
            self.process.stdout.close()


def broker_process(data_dir: Path, **overrides: str) -> NodeProcess:
    """A broker of a separated topology: a node that speaks only the Pulsar protocol, on a free
    loopback port. Start it with `start()`; proxies reach it at `service_url`."""
    overrides.setdefault("MOP_PROTOCOLS", '["pulsar"]')
    overrides.setdefault("MOP_PULSAR__HOST", "127.0.0.1")
    return NodeProcess(data_dir, listening=PULSAR_LISTENING, **overrides)


def segment_files(data_dir: Path) -> list[Path]:
    """The log's segment files, oldest first."""
    return sorted((data_dir / "broker").glob("*.log"))


def disk_usage(path: Path) -> int:
    """Bytes of every file under `path` (a file deleted while we look counts as gone)."""
    total = 0
    for root, _, files in os.walk(path):
        for name in files:
            with contextlib.suppress(FileNotFoundError):
                total += os.stat(os.path.join(root, name)).st_size
    return total
