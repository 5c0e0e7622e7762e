"""The data source against a secured node: rows written with a user name and password and read
back with a token, over pulsar+ssl:// with the test CA trusted and host names
checked, topics found by an MQTT filter (the namespace listing authenticates too)."""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jwt
import pulsar
import pytest

from mop.security.passwords import update_password_file
from mop.settings import AuthSettings, JwtSettings, PulsarSettings, TlsSettings
from mop.spark.options import ClientSecurity
from mop.spark.security import link_auth
from mop.testing.certs import make_test_certificates
from mop.testing.node import RunningNode
from tests.e2e.pulsar_support import pulsar_node, pulsar_settings
from tests.spark.support import hold

pytestmark = pytest.mark.spark

SECRET = "a shared secret of thirty-two bytes!"
PASSWORD = "w-secret-8a1f"
ACL = """\
user writer
topic readwrite secure/#

user reader
topic read secure/#
"""


@dataclasses.dataclass(frozen=True)
class Secured:
    node: RunningNode
    url: str  # pulsar+ssl://localhost:{port}
    ca_file: str
    token_file: str  # the reader's token


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Secured]:
    folder = tmp_path_factory.mktemp("secured")
    certs = make_test_certificates(folder / "certs")
    (folder / "passwords").write_text(update_password_file("", "writer", PASSWORD.encode()))
    (folder / "acl").write_text(ACL)
    token = jwt.encode({"sub": "reader", "exp": int(time.time()) + 600}, SECRET, "HS256")
    (folder / "token").write_text(token + "\n")
    settings = dataclasses.replace(
        pulsar_settings(),
        pulsar=PulsarSettings(
            port=0,
            tls_port=0,
            tls=TlsSettings(certfile=str(certs.server_cert), keyfile=str(certs.server_key)),
        ),
        auth=AuthSettings(
            allow_anonymous=False,
            password_file=str(folder / "passwords"),
            acl_file=str(folder / "acl"),
            jwt=JwtSettings(secret=SECRET),
            max_failures=0,
        ),
    )
    with pulsar_node(settings) as node:
        port = node.node.address("pulsar", "tls")[1]
        yield Secured(
            node, f"pulsar+ssl://localhost:{port}", str(certs.ca_cert), str(folder / "token")
        )


def test_write_with_a_password_and_read_with_a_token_over_tls(
    spark: Any, secured: Secured, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    token = Path(secured.token_file).read_text().strip()
    # Subscriptions that keep what is written for the read (a node drops what none holds).
    keeper = pulsar.Client(
        secured.url,
        authentication=pulsar.AuthenticationToken(token),
        tls_trust_certs_file_path=secured.ca_file,
        tls_validate_hostname=True,
        logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error),
    )
    try:
        for name in ("secure/a", "secure/b"):
            hold(keeper, name)
        written_and_read(spark, secured, token, caplog)
    finally:
        keeper.close()


def written_and_read(
    spark: Any, secured: Secured, token: str, caplog: pytest.LogCaptureFixture
) -> None:
    trust = {"tls_trust_certs_file_path": secured.ca_file, "tls_validate_hostname": "true"}
    rows = spark.createDataFrame(
        [("secure/a", "one"), ("secure/b", "two")], "topic STRING, payload STRING"
    ).coalesce(1)
    (
        rows.write.format("mop")
        .option("service_url", secured.url)
        .option("auth_username", "writer")
        .option("auth_password", PASSWORD)
        .options(**trust)
        .mode("append")
        .save()
    )
    read = (
        spark.read.format("mop")
        .option("service_url", secured.url)
        .option("topics", "secure/+")
        .option("auth_token", token)
        .options(**trust)
        .load()
    )
    assert sorted((r.topic, bytes(r.payload)) for r in read.collect()) == [
        ("secure/a", b"one"),
        ("secure/b", b"two"),
    ]
    # mop's own logs (py4j's debug log echoes every call made to the JVM, options included).
    logged = "\n".join(r.getMessage() for r in caplog.records if r.name.startswith("mop"))
    plans = executed_plans(spark) + read._jdf.queryExecution().toString()
    # The plans of this write and read (the password's and the token's), as the SQL tab and
    # explain() show them.
    assert "AppendData mop" in plans and "BatchScan mop" in plans
    for secret in (PASSWORD, token):
        assert secret not in logged
        assert secret not in plans


def executed_plans(spark: Any) -> str:
    """The descriptions and plans of every query the session ran (the write and the read), as
    its SQL tab shows them."""
    executions = spark._jsparkSession.sharedState().statusStore().executionsList()
    return "\n".join(
        f"{e.description()}\n{e.details()}\n{e.physicalPlanDescription()}"
        for e in (executions.apply(i) for i in range(executions.size()))
    )


def test_without_credentials_the_read_is_refused(spark: Any, secured: Secured) -> None:
    read = (
        spark.read.format("mop")
        .option("service_url", secured.url)
        .option("topics", "secure/+")
        .option("tls_trust_certs_file_path", secured.ca_file)
        .option("timeout_ms", "2000")
        .load()
    )
    with pytest.raises(Exception, match=r"AuthenticationError|handshake refused"):
        read.collect()


def test_the_namespace_listing_answers_a_challenge_with_the_token_files_current_token(
    tmp_path: Path,
) -> None:
    path = tmp_path / "token"
    path.write_text("first\n")
    auth = link_auth(ClientSecurity(token_file=str(path)))
    assert auth.current_data() == b"first"
    path.write_text("replaced\n")
    assert auth.current_data() == b"replaced"
