"""The dashboard page in headless Chromium against a real node with real MQTT clients: what it
shows agrees with the API, searching finds a client, and its kick button disconnects it."""

from __future__ import annotations

import dataclasses
import json
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from mop.security.passwords import update_password_file
from mop.settings import AuthSettings
from mop.testing.node import RunningNode, node_settings, running_node
from mop.version import VERSION
from tests.e2e import browser
from tests.e2e.admin.api import Api
from tests.e2e.clients import Client

browser.skip_unless_available()

from playwright.sync_api import Page, Route, expect  # noqa: E402  (needs the check above)

pytestmark = pytest.mark.e2e


def origin(node: RunningNode) -> str:
    host, port = node.node.address("admin")
    return f"http://{host}:{port}"


@pytest.fixture
def page(tmp_path: Path) -> Iterator[Page]:
    with browser.open_browser(tmp_path / "profile") as context:
        yield context.pages[0] if context.pages else context.new_page()


class Traffic:
    """A publisher sending a message every 20 ms on a thread until stopped."""

    def __init__(self, client: Client, topic: str) -> None:
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(client, topic), daemon=True)
        self._thread.start()

    def _run(self, client: Client, topic: str) -> None:
        while not self._stop.wait(0.02):
            client.publish(topic, b"1")

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)


def number(value: int) -> str:
    return f"{value:,}"  # the page's en-US format


def test_dashboard_agrees_with_the_api_and_kicks_a_client(
    node: RunningNode, page: Page, tmp_path: Path
) -> None:
    port = node.mqtt_port
    subscriber = Client(port, "dash-subscriber")
    subscriber.subscribe("plant/#", qos=1)
    sensors = [Client(port, f"dash-sensor-{n}", version=4) for n in range(3)]
    meter = Client(port, "dash-meter-7")
    for n, sensor in enumerate(sensors):
        sensor.publish(f"plant/line{n}/temperature", b"21.5", qos=1, retain=True)
    meter.publish("plant/meter", b"ok", qos=1, retain=True)
    subscriber.expect(4)

    problems = browser.Problems(origin(node))
    problems.watch(page)
    page.goto(origin(node) + "/")
    api = Api(node)
    stats = api.get("/api/v1/stats")
    clients = api.get("/api/v1/clients")
    info = api.get("/api/v1/node")

    # Totals and the node, as the API reports them.
    assert stats["connections"] == 5
    assert stats["retained"] == 4
    for element, key in [
        ("connections", "connections"),
        ("retained", "retained"),
        ("subscriptions", "subscriptions"),
        ("sessions", "sessions"),
    ]:
        expect(page.locator(f"#{element}")).to_have_text(number(stats[key]))
    expect(page.locator("#live-text")).to_have_text("Live")
    expect(page.locator("#node-version")).to_have_text(info["version"])
    expect(page.locator("#node-mode")).to_have_text("merged")
    expect(page.locator("#listeners li")).to_have_count(len(info["listeners"]))

    # One row per connected client.
    rows = page.locator("#clients-body tr[data-client-id]")
    expect(rows).to_have_count(clients["total"])
    shown = rows.evaluate_all("rows => rows.map(row => row.dataset.clientId)")
    assert sorted(shown) == sorted(client["client_id"] for client in clients["items"])
    total = clients["total"]
    expect(page.locator("#pager-text")).to_have_text(f"1\N{EN DASH}{total} of {total}")

    # Rates come from counter differences between polls: traffic shows up in both charts.
    traffic = Traffic(sensors[0], "plant/line0/flow")
    try:
        page.wait_for_function(
            # A function, not an expression: the page's policy forbids eval.
            """() => ["rate-in", "rate-out"].every(
                id => Number(document.getElementById(id).dataset.value) > 10
            )""",
            timeout=15_000,
        )
        page.wait_for_timeout(4_500)  # a few more polls, so that the charts have a shape
    finally:
        traffic.stop()
    page.screenshot(path=tmp_path / "dashboard.png", full_page=True)
    # In a narrow window nothing sticks out sideways (the table scrolls in its own box).
    page.set_viewport_size({"width": 640, "height": 768})
    widths = page.evaluate("() => [document.documentElement.scrollWidth, window.innerWidth]")
    assert widths[0] <= widths[1], widths
    page.set_viewport_size({"width": 1366, "height": 860})

    # Searching asks the API with ?q= and shows what it answers.
    page.get_by_label("Search clients").fill("METER")
    expect(rows).to_have_count(1)
    expect(rows.first).to_have_attribute("data-client-id", "dash-meter-7")
    assert api.get("/api/v1/clients", q="METER")["total"] == 1

    # The kick button asks first, then disconnects the client and the row goes.
    page.once("dialog", lambda dialog: dialog.accept())
    page.get_by_role("button", name="Disconnect dash-meter-7").click()
    assert meter.disconnects.get(timeout=10) == 0x98  # MQTT 5: Administrative action
    expect(rows).to_have_count(0)
    expect(page.locator("#clients-body")).to_contain_text("No connected client matches")
    expect(page.locator("#clients-notice")).to_have_text("Disconnected “dash-meter-7”.")
    assert api.get("/api/v1/clients", q="meter")["total"] == 0
    expect(page.locator("#connections")).to_have_text("4")
    page.screenshot(path=tmp_path / "dashboard-after-kick.png", full_page=True)

    assert problems.console == []
    assert problems.errors == []
    assert problems.foreign == []


