"""What a separated-mode proxy writes about its Pulsar client, and how it ends when the brokers
are not there: the client's messages go through Python logging at the node's level (never raw
payload bytes on the process output), and a failed start still closes the client, so the
process exits with an ordinary error status."""

from __future__ import annotations

import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.e2e.clients import Client
from tests.e2e.cluster.support import proxy_process
from tests.e2e.nodeproc import broker_process, node_environ
from tests.e2e.pulsar_support import free_port

pytestmark = pytest.mark.e2e

# Recognisable, and not a word any log line would contain by itself.
MARKER = "zq-payload-marker-7f3a"
# A line of pulsar-client's own console logger ("... DEBUG [thread] ClientImpl:902 | ..."),
# which writes straight to the process output when no Python logger takes its messages.
CONSOLE_LINE = re.compile(r" (DEBUG|INFO|WARN|ERROR) \[\d+\] \w+:\d+ \| ")


def run_proxy_and_stop(tmp_path: Path, level: str) -> str:
    """Publish a few marked messages through a proxy at log `level`, stop it with SIGTERM and
    return everything it wrote."""
    broker = broker_process(tmp_path / "broker")
    broker.start()
    proxy = proxy_process(tmp_path / "proxy", broker.service_url, MOP_LOG_LEVEL=level)
    try:
        port = proxy.start()
        sub = Client(port, "log-sub")
        sub.subscribe("logging/+", 1)
        pub = Client(port, "log-pub")
        for n in range(5):
            pub.publish(f"logging/{n}", f"{MARKER}-{n}".encode(), 1)
        assert len(sub.expect(5)) == 5
        sub.disconnect()
        pub.disconnect()
        assert proxy.stop() == 0, proxy.log()
        assert broker.stop() == 0, broker.log()
        return proxy.log()
    finally:
        proxy.close()
        broker.close()


def test_a_stopped_proxy_writes_no_payload_bytes(tmp_path: Path) -> None:
    output = run_proxy_and_stop(tmp_path, "INFO")
    assert MARKER not in output, output
    assert not CONSOLE_LINE.search(output), output
    assert "mop.pulsar.driver" not in output, output


def test_a_proxy_at_debug_logs_the_client_through_python_logging(tmp_path: Path) -> None:
    output = run_proxy_and_stop(tmp_path, "DEBUG")
    assert "DEBUG mop.pulsar.driver:" in output, output
    assert not CONSOLE_LINE.search(output), output


SCRIPT = textwrap.dedent(
    """
    import logging
    import sys

    import trio

    from mop.processor.backend import BackendError
    from mop.testing.cluster import open_cluster_backend

    async def main() -> None:
        async with open_cluster_backend(sys.argv[1], operation_timeout=1.0, connect_timeout=0.5):
            pass

    # At DEBUG the client's messages go through Python logging, which is not there any more
    # if a client outlives the interpreter: it then prints them itself.
    logging.basicConfig(level=logging.DEBUG)
    try:
        trio.run(main)
    except* BackendError as group:
        print("failed to start:", group.exceptions[0])
        sys.exit(3)
    """
)


def test_a_backend_that_cannot_start_lets_the_process_exit_normally(tmp_path: Path) -> None:
    script = tmp_path / "unreachable.py"
    script.write_text(SCRIPT)
    environ = node_environ(tmp_path / "data")
    # The abort this guards against depends on which thread frees the client at exit: run a
    # few at once, three times, so that the timing varies.
    for _ in range(3):
        runs = [
            subprocess.Popen(
                [sys.executable, str(script), f"pulsar://127.0.0.1:{free_port()}"],
                env=environ,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            for _ in range(4)
        ]
        for run in runs:
            try:
                stdout, stderr = run.communicate(timeout=60)
            except subprocess.TimeoutExpired:
                run.kill()
                stdout, stderr = run.communicate()
            assert run.returncode == 3, (run.returncode, stdout, stderr[-2000:])
            assert "terminate called" not in stderr, stderr[-2000:]
            assert not CONSOLE_LINE.search(stdout + stderr), stdout
