"""Builds the C load generator (bench/loadgen.c) with the system compiler and runs it.

Every mode prints JSON objects on stdout, one a line; `run` returns the last one, `hold_connections`
keeps a `conns` run's connections open while the caller measures the broker.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

SOURCE = Path(__file__).resolve().with_name("loadgen.c")
CFLAGS = ("-O2", "-Wall", "-Wextra", "-std=gnu11")


class LoadgenError(RuntimeError):
    """The generator could not be built, or a run failed or printed no result."""


def build(deps_dir: Path) -> Path:
    """Compile loadgen.c into `deps_dir` unless an up-to-date binary is there; return its path."""
    binary = deps_dir / "loadgen"
    if binary.exists() and binary.stat().st_mtime >= SOURCE.stat().st_mtime:
        return binary
    compiler = shutil.which("gcc") or shutil.which("cc")
    if compiler is None:
        raise LoadgenError("no C compiler (gcc or cc) on PATH; install gcc to run the bench")
    deps_dir.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(
        [compiler, *CFLAGS, "-o", str(binary), str(SOURCE)],
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        raise LoadgenError(f"building the load generator failed:\n{done.stderr}")
    return binary


def _argv(binary: Path, mode: str, port: int, options: dict[str, Any]) -> list[str]:
    argv = [str(binary), "--mode", mode, "--port", str(port)]
    for name, value in options.items():
        argv += [f"--{name.replace('_', '-')}", str(value)]
    return argv


def _parse(line: str, argv: list[str]) -> dict[str, Any]:
    try:
        result: dict[str, Any] = json.loads(line)
    except json.JSONDecodeError as exc:
        raise LoadgenError(f"{' '.join(argv)}: unreadable output {line!r}") from exc
    return result


def run(binary: Path, mode: str, port: int, **options: Any) -> dict[str, Any]:
    """Run one load, bounded by its `timeout` option (plus a margin for the process itself)."""
    argv = _argv(binary, mode, port, options)
    limit = float(options.get("timeout", 30)) + 15
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=limit, check=False)
    except subprocess.TimeoutExpired as exc:
        raise LoadgenError(f"{' '.join(argv)}: still running after {limit:.0f} s") from exc
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if not lines:
        raise LoadgenError(f"{' '.join(argv)}: exit {done.returncode}, no result: {done.stderr}")
    return _parse(lines[-1], argv)


@contextmanager
def hold_connections(binary: Path, port: int, **options: Any) -> Iterator[dict[str, Any]]:
    """Open `conns` idle connections and yield the connect result while they stay open; they
    are closed (reset) when the block ends."""
    argv = _argv(binary, "conns", port, options)
    limit = float(options.get("timeout", 30)) + 15
    proc = subprocess.Popen(
        argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    assert proc.stdin is not None and proc.stdout is not None
    try:
        line = proc.stdout.readline()
        if not line:
            raise LoadgenError(f"{' '.join(argv)}: no result: {proc.communicate()[1]}")
        result = _parse(line, argv)
        yield result
        proc.stdin.write("done\n")
        proc.stdin.flush()
        held = proc.stdout.readline()
        if held.startswith("{"):
            result["held"] = _parse(held, argv)
        proc.wait(limit)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        for stream in (proc.stdin, proc.stdout, proc.stderr):
            if stream is not None:
                stream.close()


@contextmanager
def relay(binary: Path, port: int, timeout: float) -> Iterator[None]:
    """A trivial QoS 0 relay in its own process (no matching, bytes copied to every subscriber):
    what a flow reaches through it is the generator's own ceiling on this machine."""
    argv = _argv(binary, "relay", port, {"timeout": timeout, "conns": 1024})
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    assert proc.stdout is not None
    try:
        if not proc.stdout.readline().startswith("{"):
            raise LoadgenError("the relay did not start")
        yield
    finally:
        proc.terminate()
        proc.wait(10)
        proc.stdout.close()