def refuse(status: int) -> Callable[[Route], None]:
    """A route handler answering every request with `status` and an API error document."""

    def handler(route: Route) -> None:
        body = json.dumps({"error": "refused by the test"})
        route.fulfill(status=status, content_type="application/json", body=body)

    return handler


def test_dashboard_explains_refusals_and_an_unreachable_node(page: Page) -> None:
    with running_node(node_settings()) as node:
        page.goto(origin(node) + "/")
        expect(page.locator("#live-text")).to_have_text("Live")
        alert = page.get_by_role("alert")

        refusals = [(401, "Sign-in needed", "Signed out"), (403, "Not allowed", "Not allowed")]
        for status, title, live in refusals:
            page.route("**/api/v1/**", refuse(status))
            expect(alert).to_contain_text(title, timeout=10_000)
            if status == 403:  # the node's reason is passed on
                expect(alert).to_contain_text("refused by the test")
            expect(page.locator("#live-text")).to_have_text(live)
            page.unroute("**/api/v1/**")
            page.get_by_role("button", name="Try again").click()
            expect(alert).to_be_hidden()
            expect(page.locator("#live-text")).to_have_text("Live")

    # The node stopped: the page says so, and keeps the last numbers.
    expect(alert).to_contain_text("The node does not answer", timeout=10_000)
    expect(page.locator("#live-text")).to_have_text("Offline")
    expect(page.locator("#connections")).to_have_text("0")


def test_dashboard_notices_a_node_that_stops_answering(node: RunningNode, page: Page) -> None:
    """A request is never cut short (it may be waiting at a sign-in prompt), but a long silence
    is reported until the answer comes."""
    page.goto(origin(node) + "/")
    expect(page.locator("#live-text")).to_have_text("Live")
    held: list[Route] = []

    def hold(route: Route) -> None:
        held.append(route)

    page.route("**/api/v1/stats", hold)
    alert = page.get_by_role("alert")
    expect(alert).to_contain_text("silent for 10 s", timeout=20_000)
    expect(page.locator("#live-text")).to_have_text("Offline")
    held[0].continue_()  # the answer comes at last
    page.unroute("**/api/v1/stats", hold)
    expect(alert).to_be_hidden()
    expect(page.locator("#live-text")).to_have_text("Live")


def test_dashboard_behind_basic_authentication(tmp_path: Path) -> None:
    """The page is public; its requests to the API carry what the browser's prompt got."""
    text = ""
    for user, password in {"admin": "a1", "bob": "b2"}.items():
        text = update_password_file(text, user, password.encode())
    (tmp_path / "passwords").write_text(text)
    auth = AuthSettings(password_file=str(tmp_path / "passwords"), max_failures=0)
    settings = dataclasses.replace(node_settings(), auth=auth)  # admin.roles: ("admin",)
    # A browser without credentials would wait at its prompt; headless, it has none to show.
    # Wrong ones are refused, and the prompt given up on: the page hears 401.
    cases = [
        (("admin", "wrong"), "Signed out", "Sign-in needed"),
        (("bob", "b2"), "Not allowed", "is not one of admin.roles"),
        (("admin", "a1"), "Live", None),
    ]
    with running_node(settings) as node:
        for n, (user, live, alert) in enumerate(cases):
            with browser.open_browser(tmp_path / f"profile-{n}", user=user) as context:
                page = context.pages[0] if context.pages else context.new_page()
                problems = browser.Problems(origin(node))
                problems.watch(page)
                page.goto(origin(node) + "/")
                expect(page.locator("#live-text")).to_have_text(live)
                if alert is None:
                    expect(page.get_by_role("alert")).to_be_hidden()
                    expect(page.locator("#connections")).to_have_text("0")
                    expect(page.locator("#node-version")).to_have_text(VERSION)
                    assert problems.console == []
                else:
                    expect(page.get_by_role("alert")).to_contain_text(alert)
                    expect(page.get_by_role("button", name="Try again")).to_be_visible()
                assert problems.errors == []
