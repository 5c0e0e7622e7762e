"""The brokers under test: how each is installed, started on its own loopback port, measured
(resident memory, CPU time) and stopped.

mop runs from this checkout (or from a snapshot of one of its commits, `snapshot_mop`), merged
(one process) or separated (mop broker nodes behind stateless MQTT proxies, bench/separated.py).
The references are installed by the bench itself, pinned, into bench/.deps/ (git-ignored): aedes
with npm, amqtt with pip into its own venv (it needs neither mop's dependencies nor their
versions), mosquitto from Debian when it is missing.
Every broker runs in its default configuration except for the same few settings everywhere: no
per-connection logging, no persistence to disk (other than mop's own storage, which is the thing
measured), no $SYS publishing, room for 100k queued messages per session (the persistent session
scenario queues 10k; mosquitto's default would drop all but 1000), and 100 QoS 1/2 messages in
flight per client both ways, as the QoS 1 and 2 scenarios ask (mosquitto's default is 20 toward a
subscriber; mop's 32 also caps what a client may send, and an MQTT 3.1.1 client cannot learn it).
"""

from __future__ import annotations

import ast
import io
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tarfile
import tempfile
import time
import tomllib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

BENCH_DIR = Path(__file__).resolve().parent
REPO_DIR = BENCH_DIR.parent
AEDES_VERSION = "1.2.0"
AMQTT_VERSION = "0.12.1"
QUEUED_MESSAGES = 100_000
INFLIGHT = 100


class BrokerError(RuntimeError):
    """A broker could not be installed or did not start."""


@dataclass(frozen=True)
class BrokerSpec:
    name: str  # what --brokers selects
    kind: str  # mop | mosquitto | aedes | amqtt | floor (bench/floor_server.py)
    fsync: str | None = None  # mop's storage.fsync
    nodes: int = 0  # separated mop: broker nodes of the cluster (0: merged, one process)
    proxies: int = 0  # separated mop: MQTT proxies in front of them
    # mop as installed in another Python, a compiled build (`--mop-compiled PYTHON`), beside
    # the one this bench runs from its checkout.
    compiled: bool = False

    @property
    def separated(self) -> bool:
        return self.proxies > 0

    @property
    def label(self) -> str:
        if self.separated:
            return f"mop sep {self.proxies}x{self.nodes} ({self.fsync})"
        if self.kind == "floor":
            return "trio floor"
        if self.compiled:
            return f"mop ({self.fsync}, compiled)"
        return f"mop ({self.fsync})" if self.kind == "mop" else self.name

    @property
    def port_count(self) -> int:
        """Loopback ports the broker needs: MQTT ports first, then the nodes' Pulsar ports."""
        return self.proxies + self.nodes if self.separated else 1


BROKERS: dict[str, BrokerSpec] = {
    spec.name: spec
    for spec in (
        BrokerSpec("mop-never", "mop", "never"),
        BrokerSpec("mop-interval", "mop", "interval"),
        BrokerSpec("mop-always", "mop", "always"),
        BrokerSpec("mop-compiled", "mop", "interval", compiled=True),
        BrokerSpec("mop-sep-1x1", "mop", "never", nodes=1, proxies=1),
        BrokerSpec("mop-sep-2x2", "mop", "never", nodes=2, proxies=2),
        BrokerSpec("mosquitto", "mosquitto"),
        BrokerSpec("mosquitto-nodelay", "mosquitto"),
        BrokerSpec("aedes", "aedes"),
        BrokerSpec("amqtt", "amqtt"),
        # Not a broker: the least MQTT relay in plain trio (bench/floor_server.py), run in the
        # connection scenarios and the message flows only (no retained messages, no sessions).
        BrokerSpec("trio-floor", "floor"),
    )
}
DEFAULT_BROKERS = (
    "mop-never",
    "mop-interval",
    "mop-always",
    "mosquitto",
    "aedes",
    "amqtt",
    "trio-floor",
)
REFERENCE = "mosquitto"


def stop_on_sigterm() -> None:
    """Make SIGTERM unwind like Ctrl-C, so that every broker process a run started is stopped
    by the cleanup it already has for an interruption."""

    def terminated(signum: int, frame: object) -> None:
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, terminated)


def _run(argv: list[str], what: str, **kwargs: object) -> str:
    done = subprocess.run(argv, capture_output=True, text=True, check=False, **kwargs)  # type: ignore[call-overload]
    if done.returncode != 0:
        raise BrokerError(f"{what} failed ({' '.join(argv)}):\n{done.stdout}{done.stderr}")
    return str(done.stdout)


