"""The admin API and `mop/admin/openapi.yaml` agree, both ways, on a running node with clients,
sessions, retained messages and topics: schemathesis generates requests from the document,
valid ones and (negative data) ones the document says are not, sends them to the node and
checks every answer against the document (its status, content type and schema) and that the
invalid requests are refused. The routes of Pulsar's admin API are served too (the node serves
the Pulsar protocol). `schemathesis.toml` beside this file holds what the command line tool
(`schemathesis --config-file tests/e2e/admin/schemathesis.toml run ...`) and this test share."""

from __future__ import annotations

import dataclasses
import ipaddress
import logging
from collections.abc import Iterator
from contextlib import AbstractContextManager, ExitStack, contextmanager
from pathlib import Path
from typing import Any

import pytest
import schemathesis
import yaml
from hypothesis import HealthCheck, settings
from hypothesis.stateful import run_state_machine_as_test
from schemathesis.checks import (
    content_type_conformance,
    negative_data_rejection,
    not_a_server_error,
    positive_data_acceptance,
    response_schema_conformance,
    status_code_conformance,
)
from schemathesis.config import SchemathesisConfig

from mop.admin.routes_docs import openapi_document
from mop.security.abuse import parse_ban_target
from mop.settings import PulsarSettings
from mop.testing.node import RunningNode, node_settings, running_node
from tests.e2e.admin.api import Api, eventually
from tests.e2e.clients import OPEN_CLIENTS, Client

pytestmark = pytest.mark.e2e

CONFIG = Path(__file__).with_name("schemathesis.toml")
# Requests per operation (45 operations), and scenarios that follow links (each on a node of
# its own): the whole module takes about 18 s.
MAX_EXAMPLES = 25
STATEFUL_SCENARIOS = 30
CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_schema_conformance,
    # Both ways: what the document calls invalid is refused, what it calls valid is taken.
    negative_data_rejection,
    positive_data_acceptance,
]
# Where the tests' own requests come from: a ban that covers it would leave every later request
# a 403 (still as documented, but no test of anything else).
LOOPBACK = (
    ipaddress.ip_address("127.0.0.1"),
    ipaddress.ip_address("::1"),
)
# Stands in for a generated ban of a network that holds a loopback address (TEST-NET-1).
HARMLESS_NETWORK = "192.0.2.0/24"


def start_node() -> AbstractContextManager[RunningNode]:
    base = node_settings()
    return running_node(
        dataclasses.replace(base, protocols=("mqtt", "pulsar"), pulsar=PulsarSettings(port=0))
    )


def connect_clients(node: RunningNode) -> list[Client]:
    """Clients with subscriptions, one of them shared (closed by whoever asks for them). The
    first one publishes."""
    clients = [
        Client(node.mqtt_port, "fuzz-five", version=5, username="fuzzer"),
        Client(node.mqtt_port, "fuzz-four", version=4, clean=False),
    ]
    clients[0].subscribe("fuzz/+", qos=1)
    clients[1].subscribe("$share/g/fuzz/#", qos=1)
    for client in clients:
        OPEN_CLIENTS.remove(client)  # not closed after each test
    return clients


def make_data(node: RunningNode, publisher: Client) -> None:
    """Retained messages and an offline session for the operations to find."""
    publisher.publish("fuzz/retained", b"kept", qos=1, retain=True)
    publisher.publish("fuzz/binary", b"\xff\x00", qos=1, retain=True)
    offline = Client(node.mqtt_port, "fuzz-offline", version=4, clean=False)
    offline.subscribe("fuzz/#", qos=1)
    offline.disconnect()
    OPEN_CLIENTS.remove(offline)
    offline.close()
    # The DISCONNECT is taken in on the node's side in its own time: the session is offline
    # when the operations look, not offline for some and online for others.
    api = Api(node)
    eventually(lambda: api.get("/api/v1/sessions", q="fuzz-offline", connected="false")["items"])


@pytest.fixture(scope="module", autouse=True)
def log_levels_restored() -> Iterator[None]:
    """The nodes run in this process, and generated requests to `PUT /api/v1/logging` set its
    log levels (a `CRITICAL` process level hides every later test's warnings from caplog):
    the levels the module found are put back after it."""
    manager = logging.Logger.manager
    before = {
        name: logger.level
        for name, logger in manager.loggerDict.items()
        if isinstance(logger, logging.Logger)
    }
    root = logging.getLogger().level
    yield
    logging.getLogger().setLevel(root)
    for name, logger in list(manager.loggerDict.items()):
        if isinstance(logger, logging.Logger):
            logger.setLevel(before.get(name, logging.NOTSET))


