"""Which topics a selection means, and the names rows show for them."""

from __future__ import annotations

import pytest

from mop.spark.options import Selection
from mop.spark.topics import TopicNames, listing_namespaces, matching, named_topics, topic_names

pytestmark = pytest.mark.spark

LISTED = [
    "persistent://public/default/sensors%2Fa%2Ftemp",
    "persistent://public/default/sensors%2Fb%2Ftemp",
    "persistent://public/default/sensors%2Fb%2Fhum",
    "persistent://public/default/%24SYS%2Fbroker",
    "persistent://public/default/plain-partition-0",
    "persistent://public/default/plain-partition-1",
    "persistent://public/default/a%2B",  # MQTT cannot name it ("a+")
]


def test_mqtt_filters_match_mqtt_names() -> None:
    selection = Selection(filters=("sensors/+/temp",))
    assert matching(selection, LISTED) == [
        "persistent://public/default/sensors%2Fa%2Ftemp",
        "persistent://public/default/sensors%2Fb%2Ftemp",
    ]
    # '#' at the start does not match topics that begin with '$', as in MQTT.
    everything = matching(Selection(filters=("#",)), LISTED)
    assert "persistent://public/default/%24SYS%2Fbroker" not in everything
    assert "persistent://public/default/a%2B" not in everything
    assert "persistent://public/default/plain-partition-1" in everything


def test_a_pattern_matches_the_name_without_partition() -> None:
    selection = Selection(pattern=r"persistent://public/default/plain")
    assert matching(selection, LISTED) == [
        "persistent://public/default/plain-partition-0",
        "persistent://public/default/plain-partition-1",
    ]


def test_named_topics_and_namespaces_to_list() -> None:
    selection = Selection(names=("a/b", "persistent://t/n/x"), filters=("s/#",))
    assert named_topics(selection) == ["persistent://public/default/a%2Fb", "persistent://t/n/x"]
    assert listing_namespaces(selection, tenant="public", namespace="default") == ["public/default"]
    assert listing_namespaces(
        Selection(pattern="persistent://t/n/.*"), tenant="public", namespace="default"
    ) == ["t/n"]
    assert listing_namespaces(Selection(names=("a",)), tenant="p", namespace="d") == []


def test_topic_names() -> None:
    assert topic_names("persistent://public/default/a%2Fb") == TopicNames(
        "a/b", "persistent://public/default/a%2Fb", -1
    )
    assert topic_names("persistent://public/default/p-partition-3") == TopicNames(
        "p", "persistent://public/default/p", 3
    )
    assert topic_names("persistent://t/n/x") == TopicNames(
        "persistent://t/n/x", "persistent://t/n/x", -1
    )
