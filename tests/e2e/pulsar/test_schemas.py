"""Pulsar schemas with pulsar-client (sync and asyncio): AvroSchema, JsonSchema, StringSchema
and BytesSchema round-trip, versions in PRODUCER_SUCCESS and in message metadata, refused
schemas, the namespace's rule set through the admin API, GET_SCHEMA and GET_OR_CREATE_SCHEMA
answered like Pulsar's brokers, durability across a restart, and MQTT publishers on a topic with
a schema (not checked: stored without a schema version)."""

from __future__ import annotations

import asyncio
import dataclasses
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pulsar
import pytest
from pulsar.schema import (
    AvroSchema,
    BytesSchema,
    Integer,
    JsonSchema,
    Record,
    Schema,
    String,
    StringSchema,
)

from mop.protocols.pulsar.commands import (
    GetOrCreateSchema,
    GetOrCreateSchemaResponse,
    GetSchema,
    GetSchemaResponse,
    SchemaType,
)
from mop.protocols.pulsar.commands import Schema as SchemaCommand
from mop.protocols.pulsar.errors import ServerError
from mop.testing.node import RunningNode
from tests.e2e.admin.topics_support import admin_url
from tests.e2e.clients import Client
from tests.e2e.pulsar_support import (
    TIMEOUT_MS,
    RawPulsar,
    pulsar_client,
    pulsar_node,
    pulsar_port,
    pulsar_settings,
    service_url,
)

pytestmark = pytest.mark.e2e

VERSION_0 = b"\x00" * 8
VERSION_1 = b"\x00" * 7 + b"\x01"


class Reading(Record):
    sensor = String()
    value = Integer()


def reading_v2() -> type[Record]:
    """`Reading` with one more field, with a default: readers of either read the other's data."""

    class Reading(Record):
        sensor = String()
        value = Integer()
        unit = String(required_default=True)  # in the definition: "default": null

    return Reading


def reading_with_required_field() -> type[Record]:
    """`Reading` with a required field more: its readers cannot read the first one's data."""

    class Reading(Record):
        sensor = String()
        value = Integer()
        site = String(required=True)

    return Reading


@pytest.fixture
def http(node: RunningNode) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=admin_url(node), timeout=10) as client:
        yield client


def version_of(message: pulsar.Message) -> bytes:
    # pulsar-client gives the metadata's bytes as a str of code points below 256.
    return str(message.schema_version()).encode("latin-1")


SCHEMAS: list[tuple[str, Schema, Any]] = [
    ("avro", AvroSchema(Reading), Reading(sensor="t1", value=21)),
    ("json", JsonSchema(Reading), Reading(sensor="t2", value=22)),
    ("string", StringSchema(), "twenty-three"),
    ("bytes", BytesSchema(), b"\x00\x17"),
]


@pytest.mark.parametrize(("kind", "schema", "value"), SCHEMAS, ids=[s[0] for s in SCHEMAS])
def test_values_round_trip_with_their_schema(
    client: pulsar.Client, topic: str, kind: str, schema: Schema, value: Any
) -> None:
    consumer = client.subscribe(topic, "s", schema=schema)
    producer = client.create_producer(topic, schema=schema)
    producer.send(value)
    message = consumer.receive(timeout_millis=TIMEOUT_MS)
    received = message.value()
    if isinstance(value, Record):
        assert (received.sensor, received.value) == (value.sensor, value.value)
    else:
        assert received == value
    # BYTES is no schema: nothing is registered, the messages carry no version.
    assert version_of(message) == (b"" if kind == "bytes" else VERSION_0)
    reader = client.create_reader(topic, pulsar.MessageId.earliest, schema=schema)
    assert reader.read_next(timeout_millis=TIMEOUT_MS).value() == received


def test_the_asyncio_client_round_trips_avro_and_json(node: RunningNode, topic: str) -> None:
    from pulsar.asyncio import Client as AsyncClient
    from pulsar.asyncio import PulsarException

    async def scenario() -> tuple[list[tuple[str, int]], pulsar.Result]:
        client = AsyncClient(service_url(node))
        got = []
        try:
            for suffix, schema in (("avro", AvroSchema(Reading)), ("json", JsonSchema(Reading))):
                consumer = await client.subscribe(f"{topic}-{suffix}", "s", schema=schema)
                producer = await client.create_producer(f"{topic}-{suffix}", schema=schema)
                await producer.send(Reading(sensor=suffix, value=len(got)))
                message = await consumer.receive()
                await consumer.acknowledge(message)
                got.append((message.value().sensor, message.value().value))
            refused = AvroSchema(reading_with_required_field())
            try:
                await client.create_producer(f"{topic}-avro", schema=refused)
            except PulsarException as exc:
                return got, exc.error()
            raise AssertionError("an incompatible schema was taken")
        finally:
            await client.close()

    got, refusal = asyncio.run(scenario())
    assert got == [("avro", 0), ("json", 1)]
    assert refusal == pulsar.Result.IncompatibleSchema


