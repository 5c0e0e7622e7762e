"""Option parsing: defaults, the topic selection, positions and the errors users see."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from mop.message import MessageId
from mop.spark.options import (
    DEFAULT_SERVICE_URL,
    ClientSecurity,
    OptionError,
    Selection,
    StartSpec,
    parse_read_options,
    parse_write_options,
)
from mop.spark.positions import EARLIEST

pytestmark = pytest.mark.spark


def test_read_defaults() -> None:
    batch = parse_read_options({"topics": "a/b"}, streaming=False)
    assert batch.service_url == DEFAULT_SERVICE_URL
    assert batch.selection == Selection(names=("a/b",))
    assert batch.starting == StartSpec("earliest")
    assert batch.ending == StartSpec("latest")
    stream = parse_read_options({"topics": "a/b"}, streaming=True)
    assert stream.starting == StartSpec("latest")
    assert stream.max_records_per_trigger is None and stream.subscription is None
    assert stream.max_records_per_partition is None


def test_topics_mix_names_and_filters() -> None:
    options = parse_read_options(
        {"topics": "a/b, sensors/+/t ,persistent://public/default/x,#"}, streaming=False
    )
    assert options.selection == Selection(
        names=("a/b", "persistent://public/default/x"), filters=("sensors/+/t", "#")
    )


def test_topics_as_json_list_keep_commas() -> None:
    options = parse_read_options({"topics": '["a,b", "c/#"]'}, streaming=False)
    assert options.selection == Selection(names=("a,b",), filters=("c/#",))


def test_load_path_names_the_topics() -> None:
    assert parse_read_options({"path": "x/+"}, streaming=True).selection == Selection(
        filters=("x/+",)
    )


def test_starting_offsets_per_topic() -> None:
    options = parse_read_options(
        {"topics": "a", "starting_offsets": '{"a": "0:5", "persistent://t/n/b": "latest"}'},
        streaming=True,
    )
    assert options.starting == StartSpec(
        "earliest",
        (("persistent://public/default/a", MessageId(0, 5)), ("persistent://t/n/b", "latest")),
    )
    assert options.starting.for_topic("persistent://public/default/a") == MessageId(0, 5)
    assert options.starting.for_topic("persistent://t/n/b-partition-1", "persistent://t/n/b") == (
        "latest"
    )
    assert options.starting.for_topic("persistent://public/default/other") == "earliest"


def test_option_names_are_case_insensitive() -> None:
    options = parse_read_options({"TOPICS": "a", "Max_Records_Per_Trigger": "7"}, streaming=True)
    assert options.max_records_per_trigger == 7


@pytest.mark.parametrize(
    ("options", "streaming", "message"),
    [
        ({}, False, "say what to read"),
        ({"topics": "a", "startingOffsets": "x"}, False, "unknown option(s) startingoffsets"),
        ({"topics": "a", "topics_pattern": "persistent://p/n/.*"}, False, "exclude each other"),
        ({"topics_pattern": "sensor-.*"}, False, "must name its namespace"),
        ({"topics_pattern": "persistent://p/n/(["}, False, "not a regular expression"),
        ({"topics": "a/b+"}, False, "'+' is allowed only as a whole level"),
        ({"topics": "a", "starting_offsets": "yesterday"}, False, "must be 'earliest'"),
        ({"topics": "a", "starting_offsets": '{"a": "x"}'}, False, "starting_offsets['a']"),
        ({"topics": "a", "ending_offsets": "earliest"}, False, "cannot be 'earliest'"),
        ({"topics": "a", "ending_offsets": "latest"}, True, "batch reads only"),
        ({"topics": "a", "subscription": "s"}, False, "streaming reads only"),
        ({"topics": "a", "max_records_per_trigger": "0"}, True, "must be > 0"),
        ({"topics": "a", "max_records_per_trigger": "many"}, True, "must be an integer"),
        ({"topics": "a", "service_url": "http://x"}, False, "pulsar://"),
    ],
)
def test_bad_read_options(options: dict[str, str], streaming: bool, message: str) -> None:
    with pytest.raises(OptionError, match=re.escape(message)):
        parse_read_options(options, streaming=streaming)


def test_write_options() -> None:
    options = parse_write_options({"topic": "alerts/x", "checkpointLocation": "/tmp/c"})
    assert options.topic == "persistent://public/default/alerts%2Fx"
    assert parse_write_options({"path": "a"}).topic == "persistent://public/default/a"
    assert parse_write_options({}).topic is None
    with pytest.raises(OptionError, match="unknown option"):
        parse_write_options({"topics": "a"})


def test_start_spec_positions() -> None:
    a, b = "persistent://public/default/a", "persistent://public/default/b"
    spec = StartSpec("latest", ((a, MessageId(0, 3)),))
    last = MessageId(0, 9)
    assert spec.position(a, a, last) == MessageId(0, 3)
    assert spec.position(b, b, last) == last
    # A topic with no message yet starts before its first one, whatever the default.
    assert spec.position(b, b, None) == EARLIEST
    assert StartSpec("earliest").position(b, b, last) == EARLIEST


# --- credentials and TLS ------------------------------------------------------------------------


def test_security_options(tmp_path: Path) -> None:
    ca = tmp_path / "ca.pem"
    ca.write_text("not parsed here")
    token_file = tmp_path / "token"
    token_file.write_text("t")
    read = parse_read_options(
        {
            "topics": "a",
            "auth_token_file": str(token_file),
            "tls_trust_certs_file_path": str(ca),
            "tls_validate_hostname": "False",
        },
        streaming=False,
    )
    assert read.security == ClientSecurity(
        token_file=str(token_file), tls_trust_certs_file_path=str(ca), tls_validate_hostname=False
    )
    assert read.security.method == "token"
    write = parse_write_options({"topic": "a", "auth_username": "u", "auth_password": "p w"})
    assert (write.security.method, write.security.username) == ("basic", "u")
    assert write.security.tls_validate_hostname  # checked unless turned off
    assert parse_read_options({"topics": "a"}, streaming=False).security.method is None


def test_secrets_stay_out_of_reprs() -> None:
    token = parse_read_options({"topics": "a", "auth_token": "tok-123"}, streaming=False)
    basic = parse_write_options({"topic": "a", "auth_username": "u", "auth_password": "pw-456"})
    assert "tok-123" not in repr(token) and "pw-456" not in repr(basic)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"auth_token": "t", "auth_token_file": "/x"}, "auth_token or auth_token_file"),
        ({"auth_token": "t", "auth_username": "u", "auth_password": "p"}, "not both"),
        ({"auth_username": "u"}, "go together"),
        ({"auth_password": "secret-789"}, "go together"),
        ({"auth_username": "a:b", "auth_password": "p"}, "must not contain ':'"),
        ({"auth_token_file": "/no/such/token"}, "auth_token_file: no file"),
        ({"tls_trust_certs_file_path": "/no/such/ca"}, "tls_trust_certs_file_path: no file"),
        ({"tls_validate_hostname": "maybe"}, "true or false"),
    ],
)
def test_bad_security_options(options: dict[str, str], message: str) -> None:
    with pytest.raises(OptionError, match=re.escape(message)) as refused:
        parse_read_options({"topics": "a", **options}, streaming=False)
    assert "secret-789" not in str(refused.value)
