"""TLS and mutual TLS listeners, with certificates from mop.testing."""

from __future__ import annotations

import logging
import ssl
from pathlib import Path

import pytest
import trio

from mop.security.identity import certificate_identity
from mop.testing import TestCertificates
from mop.transport import ListenerSpec, server_ssl_context

from .servers import Recorder, exchange, running


def tls_spec(context: ssl.SSLContext, *, handshake_timeout: float = 10.0) -> ListenerSpec:
    return ListenerSpec(
        name="mqtts",
        kind="tls",
        host="127.0.0.1",
        port=0,
        ssl_context=context,
        handshake_timeout=handshake_timeout,
    )


def context_for(certificates: TestCertificates, **options: bool) -> ssl.SSLContext:
    return server_ssl_context(
        certfile=str(certificates.server_cert),
        keyfile=str(certificates.server_key),
        cafile=str(certificates.ca_cert),
        **options,
    )


async def test_tls_echo(certificates: TestCertificates) -> None:
    recorder = Recorder()
    async with running([tls_spec(context_for(certificates))], recorder) as bound:
        client = await trio.open_ssl_over_tcp_stream(
            "127.0.0.1",
            bound[0].port,
            ssl_context=certificates.client_ssl_context(with_certificate=False),
        )
        async with client:
            assert await exchange(client, b"over tls") == b"over tls"
            assert client.version() in {"TLSv1.2", "TLSv1.3"}
    [info] = recorder.infos
    assert info.transport == "tls"
    assert info.peer_certificate is None


async def test_mtls_reports_the_client_certificate(certificates: TestCertificates) -> None:
    recorder = Recorder()
    context = context_for(certificates, require_client_cert=True)
    async with running([tls_spec(context)], recorder) as bound:
        client = await trio.open_ssl_over_tcp_stream(
            "127.0.0.1", bound[0].port, ssl_context=certificates.client_ssl_context()
        )
        async with client:
            assert await exchange(client, b"who am i") == b"who am i"
    [info] = recorder.infos
    assert info.peer_certificate is not None
    identity = certificate_identity(info.peer_certificate)
    assert identity is not None and identity.common_name == "client-1"


async def test_mtls_rejects_a_client_without_certificate(
    certificates: TestCertificates, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="mop.transport")
    recorder = Recorder()
    context = context_for(certificates, require_client_cert=True)
    async with running([tls_spec(context)], recorder) as bound:
        client = await trio.open_ssl_over_tcp_stream(
            "127.0.0.1",
            bound[0].port,
            ssl_context=certificates.client_ssl_context(with_certificate=False),
        )
        # With TLS 1.3 the client learns of the refusal only when it next reads.
        with pytest.raises(trio.BrokenResourceError):
            await client.send_all(b"let me in")
            await client.receive_some()
        await trio.aclose_forcefully(client)
        # The listener is still serving clients that do present a certificate.
        good = await trio.open_ssl_over_tcp_stream(
            "127.0.0.1", bound[0].port, ssl_context=certificates.client_ssl_context()
        )
        async with good:
            assert await exchange(good, b"ok") == b"ok"
    assert len(recorder.infos) == 1
    assert any("handshake" in r.getMessage() for r in caplog.records)


async def test_client_certificate_is_optional_without_require(
    certificates: TestCertificates,
) -> None:
    recorder = Recorder()
    async with running([tls_spec(context_for(certificates))], recorder) as bound:
        for with_certificate in (False, True):
            client = await trio.open_ssl_over_tcp_stream(
                "127.0.0.1",
                bound[0].port,
                ssl_context=certificates.client_ssl_context(with_certificate=with_certificate),
            )
            async with client:
                assert await exchange(client, b"x") == b"x"
    assert recorder.infos[0].peer_certificate is None
    assert recorder.infos[1].peer_certificate is not None


async def test_plaintext_and_silent_clients_do_not_hurt_the_listener(
    certificates: TestCertificates, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="mop.transport")
    spec = tls_spec(context_for(certificates), handshake_timeout=0.5)
    async with running([spec], Recorder()) as bound:
        port = bound[0].port
        async with (
            await trio.open_tcp_stream("127.0.0.1", port) as silent,
            await trio.open_tcp_stream("127.0.0.1", port) as plaintext,
        ):
            await plaintext.send_all(b"\x10\x0c\x00\x04MQTT\x04\x02\x00\x3c\x00\x00")
            with trio.fail_after(5):
                # Garbage fails the handshake at once (an alert, then EOF).
                while await plaintext.receive_some():
                    pass
            client = await trio.open_ssl_over_tcp_stream(
                "127.0.0.1",
                port,
                ssl_context=certificates.client_ssl_context(with_certificate=False),
            )
            async with client:
                assert await exchange(client, b"served") == b"served"
            with trio.fail_after(5):
                assert await silent.receive_some() == b""
    messages = [r.getMessage() for r in caplog.records]
    assert any("handshake with" in m and "failed" in m for m in messages)
    assert any("handshake not finished within 0.5 s" in m for m in messages)


def test_missing_files_are_named(certificates: TestCertificates, tmp_path: Path) -> None:
    missing = str(tmp_path / "nope.pem")
    with pytest.raises(FileNotFoundError, match=r"certfile .*nope\.pem"):
        server_ssl_context(certfile=missing, keyfile=str(certificates.server_key))
    with pytest.raises(FileNotFoundError, match=r"keyfile .*nope\.pem"):
        server_ssl_context(certfile=str(certificates.server_cert), keyfile=missing)
    with pytest.raises(FileNotFoundError, match=r"cafile .*nope\.pem"):
        server_ssl_context(
            certfile=str(certificates.server_cert),
            keyfile=str(certificates.server_key),
            cafile=missing,
        )


def test_mismatched_key_is_reported(certificates: TestCertificates) -> None:
    with pytest.raises(ssl.SSLError, match="cannot load the certificate"):
        server_ssl_context(
            certfile=str(certificates.server_cert), keyfile=str(certificates.client_key)
        )


def test_requiring_client_certificates_needs_a_ca(certificates: TestCertificates) -> None:
    with pytest.raises(ValueError, match="needs a cafile"):
        server_ssl_context(
            certfile=str(certificates.server_cert),
            keyfile=str(certificates.server_key),
            require_client_cert=True,
        )


def test_context_defaults(certificates: TestCertificates) -> None:
    context = context_for(certificates)
    assert context.minimum_version == ssl.TLSVersion.TLSv1_2
    assert context.verify_mode == ssl.CERT_OPTIONAL
    assert context_for(certificates, require_client_cert=True).verify_mode == ssl.CERT_REQUIRED
    plain = server_ssl_context(
        certfile=str(certificates.server_cert), keyfile=str(certificates.server_key)
    )
    assert plain.verify_mode == ssl.CERT_NONE


def test_generated_certificates(certificates: TestCertificates) -> None:
    from cryptography import x509

    server = x509.load_pem_x509_certificate(certificates.server_cert.read_bytes())
    names = server.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert names.get_values_for_type(x509.DNSName) == ["localhost"]
    assert [str(ip) for ip in names.get_values_for_type(x509.IPAddress)] == ["127.0.0.1"]
    assert certificates.client_key.stat().st_mode & 0o077 == 0