def test_a_compatible_schema_becomes_the_next_version(client: pulsar.Client, topic: str) -> None:
    consumer = client.subscribe(topic, "s", schema=AvroSchema(Reading))
    client.create_producer(topic, schema=AvroSchema(Reading)).send(Reading(sensor="a", value=1))
    v2 = reading_v2()
    client.create_producer(topic, schema=AvroSchema(v2)).send(v2(sensor="b", value=2, unit="K"))
    versions = [version_of(consumer.receive(timeout_millis=TIMEOUT_MS)) for _ in range(2)]
    assert versions == [VERSION_0, VERSION_1]


def test_an_incompatible_producer_or_consumer_is_refused(client: pulsar.Client, topic: str) -> None:
    client.create_producer(topic, schema=AvroSchema(Reading))
    refused = AvroSchema(reading_with_required_field())  # default rule FULL: not backward
    with pytest.raises(pulsar.IncompatibleSchema):
        client.create_producer(topic, schema=refused)
    with pytest.raises(pulsar.IncompatibleSchema):
        client.subscribe(topic, "s2", schema=refused)
    with pytest.raises(pulsar.IncompatibleSchema):
        client.create_producer(topic, schema=StringSchema())  # another kind
    # A client without a schema, or taking the topic's as it is, is not checked.
    client.create_producer(topic).send(b"raw")
    client.subscribe(topic, "s3")


def test_a_consumers_schema_is_checked_and_not_added(
    client: pulsar.Client, http: httpx.Client
) -> None:
    topic = "persistent://public/default/schema-consumers"
    base = "/admin/v2/schemas/public/default/schema-consumers/schema"
    # On a topic without a schema, a consumer's becomes the first version (as in Pulsar).
    client.subscribe(topic, "first", schema=AvroSchema(Reading))
    assert http.get(base).json()["version"] == 0
    # A compatible one is taken, and the topic keeps its versions.
    v2 = reading_v2()
    consumer = client.subscribe(topic, "second", schema=AvroSchema(v2))
    assert http.get(base).json()["version"] == 0
    client.create_producer(topic, schema=AvroSchema(Reading)).send(Reading(sensor="o", value=9))
    message = consumer.receive(timeout_millis=TIMEOUT_MS)
    assert (message.value().sensor, message.value().unit) == ("o", None)


def test_a_consumers_schema_is_refused_on_a_busy_topic_without_one(client: pulsar.Client) -> None:
    # Pulsar adds a consumer's schema only to an idle topic: one with data has none to check.
    topic = "persistent://public/default/schema-busy"
    client.create_producer(topic).send(b"raw")
    with pytest.raises(pulsar.IncompatibleSchema):
        client.subscribe(topic, "typed", schema=AvroSchema(Reading))
    client.subscribe(topic, "untyped")


def test_the_namespace_rule_is_set_through_the_admin_api(
    client: pulsar.Client, http: httpx.Client
) -> None:
    strategy = "/admin/v2/namespaces/public/default/schemaCompatibilityStrategy"
    assert http.get(strategy).json() == "FULL"
    topic = "persistent://public/default/schema-rules"
    client.create_producer(topic, schema=AvroSchema(Reading))
    try:
        assert http.put(strategy, json="FORWARD").status_code == 204
        assert http.get(strategy).json() == "FORWARD"
        # Readers of the first version can read data with a field more: FORWARD takes it.
        client.create_producer(topic, schema=AvroSchema(reading_with_required_field()))
        assert http.put(strategy, json="ALWAYS_INCOMPATIBLE").status_code == 204
        with pytest.raises(pulsar.IncompatibleSchema):
            client.create_producer(topic, schema=AvroSchema(reading_v2()))
        client.create_producer(topic, schema=AvroSchema(Reading))  # known: still version 0
        refused = http.put(strategy, json="SOMETIMES")
        assert refused.status_code == 400 and "FULL" in refused.json()["reason"]
    finally:
        assert http.put(strategy, json="UNDEFINED").status_code == 204
    assert http.get(strategy).json() == "FULL"