# ---- installation -------------------------------------------------------------------------------


def _install_mosquitto(deps_dir: Path, log: Callable[[str], None]) -> None:
    if shutil.which("mosquitto"):
        return
    if os.geteuid() != 0:
        raise BrokerError("mosquitto is not installed; run: sudo apt-get install -y mosquitto")
    log("installing mosquitto with apt-get")
    _run(["apt-get", "install", "-y", "--no-install-recommends", "mosquitto"], "apt-get install")


def _aedes_dir(deps_dir: Path) -> Path:
    return deps_dir / "aedes"


def _install_aedes(deps_dir: Path, log: Callable[[str], None]) -> None:
    package = _aedes_dir(deps_dir) / "node_modules" / "aedes" / "package.json"
    if package.exists():
        return
    if not shutil.which("npm") or not shutil.which("node"):
        raise BrokerError("aedes needs node and npm on PATH")
    log(f"installing aedes {AEDES_VERSION} with npm into {_aedes_dir(deps_dir)}")
    _aedes_dir(deps_dir).mkdir(parents=True, exist_ok=True)
    _run(
        [
            "npm",
            "install",
            "--prefix",
            str(_aedes_dir(deps_dir)),
            "--no-audit",
            "--no-fund",
            f"aedes@{AEDES_VERSION}",
        ],
        "npm install aedes",
    )


def _amqtt_python(deps_dir: Path) -> Path:
    return deps_dir / "amqtt-venv" / "bin" / "python"


def _install_amqtt(deps_dir: Path, log: Callable[[str], None]) -> None:
    python = _amqtt_python(deps_dir)
    if (
        python.exists()
        and subprocess.run(
            [str(python), "-c", "import amqtt.broker"], capture_output=True, check=False
        ).returncode
        == 0
    ):
        return
    log(f"installing amqtt {AMQTT_VERSION} with pip into {python.parent.parent}")
    _run([sys.executable, "-m", "venv", "--clear", str(python.parent.parent)], "python -m venv")
    _run(
        [str(python), "-m", "pip", "install", "-q", f"amqtt=={AMQTT_VERSION}"], "pip install amqtt"
    )


_INSTALLERS: dict[str, Callable[[Path, Callable[[str], None]], None]] = {
    "mop": lambda deps_dir, log: None,
    "floor": lambda deps_dir, log: None,  # trio is one of mop's own dependencies
    "mosquitto": _install_mosquitto,
    "aedes": _install_aedes,
    "amqtt": _install_amqtt,
}


def install(specs: list[BrokerSpec], deps_dir: Path, log: Callable[[str], None]) -> None:
    for kind in dict.fromkeys(spec.kind for spec in specs):
        _INSTALLERS[kind](deps_dir, log)


def _git(*args: str) -> str:
    """Read-only git queries for the report; empty when git or the repository is missing."""
    try:
        done = subprocess.run(
            ["git", "--no-optional-locks", "-C", str(REPO_DIR), *args],
            capture_output=True,
            text=True,
            check=False,
        )
    except OSError:
        return ""
    return done.stdout.strip()


@dataclass
class MopSource:
    """Where the bench's mop processes import mop from: this checkout's working tree, or a
    snapshot of one commit (`snapshot_mop`), so that edits made to the checkout while a long
    bench runs cannot give its runs different code."""

    root: Path = REPO_DIR
    commit: str | None = None  # set for a snapshot
    # Set by `use_installed_mop`: mop as installed in the bench's Python, not from `root`.
    installed: bool = False
    # Set by `use_compiled_mop`: the Python whose installed (compiled) mop `mop-compiled` runs.
    compiled_python: Path | None = None


MOP_SOURCE = MopSource()


def use_installed_mop() -> str:
    """Run every mop process of this bench from the mop installed in the bench's Python (say,
    a compiled build: `COMPILE_MOP=1 pip install .`) rather than from this checkout; returns
    where it is installed and how many of its modules run compiled."""
    MOP_SOURCE.installed = True
    path, compiled, compilable = _probe_installed(Path(sys.executable))
    return f"{path}, {compiled} of {compilable} modules compiled"


