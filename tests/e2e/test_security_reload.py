"""`mop run` reloads its security files on SIGHUP, as operators of mosquitto expect, and keeps
the rules in force when a file is broken."""

from __future__ import annotations

import re
import signal
from pathlib import Path

import pytest

from mop.security.passwords import update_password_file
from tests.e2e.clients import Client
from tests.e2e.nodeproc import NodeProcess

pytestmark = pytest.mark.e2e

RELOADED = re.compile(r"security files reloaded \(SIGHUP\)")
NOT_RELOADED = re.compile(r"security files not reloaded \(SIGHUP\)")


def test_sighup_reloads_the_acl_and_a_broken_file_keeps_the_rules(tmp_path: Path) -> None:
    passwords = tmp_path / "passwords"
    passwords.write_text(update_password_file("", "bob", b"b2"))
    acl = tmp_path / "acl"
    acl.write_text("user bob\ntopic read old/#\n")
    node = NodeProcess(
        tmp_path / "data",
        MOP_AUTH__ALLOW_ANONYMOUS="false",
        MOP_AUTH__PASSWORD_FILE=str(passwords),
        MOP_AUTH__ACL_FILE=str(acl),
        MOP_AUTH__RELOAD_INTERVAL="0",  # no polling: only the signal reloads
    )
    port = node.start()
    try:
        bob = Client(port, "bob", username="bob", password="b2")
        assert bob.subscribe("new/#", 0) == [0x87]
        acl.write_text("user bob\ntopic read new/#\n")
        assert node.process is not None
        node.process.send_signal(signal.SIGHUP)
        node.wait_for(RELOADED, 10)
        assert bob.subscribe("new/#", 0) == [0]
        assert bob.subscribe("old/#", 0) == [0x87]
        acl.write_text("topic sideways new/#\n")
        node.process.send_signal(signal.SIGHUP)
        node.wait_for(NOT_RELOADED, 10)
        assert bob.subscribe("new/#", 0) == [0]
        assert node.stop() == 0
    finally:
        node.close()