def test_the_admin_api_shows_a_topics_schema(client: pulsar.Client, http: httpx.Client) -> None:
    topic = "persistent://public/default/schema-shown"
    base = "/admin/v2/schemas/public/default/schema-shown/schema"
    assert http.get(base).status_code == 404
    client.create_producer(topic, schema=JsonSchema(Reading))
    client.create_producer(topic, schema=JsonSchema(reading_v2()))
    latest = http.get(base).json()
    assert (latest["version"], latest["type"]) == (1, "JSON")
    assert [f["name"] for f in json.loads(latest["data"])["fields"]] == ["sensor", "value", "unit"]
    first = http.get(f"{base}/0").json()
    assert first["version"] == 0 and "unit" not in first["data"]
    assert http.get(f"{base}/5").status_code == 404
    assert http.get(f"{base}/x").status_code == 400


def test_a_schema_is_deleted_through_the_admin_api_and_with_its_topic(
    client: pulsar.Client, http: httpx.Client
) -> None:
    base = "/admin/v2/schemas/public/default/schema-deleted/schema"
    topic = "persistent://public/default/schema-deleted"
    assert http.delete(base).status_code == 404
    client.create_producer(topic, schema=AvroSchema(Reading)).close()
    client.create_producer(topic, schema=AvroSchema(reading_v2())).close()
    deleted = http.delete(base)
    assert deleted.status_code == 200 and deleted.json() == {"version": 1}
    assert http.get(base).status_code == 404
    # A schema that could not have followed the deleted ones starts the topic afresh.
    producer = client.create_producer(topic, schema=StringSchema())
    producer.send("s")
    producer.close()
    assert http.get(base).json()["version"] == 0
    # Deleting the topic deletes its schema, as in Pulsar.
    assert http.delete("/admin/v2/persistent/public/default/schema-deleted").status_code == 204
    assert http.get(base).status_code == 404


def test_a_partitioned_topics_schema_is_deleted_with_it(
    client: pulsar.Client, http: httpx.Client
) -> None:
    admin = "/admin/v2/persistent/public/default/schema-partitioned"
    base = "/admin/v2/schemas/public/default/schema-partitioned/schema"
    assert http.put(f"{admin}/partitions", json=2).status_code == 204
    client.create_producer(
        "persistent://public/default/schema-partitioned", schema=AvroSchema(Reading)
    ).close()
    assert http.get(base).json()["version"] == 0
    assert http.delete(f"{admin}/partitions").status_code == 204
    assert http.get(base).status_code == 404


@pytest.fixture
def raw(node: RunningNode) -> Iterator[RawPulsar]:
    client = RawPulsar(pulsar_port(node))
    try:
        client.connect()
        yield client
    finally:
        client.close()


def avro_command(record: type[Record]) -> SchemaCommand:
    data = AvroSchema(record).schema_info().schema().encode()
    return SchemaCommand(name="", schema_data=data, type=SchemaType.AVRO)


def test_get_schema_and_get_or_create_schema_answer_as_pulsar_brokers_do(
    raw: RawPulsar,
) -> None:
    topic = "persistent://public/default/schema-raw"
    raw.send(GetSchema(request_id=1, topic=topic))
    missing = raw.recv()
    assert isinstance(missing, GetSchemaResponse)
    assert missing.error_code is ServerError.TopicNotFound
    assert missing.error_message == "Topic not found or no-schema"
    raw.send(GetOrCreateSchema(request_id=2, topic=topic, schema=avro_command(Reading)))
    created = raw.recv()
    assert created == GetOrCreateSchemaResponse(request_id=2, schema_version=VERSION_0)
    raw.send(GetOrCreateSchema(request_id=3, topic=topic, schema=avro_command(reading_v2())))
    assert raw.recv() == GetOrCreateSchemaResponse(request_id=3, schema_version=VERSION_1)
    refused = avro_command(reading_with_required_field())
    raw.send(GetOrCreateSchema(request_id=4, topic=topic, schema=refused))
    answer = raw.recv()
    assert isinstance(answer, GetOrCreateSchemaResponse)
    assert answer.error_code is ServerError.IncompatibleSchema and answer.schema_version is None
    raw.send(GetSchema(request_id=5, topic=topic + "-partition-3", schema_version=VERSION_0))
    found = raw.recv()
    assert isinstance(found, GetSchemaResponse) and found.schema is not None
    assert found.schema_version == VERSION_0
    assert found.schema.schema_data == avro_command(Reading).schema_data
    raw.send(GetSchema(request_id=6, topic=topic, schema_version=b"\x01"))
    bad = raw.recv()
    assert isinstance(bad, GetSchemaResponse) and bad.error_code is ServerError.UnknownError
    raw.send(GetSchema(request_id=7, topic=topic))  # the connection goes on
    latest = raw.recv()
    assert isinstance(latest, GetSchemaResponse) and latest.schema_version == VERSION_1


