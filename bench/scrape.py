"""Scraping a mop node's `/metrics` while a run loads it (`--scrape-metrics SECONDS`): proof that
the metrics are on during the measurement, and their cost included in it.

The node's admin port is 0 in the bench (a free port), so it is read from the node's log line
"admin listening on tcp HOST:PORT". The last page of a run is kept, with a summary of it.
"""

from __future__ import annotations

import re
import threading
import time
import urllib.request
from pathlib import Path
from types import TracebackType

from prometheus_client.parser import text_string_to_metric_families

ADMIN_LISTENING = re.compile(r"admin listening on tcp (?P<host>\S+):(?P<port>\d+)")


def admin_url(log: Path, timeout: float = 10.0) -> str | None:
    """The node's `/metrics` URL, once its log names the admin listener; None if it does not."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        text = log.read_text(errors="replace") if log.exists() else ""
        found = ADMIN_LISTENING.search(text)
        if found:
            return f"http://{found['host']}:{found['port']}/metrics"
        time.sleep(0.1)
    return None


class Scraper:
    """GET `/metrics` every `interval` seconds in a thread while the `with` block runs."""

    def __init__(self, log: Path, interval: float) -> None:
        self.url = admin_url(log)
        self.interval = interval
        self.scrapes = 0
        self.failures: list[str] = []
        self.last = ""
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="scrape", daemon=True)

    def __enter__(self) -> Scraper:
        if self.url is None:
            self.failures.append("no admin listener in the node's log")
        else:
            self._thread.start()
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()
        if self.url is not None:
            self._scrape()  # the page as the run left it

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self._scrape()

    def _scrape(self) -> None:
        assert self.url is not None
        try:
            with urllib.request.urlopen(self.url, timeout=5) as response:
                self.last = response.read().decode()
            self.scrapes += 1
        except OSError as exc:
            self.failures.append(str(exc))

    def summary(self) -> dict[str, float]:
        """A few totals of the last page: messages in and out, timed publishes and deliveries."""
        totals: dict[str, float] = {}
        wanted = {
            "mop_messages_total": lambda labels: f"messages_{labels.get('direction')}",
            "mop_publish_duration_seconds_count": lambda labels: "publishes_timed",
            "mop_delivery_latency_seconds_count": lambda labels: "deliveries_timed",
        }
        for family in text_string_to_metric_families(self.last):
            for sample in family.samples:
                name = wanted.get(sample.name)
                if name is not None:
                    key = name(sample.labels)
                    totals[key] = totals.get(key, 0.0) + sample.value
        totals["scrapes"] = self.scrapes
        return totals
