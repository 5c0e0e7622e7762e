"""Headless Chromium for page tests: the system's Debian `chromium`, driven by playwright (which
downloads no browser of its own here), started so that it makes no network calls of its own.

Without chromium or playwright the page tests are skipped with the reason; with
REQUIRE_BROWSER_TESTS=1 (as tox sets) that is an error instead.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from playwright.sync_api import BrowserContext, ConsoleMessage, Page

# Without the background-networking flags Chromium keeps calling Google's services, which a
# closed network refuses many times a second.
FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
)


def chromium_path() -> str | None:
    """The browser: $CHROMIUM if set, else Debian's `chromium` (/usr/bin/chromium)."""
    return os.environ.get("CHROMIUM") or shutil.which("chromium")


def missing() -> str | None:
    """Why page tests cannot run here, or None."""
    if importlib.util.find_spec("playwright") is None:
        return "playwright is not installed (pip install -e '.[test]')"
    path = chromium_path()
    if path is None:
        return "no chromium on PATH (Debian: apt-get install chromium)"
    if not os.access(path, os.X_OK):
        return f"{path} (from $CHROMIUM) is not an executable"
    return None


def skip_unless_available() -> None:
    """Skip the calling test module when no browser can run (an error under CI)."""
    reason = missing()
    if reason is None:
        return
    if os.environ.get("REQUIRE_BROWSER_TESTS") == "1":
        raise RuntimeError(f"REQUIRE_BROWSER_TESTS=1 but the browser tests cannot run: {reason}")
    pytest.skip(f"browser tests: {reason}", allow_module_level=True)


@dataclass
class Problems:
    """What a page complained about: console errors, uncaught exceptions, and requests that
    left the page's own origin."""

    origin: str
    console: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    foreign: list[str] = field(default_factory=list)

    def watch(self, page: Page) -> None:
        page.on("console", self._console)
        page.on("pageerror", lambda error: self.errors.append(str(error)))
        page.on("request", self._request)

    def _console(self, message: ConsoleMessage) -> None:
        if message.type in ("error", "warning"):
            self.console.append(f"{message.type}: {message.text}")

    def _request(self, request: object) -> None:
        url: str = getattr(request, "url", "")
        if not url.startswith(self.origin + "/"):
            self.foreign.append(url)


@contextmanager
def open_browser(
    profile: Path,
    *,
    width: int = 1366,
    height: int = 860,
    user: tuple[str, str] | None = None,
) -> Iterator[BrowserContext]:
    """A browser (one context, a fresh profile in `profile`) at laptop size, English locale;
    with `user`, it answers HTTP authentication challenges with that name and password, as a
    person would at the browser's prompt."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        context = playwright.chromium.launch_persistent_context(
            str(profile),
            executable_path=chromium_path(),
            args=list(FLAGS),
            viewport={"width": width, "height": height},
            locale="en-US",
            timezone_id="UTC",
            http_credentials=None if user is None else {"username": user[0], "password": user[1]},
        )
        try:
            yield context
        finally:
            context.close()
