"""What the authentication tests share: client processes with no policy of their own,
turning the cluster's policy off again, and test certificates.

The whole test session shares one cluster, so a test that loads a policy must
leave authentication off behind it, and long enough for every process's copy
of the policy (``actors.guard.REFRESH_S``) to have expired, or the next test
would be refused. ``policy_removed`` does that with raw access to the catalog,
as an operator with access to Ray can, whatever state the test left.
"""

from __future__ import annotations

import contextlib
import datetime
import ipaddress
import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import ray

CLIENT_SECRETS = ("RAYTOPICS_AUTH_TOKENS_FILE", "RAYTOPICS_TOKEN", "RAYTOPICS_TLS_CA")


def client_env(**extra: str) -> dict[str, str]:
    """The environment of a client process joining this session's cluster: no policy
    file, no token and no CA of its own (``extra`` adds some back on purpose)."""
    context = ray.get_runtime_context()
    env = {k: v for k, v in os.environ.items() if k not in CLIENT_SECRETS}
    env.update(
        RAY_ADDRESS=context.gcs_address,
        RAYTOPICS_NAMESPACE=context.namespace,
        RAYTOPICS_STORAGE_ROOT=os.environ["RAYTOPICS_STORAGE_ROOT"],
        RAY_AUTH_MODE=os.environ.get("RAY_AUTH_MODE", "disabled"),
    )
    env.update(extra)
    return env


def turn_auth_off() -> None:
    """Remove the cluster's policy and wait until no process still applies a copy."""
    from actors.guard import REFRESH_S
    from storage.catalog import Catalog

    Catalog().disable_auth()
    time.sleep(REFRESH_S + 0.5)


@contextlib.contextmanager
def policy_removed() -> Iterator[None]:
    """Authentication is off after the block, however it ended."""
    try:
        yield
    finally:
        turn_auth_off()


def wait_until(check: Callable[[], Any], timeout_s: float, step_s: float = 0.1) -> float:
    """Seconds until ``check()`` is truthy; ``AssertionError`` after ``timeout_s``."""
    started = time.monotonic()
    while not check():
        if time.monotonic() - started > timeout_s:
            raise AssertionError(f"{check} still false after {timeout_s}s")
        time.sleep(step_s)
    return time.monotonic() - started


# --- test certificates ---------------------------------------------------------------------


def make_ca(directory: Path, name: str) -> tuple[Path, Any, Any]:
    """A self-signed CA: its PEM file, certificate and key."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                key_cert_sign=True,
                crl_sign=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )  # fmt: skip
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), False)
        .sign(key, hashes.SHA256())
    )
    path = directory / f"{name}.pem"
    path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    return path, cert, key


def make_server_cert(
    directory: Path, ca: tuple[Path, Any, Any], *, ips: tuple[str, ...], names: tuple[str, ...]
) -> tuple[Path, Path]:
    """A server certificate signed by ``ca`` for ``ips`` and DNS ``names``: (cert, key)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    _, ca_cert, ca_key = ca
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    alternative = [x509.IPAddress(ipaddress.ip_address(ip)) for ip in ips]
    alternative += [x509.DNSName(name) for name in names]
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "raytopics-gateway")]))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.SubjectAlternativeName(alternative), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), False
        )
        .sign(ca_key, hashes.SHA256())
    )
    cert_path, key_path = directory / "server.pem", directory / "server-key.pem"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return cert_path, key_path