def _probe_installed(python: Path) -> tuple[str, int, int]:
    """Where `python` imports mop from, and how many of its compilable modules run compiled."""
    probe = (
        "import mop, mop.compiled as c; "
        "print(mop.__path__[0], len(c.compiled_modules()), len(c.COMPILED_MODULES))"
    )
    # `-P` and a neutral directory: the checkout must not shadow the installed package.
    env = mop_environ(Path(tempfile.gettempdir()))
    env.pop("PYTHONPATH", None)
    out = _run(
        [str(python), "-P", "-c", probe], "installed mop", cwd=Path(tempfile.gettempdir()), env=env
    ).split()
    if len(out) != 3:
        raise BrokerError(f"no mop installed in {python}")
    path, compiled, compilable = out
    if Path(path).resolve().is_relative_to(REPO_DIR):
        raise BrokerError(f"{python} imports mop from this checkout ({path})")
    return path, int(compiled), int(compilable)


def use_compiled_mop(python: Path | None) -> str:
    """Run the `mop-compiled` broker with the mop installed in `python`, which must be a
    compiled build (`COMPILE_MOP=1 pip install .` into another environment); returns where it
    is installed and how many of its modules run compiled."""
    if python is None:
        raise BrokerError(_NO_COMPILED_PYTHON)
    path, compiled, compilable = _probe_installed(python)
    if not compiled:
        raise BrokerError(f"the mop installed in {python} ({path}) is not a compiled build")
    MOP_SOURCE.compiled_python = python
    return f"{path}, {compiled} of {compilable} modules compiled"


def snapshot_mop(rev: str, into: Path) -> str:
    """Extract the mop package of commit `rev` into `into` with `git archive` (which leaves
    the repository as it is) and run every mop process of this bench from there; returns the
    short commit id."""
    commit = _git("rev-parse", "--short", "--verify", "--quiet", f"{rev}^{{commit}}")
    if not commit:
        raise BrokerError(f"--mop-commit {rev}: no such commit in {REPO_DIR}")
    git = ["git", "--no-optional-locks", "-C", str(REPO_DIR)]
    done = subprocess.run(
        [*git, "archive", "--format=tar", commit, "mop"], capture_output=True, check=False
    )
    if done.returncode != 0:
        error = done.stderr.decode(errors="replace")
        raise BrokerError(f"git archive {commit} mop failed: {error}")
    into.mkdir(parents=True, exist_ok=True)
    with tarfile.open(fileobj=io.BytesIO(done.stdout)) as archive:
        archive.extractall(into, filter="data")
    _write_metadata(commit, into)
    MOP_SOURCE.root, MOP_SOURCE.commit = into, commit
    return commit


def _write_metadata(commit: str, into: Path) -> None:
    """The package metadata of the commit's pyproject.toml next to the snapshot: mop finds its
    protocol adapters through entry points, which Python reads from a dist-info directory."""
    pyproject = tomllib.loads(_git("show", f"{commit}:pyproject.toml"))
    project = pyproject["project"]
    version = project.get("version") or _dynamic_version(commit, pyproject)
    dist = into / f"{project['name']}-{version}.dist-info"
    dist.mkdir(exist_ok=True)
    (dist / "METADATA").write_text(
        f"Metadata-Version: 2.1\nName: {project['name']}\nVersion: {version}\n"
    )
    lines = []
    for group, points in project.get("entry-points", {}).items():
        lines += [f"[{group}]", *(f"{name} = {target}" for name, target in points.items()), ""]
    (dist / "entry_points.txt").write_text("\n".join(lines))


def _dynamic_version(commit: str, pyproject: dict[str, Any]) -> str:
    """The version a commit's setuptools reads from a module attribute (`attr = "pkg.mod.NAME"`)."""
    module, _, name = pyproject["tool"]["setuptools"]["dynamic"]["version"]["attr"].rpartition(".")
    source = _git("show", f"{commit}:{module.replace('.', '/')}.py")
    for node in ast.parse(source).body:
        target = node.target if isinstance(node, ast.AnnAssign) else None
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            target = node.targets[0]
        if isinstance(target, ast.Name) and target.id == name and node.value is not None:
            return str(ast.literal_eval(node.value))
    raise RuntimeError(f"{commit}: no {name} in {module}")


