"""A partitioned topic is read one Spark partition per topic partition (in parallel), its rows
named after the partitioned topic with the partition number."""

from __future__ import annotations

from typing import Any

import httpx
import pulsar
import pytest

from mop.protocols.pulsar.admin_rest import topic_path
from mop.testing.node import RunningNode
from mop.topic_names import mqtt_to_pulsar
from tests.e2e.admin.topics_support import admin_url
from tests.spark.support import hold

pytestmark = pytest.mark.spark


def test_each_partition_is_a_spark_partition(
    spark: Any, service_url: str, client: pulsar.Client, node: RunningNode, topic: str
) -> None:
    # Pulsar refuses a partitioned topic whose name holds "-partition-", as this test's does.
    topic = topic.replace("-partition-", "-part-")
    pulsar_topic = mqtt_to_pulsar(topic)
    with httpx.Client(base_url=admin_url(node), timeout=10) as http:
        assert http.put(topic_path(pulsar_topic) + "/partitions", json=3).status_code == 204
    hold(client, topic)
    producer = client.create_producer(
        pulsar_topic,
        message_routing_mode=pulsar.PartitionsRoutingMode.RoundRobinDistribution,
        batching_enabled=False,
    )
    sent = {producer.send(f"m{n}".encode()).partition(): f"m{n}" for n in range(3)}
    assert sorted(sent) == [0, 1, 2]

    df = spark.read.format("mop").option("service_url", service_url).option("topics", topic).load()
    assert df.rdd.getNumPartitions() == 3
    rows = sorted((row.topic, row.pulsar_topic, row.partition, row.payload) for row in df.collect())
    assert rows == [(topic, pulsar_topic, n, sent[n].encode()) for n in range(3)]
