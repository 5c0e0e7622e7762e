"""Pulsar's admin REST API as mop speaks it: topic paths, and TopicStats JSON both ways."""

from __future__ import annotations

import pytest

from mop.messaging import SubscriptionKind
from mop.processor.backend import ConsumerStats, SubscriptionStats, TopicStats, Traffic
from mop.protocols.pulsar.admin_rest import (
    StatsFormatError,
    namespace_path,
    stats_document,
    stats_from_document,
    topic_path,
)
from mop.topics import TopicError

STATS = TopicStats(
    topic="persistent://public/default/a%2Fb",
    inbound=Traffic(10, 100, 2.5, 25.0),
    outbound=Traffic(4, 40, 1.0, 10.0),
    storage_size=1234,
    producers=("p-1",),
    subscriptions=(
        SubscriptionStats(
            "sub",
            SubscriptionKind.KEY_SHARED,
            backlog=6,
            consumers=(ConsumerStats("c-1", unacked=2, permits=98),),
            outbound=Traffic(4, 40, 1.0, 10.0),
        ),
    ),
)


def test_paths_encode_the_local_name_once_more() -> None:
    assert namespace_path("persistent", "public/default") == "/admin/v2/persistent/public/default"
    assert topic_path(STATS.topic) == "/admin/v2/persistent/public/default/a%252Fb"
    assert topic_path("non-persistent://t/n/x y") == "/admin/v2/non-persistent/t/n/x%20y"
    with pytest.raises(TopicError):
        topic_path("persistent://only/two")


def test_stats_use_pulsars_field_names() -> None:
    document = stats_document(STATS)
    assert document["msgRateIn"] == 2.5
    assert document["msgThroughputIn"] == 25.0
    assert document["msgInCounter"] == 10
    assert document["bytesInCounter"] == 100
    assert document["msgRateOut"] == 1.0
    assert document["msgOutCounter"] == 4
    assert document["storageSize"] == 1234
    assert document["averageMsgSize"] == 10.0
    assert document["publishers"] == [{"producerName": "p-1"}]
    sub = document["subscriptions"]["sub"]
    assert sub["type"] == "Key_Shared"
    assert sub["msgBacklog"] == 6
    assert sub["unackedMessages"] == 2
    assert sub["consumers"] == [
        {"consumerName": "c-1", "unackedMessages": 2, "availablePermits": 98}
    ]


def test_stats_come_back_as_they_went() -> None:
    assert stats_from_document(STATS.topic, stats_document(STATS)) == STATS


def test_a_pulsar_document_with_fields_mop_does_not_know() -> None:
    document = {
        "msgRateIn": 0.0,
        "msgInCounter": 7,
        "bytesInCounter": 70,
        "storageSize": 700,
        "backlogSize": 0,
        "publishers": [],
        "subscriptions": {
            "idle": {"msgBacklog": 7, "type": None, "consumers": [], "isDurable": True},
            "busy": {"msgBacklog": 0, "type": "Shared", "consumers": [{"address": "/1.2.3.4"}]},
        },
        "replication": {},
        "deduplicationStatus": "Disabled",
    }
    stats = stats_from_document("persistent://t/n/x", document)
    assert stats.inbound == Traffic(7, 70, 0.0, 0.0)
    assert stats.backlog == 7
    kinds = {sub.name: sub.kind for sub in stats.subscriptions}
    assert kinds == {"idle": None, "busy": SubscriptionKind.SHARED}
    assert stats.consumers == 1


@pytest.mark.parametrize(
    "document",
    [
        [],
        {"msgInCounter": "many"},
        {"subscriptions": ["s"]},
        {"subscriptions": {"s": {"consumers": 1}}},
    ],
)
def test_what_is_no_topic_stats(document: object) -> None:
    with pytest.raises(StatsFormatError):
        stats_from_document("persistent://t/n/x", document)
