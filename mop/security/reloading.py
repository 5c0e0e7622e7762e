"""Reloading the security files while the node runs: when one of them changes, and at once on
SIGHUP. A file that cannot be used keeps the policy in force and logs one line saying why."""

from __future__ import annotations

import logging
import os
import signal
import threading
from collections.abc import Callable

import trio

from mop.security.gatekeeper import Gatekeeper
from mop.security.policy import PolicyError, SecurityPolicy, load_policy, policy_files
from mop.settings import AuthSettings

log = logging.getLogger("mop.security")

# What identifies a file's version: (inode, size, modification time in ns); None: missing.
_Stamp = tuple[int, int, int] | None


def _stamp(path: str) -> _Stamp:
    try:
        info = os.stat(path)
    except OSError:
        return None
    return (info.st_ino, info.st_size, info.st_mtime_ns)


class PolicyReloader:
    """Builds a new policy from the files and puts it in force, or keeps the old one."""

    def __init__(
        self,
        gatekeeper: Gatekeeper,
        settings: AuthSettings,
        *,
        load: Callable[[AuthSettings], SecurityPolicy] = load_policy,
    ) -> None:
        self._gatekeeper = gatekeeper
        self._settings = settings
        self._load = load
        self._files = policy_files(settings)
        self._stamps = {path: _stamp(path) for path in self._files}

    def changed(self) -> bool:
        """Whether any file changed since it was last loaded (or looked at)."""
        stamps = {path: _stamp(path) for path in self._files}
        if stamps == self._stamps:
            return False
        self._stamps = stamps
        return True

    def reload(self, why: str) -> bool:
        try:
            policy = self._load(self._settings)
        except PolicyError as exc:
            log.error("security files not reloaded (%s), the previous rules stay: %s", why, exc)
            return False
        self._gatekeeper.replace(policy)
        log.info("security files reloaded (%s): %s", why, ", ".join(self._files) or "none")
        return True

    async def serve(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Reload on SIGHUP and whenever a file changes (looked at every `reload_interval`)."""
        async with trio.open_nursery() as nursery:
            if _can_receive_signals():
                nursery.start_soon(self._on_sighup)
            task_status.started()
            interval = self._settings.reload_interval
            if not self._files or interval <= 0:
                return
            while True:
                await trio.sleep(interval)
                if self.changed():
                    self.reload("a file changed")

    async def _on_sighup(self) -> None:
        with trio.open_signal_receiver(signal.SIGHUP) as signals:
            async for _ in signals:
                self.changed()  # take the files' current state as seen
                self.reload("SIGHUP")


def _can_receive_signals() -> bool:
    """Signals reach only the main thread's trio run (a node embedded in a thread has none)."""
    return hasattr(signal, "SIGHUP") and threading.current_thread() is threading.main_thread()
