"""TLS for the segments' data plane and the REST gateway, when the operator asks for it.

The operator provides a certificate and its key for the servers and the CA that
signed it for the clients, as files named by three settings:

=========================  ====================================================
``RAYTOPICS_TLS_CERT``     the servers' certificate chain (PEM)
``RAYTOPICS_TLS_KEY``      its private key (PEM)
``RAYTOPICS_TLS_CA``       the CA clients verify the servers against (PEM)
=========================  ====================================================

Servers speak TLS when a certificate and key are set, plaintext otherwise;
clients use TLS, and verify the server's certificate and host name, when a CA is
set. A half-configured side (a certificate without its key) is an error, not a
silent fall back to plaintext.
"""

from __future__ import annotations

import os
import ssl
from pathlib import Path

from runtime.errors import InvalidArgumentError

CERT_ENV = "RAYTOPICS_TLS_CERT"
KEY_ENV = "RAYTOPICS_TLS_KEY"
CA_ENV = "RAYTOPICS_TLS_CA"
TLS_ENV_VARS = (CERT_ENV, KEY_ENV, CA_ENV)


def server_context() -> ssl.SSLContext | None:
    """The servers' context (TLS 1.2 or newer), or ``None`` for plaintext."""
    cert, key = _path(CERT_ENV), _path(KEY_ENV)
    if cert is None and key is None:
        return None
    if cert is None or key is None:
        raise InvalidArgumentError(
            f"TLS needs both {CERT_ENV} and {KEY_ENV}; only {CERT_ENV if cert else KEY_ENV} is set"
        )
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        context.load_cert_chain(cert, key)
    except (OSError, ssl.SSLError) as err:
        raise InvalidArgumentError(
            f"cannot load the TLS certificate {cert} / key {key}: {err}"
        ) from None
    return context


def client_context(ca: str | None = None) -> ssl.SSLContext | None:
    """The clients' context, verifying servers (and their host names) against ``ca``,
    else the operator's ``RAYTOPICS_TLS_CA``; ``None`` when neither is given."""
    if ca is not None and not Path(ca).is_file():
        raise InvalidArgumentError(f"TLS CA {ca}: no such file")
    ca = ca or _path(CA_ENV)
    if ca is None:
        return None
    context = ssl.create_default_context(ssl.Purpose.SERVER_AUTH)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        context.load_verify_locations(cafile=ca)
    except (OSError, ssl.SSLError) as err:
        raise InvalidArgumentError(f"cannot load the TLS CA {ca}: {err}") from None
    return context


def _path(name: str) -> str | None:
    value = os.environ.get(name) or None
    if value is not None and not Path(value).is_file():
        raise InvalidArgumentError(f"{name}={value}: no such file")
    return value