@pytest.fixture(scope="module")
def fuzzed_node() -> Iterator[RunningNode]:
    with start_node() as node:
        yield node


@pytest.fixture(scope="module")
def connected(fuzzed_node: RunningNode) -> Iterator[Client]:
    """Clients connected for the whole module: the first one, which publishes."""
    clients = connect_clients(fuzzed_node)
    yield clients[0]
    for client in clients:
        client.disconnect()
        client.close()


@pytest.fixture
def data(fuzzed_node: RunningNode, connected: Client) -> None:
    """The data of `make_data`, made again before each operation (the operations before may
    have cleared or ended it)."""
    make_data(fuzzed_node, connected)


@contextmanager
def scenario_node() -> Iterator[RunningNode]:
    """A node of its own with the clients and data of the module's."""
    with start_node() as node:
        clients = connect_clients(node)
        try:
            make_data(node, clients[0])
            yield node
        finally:
            for client in clients:
                client.disconnect()  # else the node waits for them when it stops
                client.close()


def load_schema() -> Any:
    """openapi.yaml as the node serves it (the file of the package), with the settings this
    test shares with the command line tool."""
    loaded = schemathesis.openapi.from_dict(
        yaml.safe_load(openapi_document()), config=SchemathesisConfig.from_path(CONFIG)
    )
    loaded.config.generation.update(max_examples=MAX_EXAMPLES)
    return loaded


schema = load_schema()


def admin_url(node: RunningNode) -> str:
    host, port = node.node.address("admin")
    return f"http://{host}:{port}"


def keep_loopback_unbanned(case: Any) -> None:
    """A generated ban of a network that holds a loopback address bans another network."""
    body = case.body
    if case.path != "/api/v1/bans" or case.method != "POST" or not isinstance(body, dict):
        return
    kind, value = body.get("kind"), body.get("value")
    if not isinstance(kind, str) or not isinstance(value, str):
        return  # refused anyway
    try:
        kind, value = parse_ban_target(kind, value)
    except ValueError:
        return  # refused anyway
    if kind == "address":
        network = ipaddress.ip_network(value)
        if any(address in network for address in LOOPBACK if address.version == network.version):
            body["value"] = HARMLESS_NETWORK


@schema.parametrize()
@settings(
    deadline=None,
    database=None,
    # `data` is made once per operation, not per request: on purpose.
    suppress_health_check=[
        HealthCheck.filter_too_much,
        HealthCheck.too_slow,
        HealthCheck.function_scoped_fixture,
    ],
)
def test_every_operation_agrees_with_the_document(
    case: Any, fuzzed_node: RunningNode, data: None
) -> None:
    keep_loopback_unbanned(case)
    case.call_and_validate(base_url=admin_url(fuzzed_node), checks=CHECKS)


def test_links_lead_from_answers_to_what_they_name() -> None:
    """Scenarios that follow the document's links: a listed client, session, retained message,
    topic or ban looked at, and ended or lifted, through the values of the answers.

    Each scenario runs on a node of its own, made the same way. Which steps Hypothesis may take
    next depends on the answers before (a link is followed from a listed item, so from a
    non-empty list only): scenarios on one node would start where the one before left it (a
    client kicked, a session ended, a ban made), and the same choices would lead to other
    steps, which Hypothesis refuses (FlakyStrategyDefinition)."""

    class Scenarios(load_schema().as_state_machine()):  # type: ignore[misc]
        def setup(self) -> None:
            self._node = ExitStack()
            self._base_url = admin_url(self._node.enter_context(scenario_node()))

        def teardown(self) -> None:
            self._node.close()

        def before_call(self, case: Any) -> None:
            keep_loopback_unbanned(case)

        def get_call_kwargs(self, case: Any) -> dict[str, Any]:
            return {"base_url": self._base_url}

        def validate_response(self, response: Any, case: Any, *_: Any, **__: Any) -> None:
            case.validate_response(response, checks=CHECKS)

    run_state_machine_as_test(
        Scenarios,
        settings=settings(
            max_examples=STATEFUL_SCENARIOS,
            stateful_step_count=4,
            deadline=None,
            database=None,
            suppress_health_check=list(HealthCheck),
        ),
    )