def version(spec: BrokerSpec, deps_dir: Path) -> str:
    """The version of the broker as the bench runs it, for the report."""
    if spec.compiled:
        python = _compiled_python()
        env = mop_environ(MOP_SOURCE.root / "data")
        env.pop("PYTHONPATH", None)
        out = _run(
            [str(python), "-P", "-m", "mop", "--version"],
            "mop --version",
            cwd=Path(tempfile.gettempdir()),
            env=env,
        ).strip()
        return f"{out} (compiled, installed for {python})"
    if spec.kind == "mop":
        installed = MOP_SOURCE.installed
        out = _run(
            [sys.executable, "-m", "mop", "--version"],
            "mop --version",
            cwd=Path(tempfile.gettempdir()) if installed else MOP_SOURCE.root,
            env=mop_environ(MOP_SOURCE.root / "data"),
        ).strip()
        if installed:
            return f"{out} (installed)"
        if MOP_SOURCE.commit:
            return f"{out} (commit {MOP_SOURCE.commit}, as committed)"
        rev = _git("rev-parse", "--short", "HEAD")
        dirty = _git("status", "--porcelain", "--", "mop")
        return f"{out} (commit {rev or '?'}{', with local changes' if dirty else ''})"
    if spec.kind == "mosquitto":
        done = subprocess.run(["mosquitto", "-h"], capture_output=True, text=True, check=False)
        first = (done.stdout or done.stderr).splitlines()[0]
        return first.replace("mosquitto version", "mosquitto").strip()
    if spec.kind == "floor":
        out = _run(
            [
                sys.executable,
                "-c",
                "import trio, sys; print(trio.__version__, sys.version.split()[0])",
            ],
            "trio version",
        )
        trio_version, python = out.split()
        return f"bench/floor_server.py (trio {trio_version}, Python {python})"
    if spec.kind == "aedes":
        package = _aedes_dir(deps_dir) / "node_modules" / "aedes" / "package.json"
        node = _run(["node", "--version"], "node --version").strip()
        return f"aedes {json.loads(package.read_text())['version']} (node {node})"
    out = _run(
        [
            str(_amqtt_python(deps_dir)),
            "-c",
            "import importlib.metadata as m, sys; "
            "print(m.version('amqtt'), sys.version.split()[0])",
        ],
        "amqtt version",
    )
    amqtt, python = out.split()
    return f"amqtt {amqtt} (Python {python})"


# ---- running ------------------------------------------------------------------------------------


def _mosquitto_conf(spec: BrokerSpec, port: int, workdir: Path) -> Path:
    """mosquitto-nodelay is mosquitto with Nagle's algorithm off (set_tcp_nodelay), as mop,
    amqtt and every trio or asyncio server have it; mosquitto's default leaves it on."""
    conf = workdir / "mosquitto.conf"
    conf.write_text(
        ("set_tcp_nodelay true\n" if spec.name.endswith("nodelay") else "")
        + f"listener {port} 127.0.0.1\n"
        "allow_anonymous true\n"
        "persistence false\n"
        f"max_queued_messages {QUEUED_MESSAGES}\n"
        f"max_inflight_messages {INFLIGHT}\n"
        "log_dest stderr\n"
        "log_type error\n"
        "log_type warning\n"
    )
    return conf


