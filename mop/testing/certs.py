"""Throw-away certificates for tests and local trials: a CA, a server certificate for
localhost and a client certificate, written as PEM files.
"""

from __future__ import annotations

import datetime
import ipaddress
import ssl
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

__all__ = ["CLIENT_COMMON_NAME", "TestCertificates", "make_test_certificates"]

CLIENT_COMMON_NAME = "client-1"
_VALIDITY = datetime.timedelta(days=365)
# Tolerate clocks that are a little behind the machine that made the certificates.
_BACKDATE = datetime.timedelta(hours=1)


@dataclass(frozen=True, slots=True)
class TestCertificates:
    """Paths of the PEM files written by :func:`make_test_certificates`."""

    # Not a test class, whatever its name says.
    __test__: ClassVar[bool] = False

    ca_cert: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path

    def client_ssl_context(self, *, with_certificate: bool = True) -> ssl.SSLContext:
        """A client context that trusts the test CA and, by default, presents the client
        certificate (for mTLS listeners)."""
        context = ssl.create_default_context(cafile=str(self.ca_cert))
        if with_certificate:
            context.load_cert_chain(certfile=str(self.client_cert), keyfile=str(self.client_key))
        return context


def make_test_certificates(
    directory: Path, *, hostname: str = "localhost", ip: str = "127.0.0.1"
) -> TestCertificates:
    """Create a CA, a server certificate valid for ``hostname`` and ``ip``, and a client
    certificate with CN "client-1", all signed by the CA, as PEM files in ``directory``."""
    directory.mkdir(parents=True, exist_ok=True)
    now = datetime.datetime.now(datetime.UTC)

    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = _name("mop test CA")
    ca_cert = (
        _builder(ca_name, ca_name, ca_key.public_key(), now)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(_key_usage(cert_sign=True), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), False)
        .sign(ca_key, hashes.SHA256())
    )

    def issue(
        common_name: str, usage: x509.ObjectIdentifier, names: list[x509.GeneralName]
    ) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
        key = ec.generate_private_key(ec.SECP256R1())
        builder = (
            _builder(_name(common_name), ca_name, key.public_key(), now)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(_key_usage(cert_sign=False), critical=True)
            .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), False)
            .add_extension(
                x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), False
            )
        )
        if names:
            builder = builder.add_extension(x509.SubjectAlternativeName(names), critical=False)
        return builder.sign(ca_key, hashes.SHA256()), key

    server_cert, server_key = issue(
        hostname,
        ExtendedKeyUsageOID.SERVER_AUTH,
        [x509.DNSName(hostname), x509.IPAddress(ipaddress.ip_address(ip))],
    )
    client_cert, client_key = issue(CLIENT_COMMON_NAME, ExtendedKeyUsageOID.CLIENT_AUTH, [])

    paths = TestCertificates(
        ca_cert=directory / "ca.pem",
        server_cert=directory / "server.pem",
        server_key=directory / "server.key",
        client_cert=directory / "client.pem",
        client_key=directory / "client.key",
    )
    _write_certificate(paths.ca_cert, ca_cert)
    _write_certificate(paths.server_cert, server_cert)
    _write_key(paths.server_key, server_key)
    _write_certificate(paths.client_cert, client_cert)
    _write_key(paths.client_key, client_key)
    return paths


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _builder(
    subject: x509.Name,
    issuer: x509.Name,
    public_key: ec.EllipticCurvePublicKey,
    now: datetime.datetime,
) -> x509.CertificateBuilder:
    return (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer)
        .public_key(public_key)
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - _BACKDATE)
        .not_valid_after(now + _VALIDITY)
    )


def _key_usage(*, cert_sign: bool) -> x509.KeyUsage:
    return x509.KeyUsage(
        digital_signature=True,
        content_commitment=False,
        key_encipherment=False,
        data_encipherment=False,
        key_agreement=False,
        key_cert_sign=cert_sign,
        crl_sign=cert_sign,
        encipher_only=False,
        decipher_only=False,
    )


def _write_certificate(path: Path, certificate: x509.Certificate) -> None:
    path.write_bytes(certificate.public_bytes(serialization.Encoding.PEM))


def _write_key(path: Path, key: ec.EllipticCurvePrivateKey) -> None:
    pem = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    # Private keys are readable by their owner only, even throw-away ones.
    path.touch(mode=0o600, exist_ok=True)
    path.chmod(0o600)
    path.write_bytes(pem)
