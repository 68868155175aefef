"""A throwaway PKI for benchmarks that run the data plane over TLS: a CA and a server
certificate for this node's addresses, written as PEM files the ``RAYTOPICS_TLS_*``
settings can name. Needs the ``cryptography`` package (the project's test extra), so
a benchmark imports this module only when it is asked for TLS."""

from __future__ import annotations

import datetime
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

Issuer = tuple[x509.Certificate, ec.EllipticCurvePrivateKey]


@dataclass(frozen=True)
class TlsFiles:
    """The files an operator would provide: the servers' chain and key, the clients' CA."""

    cert: str
    key: str
    ca: str


def make_pki(directory: Path, addresses: tuple[str, ...]) -> TlsFiles:
    """A CA and a certificate it signed for ``addresses`` (IPs: clients check the
    segment's host, which is its node's IP), in ``directory``. P-256 keys, as a
    deployment would likely use, so the handshake costs what it would there."""
    directory.mkdir(parents=True, exist_ok=True)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca = _certificate("raytopics bench CA", ca_key, None, ())
    server_key = ec.generate_private_key(ec.SECP256R1())
    server = _certificate("raytopics segments", server_key, (ca, ca_key), addresses)
    key_pem = server_key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    return TlsFiles(
        cert=_write(directory / "server.pem", server.public_bytes(serialization.Encoding.PEM)),
        key=_write(directory / "server.key", key_pem),
        ca=_write(directory / "ca.pem", ca.public_bytes(serialization.Encoding.PEM)),
    )


def _certificate(
    subject: str,
    key: ec.EllipticCurvePrivateKey,
    issuer: Issuer | None,
    addresses: tuple[str, ...],
) -> x509.Certificate:
    """A one-day certificate of ``subject`` for ``key``, self-signed without an issuer."""
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)])
    now = datetime.datetime.now(datetime.UTC)
    builder = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(issuer[0].subject if issuer else name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=issuer is None, path_length=None), critical=True)
    )
    if addresses:
        sans = [x509.IPAddress(ipaddress.ip_address(a)) for a in addresses]
        builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
    return builder.sign(issuer[1] if issuer else key, hashes.SHA256())


def _write(path: Path, pem: bytes) -> str:
    path.write_bytes(pem)
    path.chmod(0o600)
    return str(path)
