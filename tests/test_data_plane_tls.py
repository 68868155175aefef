"""The data plane over TLS: certificates made here, segments given them as their settings.

A segment whose settings name a certificate and key (``RAYTOPICS_TLS_CERT`` /
``_KEY``) speaks only TLS on its data plane; a client verifies it against
``RAYTOPICS_TLS_CA``, host name (the node's IP) included. Producers and
consumers work across it; a plaintext client, a client that does not trust the
CA, and a certificate issued for another address are refused, and nothing they
send is stored.
"""

from __future__ import annotations

import asyncio
import datetime
import ipaddress
import os
import socket
import ssl
from collections.abc import Iterator
from pathlib import Path

import pytest
import ray
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from clients import Producer, ScalableTopicsAdmin, StreamConsumer
from clients._data_plane import ReadChannel, SegmentChannel
from runtime import tls, wire
from runtime.batch import make_batch, serialize_batch
from runtime.errors import TlsError
from runtime.names import TopicName
from storage.catalog import Catalog
from tests.segments import segment_actor

# --- a small PKI ------------------------------------------------------------------------


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _certificate(
    subject: str,
    key: ec.EllipticCurvePrivateKey,
    issuer: tuple[x509.Certificate, ec.EllipticCurvePrivateKey] | None,
    addresses: tuple[str, ...] = (),
) -> x509.Certificate:
    now = datetime.datetime.now(datetime.UTC)
    builder = (
        x509.CertificateBuilder()
        .subject_name(_name(subject))
        .issuer_name(issuer[0].subject if issuer else _name(subject))
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


def _write(path: Path, *items: x509.Certificate | ec.EllipticCurvePrivateKey) -> str:
    pem = b""
    for item in items:
        if isinstance(item, x509.Certificate):
            pem += item.public_bytes(serialization.Encoding.PEM)
        else:
            pem += item.private_bytes(
                serialization.Encoding.PEM,
                serialization.PrivateFormat.PKCS8,
                serialization.NoEncryption(),
            )
    path.write_bytes(pem)
    return str(path)


@pytest.fixture(scope="module")
def pki(tmp_path_factory, ray_cluster) -> dict[str, str]:
    """A CA and a server certificate for this node's IP; a second CA nobody trusts; a
    certificate of the right CA for an address that is not the node's."""
    directory = tmp_path_factory.mktemp("pki")
    node_ip = ray.util.get_node_ip_address()
    ca_key, rogue_key = (
        ec.generate_private_key(ec.SECP256R1()),
        ec.generate_private_key(ec.SECP256R1()),
    )
    ca = _certificate("raytopics test CA", ca_key, None)
    rogue = _certificate("someone else's CA", rogue_key, None)
    server_key = ec.generate_private_key(ec.SECP256R1())
    server = _certificate("segments", server_key, (ca, ca_key), (node_ip, "127.0.0.1"))
    elsewhere = _certificate("elsewhere", server_key, (ca, ca_key), ("198.51.100.7",))
    return {
        "ca": _write(directory / "ca.pem", ca),
        "rogue_ca": _write(directory / "rogue.pem", rogue),
        "cert": _write(directory / "server.pem", server),
        "key": _write(directory / "server.key", server_key),
        "elsewhere_cert": _write(directory / "elsewhere.pem", elsewhere),
    }


def _topic(monkeypatch: pytest.MonkeyPatch, unique: str, cert: str | None, key: str | None) -> str:
    """A topic whose controller, and so its segments, start with these TLS settings."""
    for name, value in ((tls.CERT_ENV, cert), (tls.KEY_ENV, key)):
        if value is None:
            monkeypatch.delenv(name, raising=False)
        else:
            monkeypatch.setenv(name, value)
    topic = f"topic://tls/ns/t-{unique}"
    admin = ScalableTopicsAdmin()
    admin.create_scalable_topic(topic, 1)
    admin.create_subscription(topic, "s")
    monkeypatch.delenv(tls.CERT_ENV, raising=False)  # the test process is a client only
    monkeypatch.delenv(tls.KEY_ENV, raising=False)
    return topic


@pytest.fixture
def tls_topic(pki, unique) -> Iterator[str]:
    with pytest.MonkeyPatch.context() as monkeypatch:
        topic = _topic(monkeypatch, unique, pki["cert"], pki["key"])
    yield topic
    ScalableTopicsAdmin().delete_scalable_topic(topic)


def _segment(topic: str):
    name = TopicName.parse(topic)
    (info,) = Catalog().require_topic(name).layout.all_segments.values()
    return segment_actor(name.segment(info.segment_id, info.hash_range.start, info.hash_range.end))


def _end(topic: str) -> int:
    return ray.get(_segment(topic).position.remote())["endOffset"]


def _append(segment, payload: bytes = b"x") -> tuple[int, int]:
    async def scenario() -> tuple[int, int]:
        channel = SegmentChannel(segment, reconnect_attempts=1)
        try:
            batch = serialize_batch(make_batch([payload]))
            return await asyncio.wait_for(channel.append(None, None, batch), 30)
        finally:
            await channel.close()

    return asyncio.run(scenario())


def test_producers_and_consumers_work_over_tls(tls_topic, pki, monkeypatch) -> None:
    monkeypatch.setenv(tls.CA_ENV, pki["ca"])
    segment = _segment(tls_topic)
    assert ray.get(segment.data_endpoint.remote()).tls
    with Producer(tls_topic) as producer:
        producer.send_batch([str(i).encode() for i in range(2_000)], ["k"] * 2_000).result(60)
    consumer = StreamConsumer(tls_topic, "s", "c")
    received: list[bytes] = []
    while len(received) < 2_000 and (batch := consumer.receive_batch(1_000, timeout=30)):
        received += [m.value for m in batch]
        consumer.acknowledge_cumulative(batch)
    consumer.close()
    assert received == [str(i).encode() for i in range(2_000)]


def test_a_plaintext_client_is_refused(tls_topic, pki, monkeypatch) -> None:
    segment = _segment(tls_topic)
    endpoint = ray.get(segment.data_endpoint.remote())
    frames = wire.encode_hello(None, wire.PRODUCE) + wire.encode_append(
        None, None, serialize_batch(make_batch([b"plaintext"]))
    )
    with socket.create_connection((endpoint.host, endpoint.port), timeout=30) as sock:
        sock.sendall(frames)
        answer = b""
        try:
            while chunk := sock.recv(4096):
                answer += chunk
        except ConnectionError:
            pass
    alert = 0x15  # a TLS alert record, at most: no frame of ours
    assert answer == b"" or answer[0] == alert, answer[:40]
    monkeypatch.delenv(tls.CA_ENV, raising=False)
    with pytest.raises(TlsError, match="speaks TLS"):
        _append(segment)
    assert _end(tls_topic) == 0


def test_a_client_that_does_not_trust_the_ca_is_refused(tls_topic, pki, monkeypatch) -> None:
    monkeypatch.setenv(tls.CA_ENV, pki["rogue_ca"])
    segment = _segment(tls_topic)
    with pytest.raises(TlsError, match="not trusted"):
        _append(segment)

    async def read() -> None:
        channel = ReadChannel(segment)
        try:
            await channel.read(wire.ReadRequest(0, 10, 0.0, "s", None))
        finally:
            channel.close()

    with pytest.raises(TlsError, match="not trusted"):
        asyncio.run(read())
    with Producer(tls_topic) as producer, pytest.raises(TlsError):
        producer.send(b"x", key="k").result(timeout=60)
    context = ssl.create_default_context(cafile=pki["rogue_ca"])
    endpoint = ray.get(segment.data_endpoint.remote())
    address = (endpoint.host, endpoint.port)
    with pytest.raises(ssl.SSLCertVerificationError), socket.create_connection(address) as raw:
        context.wrap_socket(raw, server_hostname=endpoint.host)
    assert _end(tls_topic) == 0


def test_a_certificate_for_another_address_is_refused(pki, unique, monkeypatch) -> None:
    topic = _topic(monkeypatch, unique, pki["elsewhere_cert"], pki["key"])
    try:
        monkeypatch.setenv(tls.CA_ENV, pki["ca"])
        with pytest.raises(TlsError, match="not trusted"):
            _append(_segment(topic))
        assert _end(topic) == 0
    finally:
        ScalableTopicsAdmin().delete_scalable_topic(topic)


def test_a_client_that_expects_tls_refuses_a_plaintext_segment(pki, unique, monkeypatch) -> None:
    topic = _topic(monkeypatch, unique, None, None)
    try:
        monkeypatch.setenv(tls.CA_ENV, pki["ca"])
        with pytest.raises(TlsError, match="does not speak TLS"):
            _append(_segment(topic))
        monkeypatch.delenv(tls.CA_ENV)
        assert _append(_segment(topic)) == (0, 1)
    finally:
        ScalableTopicsAdmin().delete_scalable_topic(topic)


def test_a_ca_replaced_in_place_is_used_from_the_next_connection(
    tls_topic, pki, tmp_path, monkeypatch
) -> None:
    """A client process keeps its TLS context per CA file, yet an operator who replaces
    that file (rotating the CA) is obeyed without restarting the client."""
    ca = tmp_path / "ca.pem"
    ca.write_bytes(Path(pki["rogue_ca"]).read_bytes())
    monkeypatch.setenv(tls.CA_ENV, str(ca))
    segment = _segment(tls_topic)
    with pytest.raises(TlsError, match="not trusted"):
        _append(segment)
    ca.write_bytes(Path(pki["ca"]).read_bytes())
    stat = ca.stat()
    os.utime(ca, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000))  # a coarse clock
    assert _append(segment) == (0, 1)
