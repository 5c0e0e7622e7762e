"""mop in separated mode as one broker of the MQTT comparison: N mop broker nodes (one cluster,
Pulsar protocol only, fsync as the spec says) behind M stateless MQTT proxies, all on loopback.

Publishers connect to the first proxy and subscribers to the last, so with two proxies every
message goes proxy -> owning broker -> other proxy. The bench sees one broker: its CPU time and
resident memory are the sums over every process, and it is ready only once a QoS 1 message has
gone from the first proxy to the last on several topics (so both proxies have looked up and
connected to every broker node, as long-running proxies have).
"""

from __future__ import annotations

import json
import sys
import time
import uuid
from pathlib import Path

from brokers import MOP_MQTT_SETTINGS, Broker, BrokerError, BrokerSpec, mop_environ
from loadgen import LoadgenError, build, run

STARTUP_TIMEOUT = 60.0
PROBE_TOPICS = 6  # each lands on one of two nodes at random: all on one has odds 1/32
PROBE_TIMEOUT = 15.0


class Member(Broker):
    """One process of the deployment (a broker node or a proxy): `port` is the port it listens
    on (Pulsar for a node, MQTT for a proxy), `environ` its settings."""

    def __init__(
        self, spec: BrokerSpec, name: str, port: int, workdir: Path, environ: dict[str, str]
    ) -> None:
        super().__init__(spec, port, workdir, workdir)
        self.name = name
        self.environ = environ

    def command(self) -> tuple[list[str], dict[str, str]]:
        return [sys.executable, "-m", "mop", "run"], self.environ


class SeparatedBroker:
    """The processes of one separated deployment, started together for one run; `ports` are
    the proxies' MQTT ports followed by the nodes' Pulsar ports (BrokerSpec.port_count)."""

    def __init__(self, spec: BrokerSpec, ports: list[int], workdir: Path, deps_dir: Path) -> None:
        if not spec.separated or len(ports) != spec.port_count:
            raise BrokerError(f"{spec.name}: needs {spec.port_count} ports, got {len(ports)}")
        self.spec = spec
        self.workdir = workdir
        self.deps_dir = deps_dir
        mqtt_ports, pulsar_ports = ports[: spec.proxies], ports[spec.proxies :]
        urls = [f"pulsar://127.0.0.1:{port}" for port in pulsar_ports]
        self.nodes = [
            Member(spec, f"node-{i + 1}", port, workdir / f"node-{i + 1}", self._node_env(i, urls))
            for i, port in enumerate(pulsar_ports)
        ]
        service_url = "pulsar://" + ",".join(url.removeprefix("pulsar://") for url in urls)
        self.proxies = [
            Member(
                spec,
                f"proxy-{i + 1}",
                port,
                workdir / f"proxy-{i + 1}",
                self._proxy_env(i, port, service_url),
            )
            for i, port in enumerate(mqtt_ports)
        ]

    def _node_env(self, index: int, urls: list[str]) -> dict[str, str]:
        return mop_environ(
            self.workdir / f"node-{index + 1}" / "data",
            MOP_MODE="merged",
            MOP_PROTOCOLS='["pulsar"]',
            MOP_PULSAR__HOST="127.0.0.1",
            MOP_PULSAR__PORT=urls[index].rsplit(":", 1)[1],
            MOP_CLUSTER__BROKERS=json.dumps(urls),
            MOP_CLUSTER__ADVERTISED_URL=urls[index],
            MOP_STORAGE__FSYNC=self.spec.fsync or "always",
        )

    def _proxy_env(self, index: int, port: int, service_url: str) -> dict[str, str]:
        return mop_environ(
            self.workdir / f"proxy-{index + 1}" / "data",
            **MOP_MQTT_SETTINGS,
            MOP_MODE="separated",
            MOP_PROTOCOLS='["mqtt"]',
            MOP_MQTT__PORT=str(port),
            MOP_CLUSTER__SERVICE_URL=service_url,
        )

    @property
    def members(self) -> list[Member]:
        return [*self.nodes, *self.proxies]

    @property
    def port(self) -> int:
        """Where publishers (and the first half of idle connections) connect."""
        return self.proxies[0].port

    @property
    def sub_port(self) -> int:
        """Where subscribers connect: the last proxy (the first one too with a single proxy)."""
        return self.proxies[-1].port

    @property
    def pids(self) -> list[int]:
        return [m.pid for m in self.members]

    def cpu_ticks(self) -> int:
        return sum(m.cpu_ticks() for m in self.members)

    def rss_kb(self) -> int:
        return sum(m.rss_kb() for m in self.members)

    def start(self, timeout: float = STARTUP_TIMEOUT) -> None:
        """Nodes first (side by side), then the proxies (which look the nodes up as they
        start), then the round trip; stops everything and raises if any step fails."""
        deadline = time.monotonic() + timeout
        try:
            for group in (self.nodes, self.proxies):
                for member in group:
                    member.launch()
                for member in group:
                    member.wait_ready(deadline)
            self._probe(deadline)
        except BrokerError as exc:  # says which process, with its log
            self.stop()
            raise BrokerError(f"{self.spec.name}: {exc}") from None
        except (LoadgenError, OSError) as exc:
            self.stop()
            raise BrokerError(f"{self.spec.name} did not start: {exc}\n{self.log_tail()}") from None
        except BaseException:  # interrupted: leave no process behind
            self.stop()
            raise
        time.sleep(0.2)  # let the probe's connections go before the run starts measuring

    def _probe(self, deadline: float) -> None:
        """A QoS 1 message from the first proxy to the last on each of PROBE_TOPICS topics."""
        loadgen = build(self.deps_dir)
        for i in range(PROBE_TOPICS):
            left = min(PROBE_TIMEOUT, deadline - time.monotonic())
            if left <= 1:
                raise BrokerError("no time left for the publish/subscribe round trip")
            out = run(
                loadgen,
                "flow",
                self.port,
                port2=self.sub_port,
                prefix=f"probe-{uuid.uuid4().hex[:8]}-{i}",
                qos=1,
                count=1,
                duration=left,
                window=1,
                timeout=left,
                drain_idle=left,
            )
            if out.get("error") or int(out.get("delivered", 0)) < 1:
                raise BrokerError(
                    f"did not start: no publish/subscribe round trip through the proxies ({out})"
                    f"\n{self.log_tail()}"
                )

    def exit_code(self) -> int | None:
        """The exit status of the first process that ended; None while all run."""
        for member in self.members:
            code = member.exit_code()
            if code is not None:
                return code
        return None

    def log_tail(self, lines: int = 20) -> str:
        parts = []
        for member in self.members:
            tail = member.log_tail(lines)
            if tail:
                parts.append(f"[{member.name}]\n{tail}")
        return "\n".join(parts)

    def stop(self, timeout: float = 10.0) -> None:
        """Proxies first (their sessions go to the nodes), then the nodes, each with SIGTERM."""
        for member in reversed(self.members):
            member.stop(timeout)
