"""Which `Host` the admin listener answers to (`mop.admin.hosts`): loopback names only on a
loopback listener unless `admin.allowed_hosts` says otherwise, any host elsewhere."""

from __future__ import annotations

import pytest

from mop.admin.hosts import HostGuard, allowed_hosts, host_name, is_loopback
from mop.admin.http import HttpError
from mop.settings import AdminSettings


@pytest.mark.parametrize(
    ("host", "name"),
    [
        ("localhost", "localhost"),
        ("LocalHost.:8080", "localhost"),
        ("127.0.0.1:80", "127.0.0.1"),
        ("[::1]:8080", "::1"),
        ("[::1]", "::1"),
        ("::1", "::1"),
        ("mop.example", "mop.example"),
    ],
)
def test_host_names_are_compared_without_port_brackets_or_case(host: str, name: str) -> None:
    assert host_name(host) == name


def test_loopback_hosts() -> None:
    for host in ("127.0.0.1", "127.0.0.2", "::1", "localhost"):
        assert is_loopback(host), host
    for host in ("0.0.0.0", "::", "10.0.0.1", "", "mop.example"):
        assert not is_loopback(host), host


def test_a_loopback_listener_answers_loopback_names_only() -> None:
    assert allowed_hosts(AdminSettings()) == {"localhost", "127.0.0.1", "::1"}
    # The address it is bound to is one of them.
    assert "127.0.0.2" in (allowed_hosts(AdminSettings(host="127.0.0.2")) or ())
    assert allowed_hosts(AdminSettings(host="0.0.0.0")) is None
    assert allowed_hosts(AdminSettings(host="10.0.0.1")) is None


def test_allowed_hosts_replace_the_defaults() -> None:
    settings = AdminSettings(host="0.0.0.0", allowed_hosts=("Mop.Example", "[fe80::1]"))
    assert allowed_hosts(settings) == {"mop.example", "fe80::1"}
    assert allowed_hosts(AdminSettings(allowed_hosts=("localhost", "*"))) is None


def test_the_guard_refuses_other_hosts_with_421() -> None:
    guard = HostGuard.of(AdminSettings())
    for host in ("localhost:8080", "127.0.0.1", "[::1]:8080", "LOCALHOST"):
        guard({"host": host})
    guard({})  # HTTP/1.0 names no host: no browser sends that
    for host in ("evil.example", "evil.example:8080", "127.0.0.1.evil.example", ""):
        with pytest.raises(HttpError) as refused:
            guard({"host": host})
        assert refused.value.status == 421
        assert "admin.allowed_hosts" in refused.value.message
    HostGuard.of(AdminSettings(host="0.0.0.0"))({"host": "evil.example"})