def mop_environ(data_dir: Path, **settings: str) -> dict[str, str]:
    """The environment of a mop process of the bench: the caller's without its MOP_* variables
    (every one is a setting to mop, so none may leak in), mop from this checkout, `data_dir`,
    an admin port of its own and `settings` (MOP_* names)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("MOP_")}
    if not MOP_SOURCE.installed:
        path = os.pathsep.join(filter(None, [str(MOP_SOURCE.root), env.get("PYTHONPATH")]))
        env["PYTHONPATH"] = path
    env.update(MOP_DATA_DIR=str(data_dir), MOP_ADMIN__PORT="0")
    env.update(settings)
    return env


# The MQTT settings every mop node that serves MQTT gets in the bench (merged or proxy).
MOP_MQTT_SETTINGS = {
    "MOP_MQTT__HOST": "127.0.0.1",
    "MOP_MQTT__SYS_INTERVAL": "0",  # no $SYS publishing
    "MOP_MQTT__MAX_QUEUED_MESSAGES": str(QUEUED_MESSAGES),
    "MOP_MQTT__MAX_INFLIGHT": str(INFLIGHT),
}


_NO_COMPILED_PYTHON = "mop-compiled runs a compiled build: give its Python with --mop-compiled"


def _compiled_python() -> Path:
    if MOP_SOURCE.compiled_python is None:
        raise BrokerError(_NO_COMPILED_PYTHON)
    return MOP_SOURCE.compiled_python


def _command(
    spec: BrokerSpec, port: int, workdir: Path, deps_dir: Path
) -> tuple[list[str], dict[str, str]]:
    env = dict(os.environ)
    if spec.kind == "mop":
        env = mop_environ(
            workdir / "data",
            **MOP_MQTT_SETTINGS,
            MOP_PROTOCOLS='["mqtt"]',
            MOP_MQTT__PORT=str(port),
            MOP_PULSAR__PORT="0",
            MOP_STORAGE__FSYNC=spec.fsync or "always",
        )
        if spec.compiled:
            env.pop("PYTHONPATH", None)  # the installed package only
            return [str(_compiled_python()), "-P", "-m", "mop", "run"], env
        return [sys.executable, "-m", "mop", "run"], env
    if spec.kind == "mosquitto":
        return ["mosquitto", "-c", str(_mosquitto_conf(spec, port, workdir))], env
    if spec.kind == "floor":
        return [sys.executable, str(BENCH_DIR / "floor_server.py"), str(port)], env
    if spec.kind == "aedes":
        script = BENCH_DIR / "aedes_broker.mjs"
        return ["node", str(script), str(port), str(_aedes_dir(deps_dir))], env
    script = BENCH_DIR / "amqtt_broker.py"
    return [str(_amqtt_python(deps_dir)), str(script), str(port)], env


def accepts(port: int) -> bool:
    """Whether something accepts connections on the loopback `port`."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5):
            return True
    except OSError:
        return False


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def cpu_ticks(pid: int) -> int:
    """User plus system time of a process (all its threads), in clock ticks."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])


def rss_kb(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise BrokerError(f"no VmRSS for pid {pid}")


class BrokerUnderTest(Protocol):
    """What a run needs of a broker, whether it is one process (Broker) or several
    (separated.SeparatedBroker): where publishers and subscribers connect, its lifecycle, and
    CPU time and resident memory summed over all its processes."""

    spec: BrokerSpec

    @property
    def port(self) -> int: ...

    @property
    def sub_port(self) -> int: ...

    def start(self, timeout: float = ...) -> None: ...

    def stop(self, timeout: float = ...) -> None: ...

    def exit_code(self) -> int | None: ...

    def log_tail(self, lines: int = ...) -> str: ...

    def cpu_ticks(self) -> int: ...

    def rss_kb(self) -> int: ...


class Broker:
    """One broker process on its own loopback port, started fresh for every run."""

    def __init__(self, spec: BrokerSpec, port: int, workdir: Path, deps_dir: Path) -> None:
        self.spec = spec
        self.name = spec.name  # in messages
        self.port = port
        self.workdir = workdir
        self.deps_dir = deps_dir
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    @property
    def sub_port(self) -> int:
        """Where subscribers connect: the same port as publishers for a single process."""
        return self.port

    def cpu_ticks(self) -> int:
        return cpu_ticks(self.pid)

    def rss_kb(self) -> int:
        return rss_kb(self.pid)

    def command(self) -> tuple[list[str], dict[str, str]]:
        """The broker's command line and environment (other benches override this)."""
        return _command(self.spec, self.port, self.workdir, self.deps_dir)

    def start(self, timeout: float = 30.0) -> None:
        self.launch()
        try:
            self.wait_ready(time.monotonic() + timeout)
        except BaseException:  # interrupted as well: leave no process behind
            self.stop()
            raise
        time.sleep(0.2)  # let the probe connection go before the run starts measuring

    def launch(self) -> None:
        """Start the process without waiting for it (several can start side by side)."""
        self.workdir.mkdir(parents=True, exist_ok=True)
        argv, env = self.command()
        with open(self.workdir / "broker.log", "ab") as log:
            self.proc = subprocess.Popen(
                argv, cwd=self.workdir, env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=log
            )

    def wait_ready(self, deadline: float) -> None:
        """Until the port accepts connections; stops the process and raises if it ends or the
        deadline (time.monotonic()) passes first."""
        assert self.proc is not None
        while not accepts(self.port):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise BrokerError(f"{self.name} did not start:\n{self.log_tail()}")
            time.sleep(0.05)

    def exit_code(self) -> int | None:
        """None while the process runs."""
        return None if self.proc is None else self.proc.poll()

    def log_tail(self, lines: int = 20) -> str:
        path = self.workdir / "broker.log"
        text = path.read_text(errors="replace") if path.exists() else ""
        return "\n".join(text.splitlines()[-lines:])

    def stop(self, timeout: float = 10.0) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
