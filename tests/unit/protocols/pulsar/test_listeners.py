"""Advertised listeners: the setting's form, and what a lookup of an unknown one is told."""

from __future__ import annotations

import pytest

from mop.advertised_listeners import Listener, listener_urls, listeners_of
from mop.protocols.pulsar.listeners import unknown_listener


def test_a_listener_has_a_plain_url_a_tls_url_or_one_of_each() -> None:
    assert listener_urls("pulsar://h:6650") == ("pulsar://h:6650", None)
    assert listener_urls("pulsar+ssl://h:6651/") == (None, "pulsar+ssl://h:6651")
    assert listener_urls("pulsar+ssl://h:6651, pulsar://h:6650") == (
        "pulsar://h:6650",
        "pulsar+ssl://h:6651",
    )


@pytest.mark.parametrize(
    "value",
    ["", "http://h:1", "pulsar://", "pulsar://a:1,pulsar://b:1", "pulsar://a:1,", "h:6650"],
)
def test_anything_else_is_refused(value: str) -> None:
    with pytest.raises(ValueError, match="not a pulsar:// URL"):
        listener_urls(value)


def test_listeners_by_name() -> None:
    listeners = listeners_of({"internal": "pulsar://10.0.0.5:6650", "external": "pulsar+ssl://x:1"})
    assert listeners == {
        "internal": Listener("internal", "pulsar://10.0.0.5:6650", None),
        "external": Listener("external", None, "pulsar+ssl://x:1"),
    }
    with pytest.raises(ValueError, match="needs a name"):
        listeners_of({"": "pulsar://h:1"})


def test_an_unknown_listener_is_told_in_pulsars_words() -> None:
    assert unknown_listener("edge") == "the broker do not have edge listener"
