"""gRPC over TLS (ALPN "h2") and mutual TLS, with certificates of a test CA: the node's TLS
listener, and the client certificate a method handler sees."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from cryptography import x509
from grpc_health.v1 import health_pb2, health_pb2_grpc

from mop.protocols.grpc.serving.calls import Call
from mop.settings import TlsSettings
from mop.testing import TestCertificates, make_test_certificates
from mop.testing.node import running_node
from mop.transport import server_ssl_context
from tests.e2e.grpc.server_support import grpc_node_settings, serving, unary

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def certificates(tmp_path_factory: pytest.TempPathFactory) -> TestCertificates:
    directory: Path = tmp_path_factory.mktemp("grpc-certs")
    return make_test_certificates(directory)


def credentials(
    certificates: TestCertificates, *, with_certificate: bool
) -> grpc.ChannelCredentials:
    if not with_certificate:
        return grpc.ssl_channel_credentials(root_certificates=certificates.ca_cert.read_bytes())
    return grpc.ssl_channel_credentials(
        root_certificates=certificates.ca_cert.read_bytes(),
        private_key=certificates.client_key.read_bytes(),
        certificate_chain=certificates.client_cert.read_bytes(),
    )


def _check(channel: grpc.Channel) -> int:
    stub = health_pb2_grpc.HealthStub(channel)
    status: int = stub.Check(health_pb2.HealthCheckRequest(), timeout=5).status
    return status


def test_a_node_serves_grpc_over_tls_beside_plain(certificates: TestCertificates) -> None:
    tls = TlsSettings(certfile=str(certificates.server_cert), keyfile=str(certificates.server_key))
    with running_node(grpc_node_settings(tls=tls)) as node:
        _, tls_port = node.node.address("grpc", "tls")
        _, plain_port = node.node.address("grpc", "tcp")
        secure = grpc.secure_channel(
            f"localhost:{tls_port}", credentials(certificates, with_certificate=False)
        )
        with secure:
            assert _check(secure) == health_pb2.HealthCheckResponse.SERVING
        with grpc.insecure_channel(f"127.0.0.1:{plain_port}") as plain:
            assert _check(plain) == health_pb2.HealthCheckResponse.SERVING
        protocols = node.node.protocols["grpc"].advertised_data()
        assert set(protocols) == {"grpc", "grpc+tls"}


def test_an_mtls_node_refuses_a_client_without_a_certificate(
    certificates: TestCertificates,
) -> None:
    tls = TlsSettings(
        certfile=str(certificates.server_cert),
        keyfile=str(certificates.server_key),
        cafile=str(certificates.ca_cert),
        require_client_cert=True,
    )
    with running_node(grpc_node_settings(tls=tls)) as node:
        _, port = node.node.address("grpc", "tls")
        with grpc.secure_channel(
            f"localhost:{port}", credentials(certificates, with_certificate=True)
        ) as channel:
            assert _check(channel) == health_pb2.HealthCheckResponse.SERVING
        with (
            grpc.secure_channel(
                f"localhost:{port}", credentials(certificates, with_certificate=False)
            ) as channel,
            pytest.raises(grpc.RpcError) as refused,
        ):
            _check(channel)
        assert refused.value.code() == grpc.StatusCode.UNAVAILABLE


@pytest.fixture
def mtls_server(certificates: TestCertificates) -> Iterator[int]:
    async def whoami(call: Call) -> None:
        await call.receive()
        der = call.peer_certificate
        name = b"none"
        if der is not None:
            subject = x509.load_der_x509_certificate(der).subject
            name = subject.rfc4514_string().encode()
        await call.send(name)

    context = server_ssl_context(
        certfile=str(certificates.server_cert),
        keyfile=str(certificates.server_key),
        cafile=str(certificates.ca_cert),
    )
    context.set_alpn_protocols(["h2"])
    with serving({"/test.Tls/whoami": whoami}, ssl_context=context) as server:
        yield server.port


def test_a_handler_sees_the_client_certificate(
    certificates: TestCertificates, mtls_server: int
) -> None:
    with grpc.secure_channel(
        f"localhost:{mtls_server}", credentials(certificates, with_certificate=True)
    ) as channel:
        assert unary(channel, "/test.Tls/whoami")(b"", timeout=5) == b"CN=client-1"
    with grpc.secure_channel(
        f"localhost:{mtls_server}", credentials(certificates, with_certificate=False)
    ) as channel:
        assert unary(channel, "/test.Tls/whoami")(b"", timeout=5) == b"none"


def test_the_tls_listener_negotiates_h2(certificates: TestCertificates) -> None:
    tls = TlsSettings(certfile=str(certificates.server_cert), keyfile=str(certificates.server_key))
    with running_node(grpc_node_settings(tls=tls)) as node:
        _, port = node.node.address("grpc", "tls")
        context = certificates.client_ssl_context(with_certificate=False)
        context.set_alpn_protocols(["h2", "http/1.1"])
        with (
            socket.create_connection(("127.0.0.1", port), timeout=5) as raw,
            context.wrap_socket(raw, server_hostname="localhost") as wrapped,
        ):
            assert wrapped.selected_alpn_protocol() == "h2"