def test_schemas_and_rules_survive_a_restart(tmp_path: Path) -> None:
    settings = dataclasses.replace(pulsar_settings(), data_dir=str(tmp_path / "data"))
    topic = "persistent://public/default/schema-durable"
    with pulsar_node(settings) as node, pulsar_client(node) as client:
        client.create_producer(topic, schema=AvroSchema(Reading))
        client.create_producer(topic, schema=AvroSchema(reading_v2()))
        with httpx.Client(base_url=admin_url(node)) as http:
            strategy = "/admin/v2/namespaces/public/default/schemaCompatibilityStrategy"
            assert http.put(strategy, json="BACKWARD").status_code == 204
    v2 = reading_v2()
    with pulsar_node(settings) as node, pulsar_client(node) as client:
        consumer = client.subscribe(topic, "s", schema=AvroSchema(v2))
        producer = client.create_producer(topic, schema=AvroSchema(v2))
        producer.send(v2(sensor="again", value=3))
        assert version_of(consumer.receive(timeout_millis=TIMEOUT_MS)) == VERSION_1
        with httpx.Client(base_url=admin_url(node)) as http:
            strategy = "/admin/v2/namespaces/public/default/schemaCompatibilityStrategy"
            assert http.get(strategy).json() == "BACKWARD"


def test_mqtt_publishers_are_not_checked_against_the_topics_schema(
    node: RunningNode, client: pulsar.Client
) -> None:
    topic = "persistent://public/default/sensors%2Fjson"
    consumer = client.subscribe(topic, "s", schema=JsonSchema(Reading))
    mqtt = Client(node.mqtt_port, "schema-publisher")
    # A payload that fits the schema reaches the Pulsar consumer, decoded by its schema...
    assert mqtt.publish("sensors/json", b'{"sensor": "m1", "value": 5}', qos=1) == 0
    message = consumer.receive(timeout_millis=TIMEOUT_MS)
    assert (message.value().sensor, message.value().value) == ("m1", 5)
    # ... stored without a schema version, as a Pulsar producer without a schema would be.
    assert version_of(message) == b""
    # One that does not is stored as well: MQTT publishers are not checked.
    assert mqtt.publish("sensors/json", b"not json", qos=1) == 0
    assert consumer.receive(timeout_millis=TIMEOUT_MS).data() == b"not json"


def test_malformed_and_oversized_definitions_are_refused_and_the_connection_goes_on(
    raw: RawPulsar,
) -> None:
    topic = "persistent://public/default/schema-malformed"
    nested = SchemaCommand(name="", schema_data=b"[" * 50_000, type=SchemaType.AVRO)
    raw.send(GetOrCreateSchema(request_id=1, topic=topic, schema=nested))
    answer = raw.recv()
    assert isinstance(answer, GetOrCreateSchemaResponse)
    assert answer.error_code is ServerError.IncompatibleSchema
    assert "nested too deeply" in (answer.error_message or "")
    fields = [{"name": f"field_{n:05}", "type": "string"} for n in range(3000)]
    large = json.dumps({"type": "record", "name": "Wide", "fields": fields}).encode()
    assert len(large) > 64 * 1024
    wide = SchemaCommand(name="", schema_data=large, type=SchemaType.AVRO)
    raw.send(GetOrCreateSchema(request_id=2, topic=topic, schema=wide))
    answer = raw.recv()
    assert isinstance(answer, GetOrCreateSchemaResponse)
    assert answer.error_code is ServerError.IncompatibleSchema
    assert "pulsar.schema_max_bytes" in (answer.error_message or "")
    for request_id, data in ((3, b"null"), (4, b"[]")):
        json_kind = SchemaCommand(name="", schema_data=data, type=SchemaType.JSON)
        raw.send(GetOrCreateSchema(request_id=request_id, topic=topic, schema=json_kind))
        answer = raw.recv()
        assert isinstance(answer, GetOrCreateSchemaResponse)
        assert answer.error_code is ServerError.IncompatibleSchema
    raw.send(GetOrCreateSchema(request_id=5, topic=topic, schema=avro_command(Reading)))
    assert raw.recv() == GetOrCreateSchemaResponse(request_id=5, schema_version=VERSION_0)
