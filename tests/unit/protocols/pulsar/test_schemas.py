"""The schema commands on the wire and through the connection, and the mapping between
Pulsar's `Schema` and the protocol-neutral `SchemaInfo`."""

from __future__ import annotations

import pytest

from mop.protocols.pulsar.commands import (
    Command,
    Connect,
    GetOrCreateSchema,
    GetOrCreateSchemaResponse,
    GetSchema,
    GetSchemaResponse,
    Schema,
    SchemaType,
)
from mop.protocols.pulsar.connection import ServerConnection
from mop.protocols.pulsar.errors import ServerError
from mop.protocols.pulsar.frames import FrameDecoder, NeedData, encode_command
from mop.protocols.pulsar.metadata import KeyValue
from mop.protocols.pulsar.schemas import (
    schema_info,
    schema_message,
    version_bytes,
    version_number,
)
from mop.schemas import SchemaInfo, SchemaKind, StoredSchema

AVRO = Schema(
    name="readings",
    schema_data=b'{"type": "record", "name": "R", "fields": []}',
    type=SchemaType.AVRO,
    properties=(KeyValue(key="k", value="v"),),
)


def decoded(command: Command) -> object:
    decoder = FrameDecoder()
    decoder.feed(encode_command(command))
    frame = decoder.next_frame()
    assert not isinstance(frame, NeedData)
    return frame


@pytest.mark.parametrize(
    "command",
    [
        GetSchema(request_id=1, topic="persistent://public/default/t"),
        GetSchema(request_id=2, topic="t", schema_version=version_bytes(3)),
        GetSchemaResponse(request_id=3, schema=AVRO, schema_version=version_bytes(0)),
        GetSchemaResponse(
            request_id=4,
            error_code=ServerError.TopicNotFound,
            error_message="Topic not found or no-schema",
        ),
        GetOrCreateSchema(request_id=5, topic="t", schema=AVRO),
        GetOrCreateSchemaResponse(request_id=6, schema_version=version_bytes(1)),
        GetOrCreateSchemaResponse(
            request_id=7, error_code=ServerError.IncompatibleSchema, error_message="no"
        ),
    ],
)
def test_schema_commands_round_trip(command: Command) -> None:
    assert decoded(command) == command


def test_the_command_numbers_are_pulsars() -> None:
    # BaseCommand types 34/35 and 39/40 (36-38 are the auth exchange and ACK_RESPONSE).
    assert [c.TYPE.value for c in (GetSchema, GetSchemaResponse)] == [34, 35]
    assert [c.TYPE.value for c in (GetOrCreateSchema, GetOrCreateSchemaResponse)] == [39, 40]


def test_the_connection_takes_schema_requests_and_sends_their_answers() -> None:
    conn = ServerConnection()
    conn.receive_data(encode_command(Connect(client_version="c", protocol_version=20)))
    assert isinstance(conn.next_event(), Connect)
    conn.connected()
    conn.receive_data(encode_command(GetSchema(request_id=1, topic="t")))
    conn.receive_data(encode_command(GetOrCreateSchema(request_id=2, topic="t", schema=AVRO)))
    assert isinstance(conn.next_event(), GetSchema)
    assert isinstance(conn.next_event(), GetOrCreateSchema)
    conn.send(GetSchemaResponse(request_id=1, error_code=ServerError.TopicNotFound))
    conn.send(GetOrCreateSchemaResponse(request_id=2, schema_version=version_bytes(0)))


def test_versions_are_eight_bytes_big_endian() -> None:
    assert version_bytes(0) == b"\x00" * 8
    assert version_bytes(258) == b"\x00" * 6 + b"\x01\x02"
    assert version_number(version_bytes(12345)) == 12345
    with pytest.raises(ValueError, match="8 bytes"):
        version_number(b"\x01")


@pytest.mark.parametrize("kind", list(SchemaType))
def test_every_pulsar_schema_type_has_a_kind_and_back(kind: SchemaType) -> None:
    schema = Schema(name="n", schema_data=b"d", type=kind)
    info = schema_info(schema)
    assert schema_message(StoredSchema(0, info)) == schema


def test_schema_info_keeps_definition_and_properties() -> None:
    info = schema_info(AVRO)
    assert info == SchemaInfo(SchemaKind.AVRO, AVRO.schema_data, (("k", "v"),), "readings")
    assert schema_info(Schema(name="", schema_data=b"", type=SchemaType.BOOL)).kind is (
        SchemaKind.BOOLEAN
    )
    assert not schema_info(Schema(name="", schema_data=b"", type=SchemaType.NONE)).kind.registered
    assert not schema_info(
        Schema(name="", schema_data=b"", type=SchemaType.AUTO_CONSUME)
    ).kind.registered
