"""The REST gateway over HTTPS: a real ``raytopics serve`` process with a certificate
made for this test (IP SAN 127.0.0.1), real clients that trust its CA or do not.

A client that trusts the CA talks to it as over plain HTTP; plain HTTP to the
TLS port, a client that does not trust the CA, and a host name the certificate
does not name are all refused, before any request reaches the admin service.
"""

from __future__ import annotations

import json
import signal
import ssl
import subprocess
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
import ray

from clients import AdminHttpClient, ScalableTopicsAdmin
from runtime.errors import InvalidArgumentError, TopicNotFoundError, UnavailableError
from tests.auth_support import client_env, make_ca, make_server_cert
from tests.test_cli import RAYTOPICS, assert_one_error_line
from tests.test_gateway import free_port

NAMESPACE = "tls/ns"


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    directory = tmp_path_factory.mktemp("pki")
    ca = make_ca(directory, "raytopics-test-ca")
    cert, key = make_server_cert(directory, ca, ips=("127.0.0.1",), names=())
    stranger = make_ca(directory, "some-other-ca")
    return {"ca": str(ca[0]), "cert": str(cert), "key": str(key), "other_ca": str(stranger[0])}


@pytest.fixture(scope="module")
def https(ray_cluster, pki: dict[str, str]) -> Iterator[str]:
    """``raytopics serve`` with the certificate and key; its base URL."""
    ScalableTopicsAdmin()  # the admin service runs with the session's settings, not serve's
    port = free_port()
    env = client_env(RAYTOPICS_TLS_CERT=pki["cert"], RAYTOPICS_TLS_KEY=pki["key"])
    serve = subprocess.Popen(
        [RAYTOPICS, "serve", "--port", str(port)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        banner = serve.stdout.readline()
        url = f"https://127.0.0.1:{port}"
        assert url in banner, (banner, serve.stderr.read() if serve.poll() is not None else "")
        yield url
    finally:
        serve.send_signal(signal.SIGTERM)
        out, err = serve.communicate(timeout=60)
    assert serve.returncode == 0 and "stopped" in out, err


def test_the_api_works_over_tls_for_a_client_that_trusts_the_ca(
    https: str, pki: dict[str, str], unique: str, monkeypatch
) -> None:
    topic = f"topic://{NAMESPACE}/t-{unique}"
    with AdminHttpClient(https, ca=pki["ca"]) as client:
        meta = client.create_scalable_topic(topic, 2)
        assert client.get_metadata(topic) == meta and len(meta["segments"]) == 2
        assert topic in client.list_scalable_topics(NAMESPACE)
    monkeypatch.setenv("RAYTOPICS_TLS_CA", pki["ca"])  # the operator's setting does the same
    with AdminHttpClient(https) as client:
        client.delete_scalable_topic(topic)
        with pytest.raises(TopicNotFoundError):
            client.get_metadata(topic)

    context = ssl.create_default_context(cafile=pki["ca"])
    with urllib.request.urlopen(f"{https}/healthz", context=context, timeout=30) as response:
        assert json.loads(response.read())["status"] == "ok"
    env = client_env()
    listed = subprocess.run(
        [RAYTOPICS, "--url", https, "--ca", pki["ca"], "list", NAMESPACE],
        env=env, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert listed.returncode == 0 and topic not in listed.stdout, listed.stderr


def test_plain_http_to_the_tls_port_is_refused(https: str, kv_snapshot) -> None:
    plain = https.replace("https://", "http://")
    before = kv_snapshot()
    with AdminHttpClient(plain, timeout_s=10) as client, pytest.raises(UnavailableError):
        client.create_scalable_topic(f"topic://{NAMESPACE}/plain", 1)
    request = urllib.request.Request(
        f"{plain}/admin/v2/scalable/{NAMESPACE}/plain", data=b'{"numSegments": 1}', method="PUT"
    )
    with pytest.raises((urllib.error.URLError, ConnectionError)):
        urllib.request.urlopen(request, timeout=10)
    assert kv_snapshot() == before


def test_a_client_that_does_not_trust_the_certificate_is_refused(
    https: str, pki: dict[str, str], kv_snapshot
) -> None:
    before = kv_snapshot()
    refusals = (
        AdminHttpClient(https, timeout_s=10),  # the system's trust store: no such CA
        AdminHttpClient(https, timeout_s=10, ca=pki["other_ca"]),
        # the right CA, but a name the certificate does not carry
        AdminHttpClient(https.replace("127.0.0.1", "localhost"), timeout_s=10, ca=pki["ca"]),
    )
    for client in refusals:
        with client, pytest.raises(UnavailableError, match="not trusted"):
            client.create_scalable_topic(f"topic://{NAMESPACE}/untrusted", 1)
    assert kv_snapshot() == before

    env = client_env()
    proc = subprocess.run(
        [RAYTOPICS, "--url", https, "list", NAMESPACE],
        env=env, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert proc.returncode == 1, proc
    assert_one_error_line(proc.stderr, "not trusted", "RAYTOPICS_TLS_CA")


def test_a_configured_ca_never_sends_the_token_in_the_clear(pki: dict[str, str]) -> None:
    with pytest.raises(InvalidArgumentError, match="https://"):
        AdminHttpClient("http://127.0.0.1:1", ca=pki["ca"], token="a-token-0123456789abcdef")
    with pytest.raises(InvalidArgumentError, match="no such file"):
        AdminHttpClient("https://127.0.0.1:1", ca=str(Path(pki["ca"]).with_name("absent.pem")))


def test_half_configured_tls_fails_the_start(ray_cluster, pki: dict[str, str]) -> None:
    port = free_port()
    env = client_env(RAYTOPICS_TLS_CERT=pki["cert"])  # no key
    proc = subprocess.run(
        [RAYTOPICS, "serve", "--port", str(port)],
        env=env, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert proc.returncode == 1, proc
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and "RAYTOPICS_TLS_KEY" in errors[0], proc.stderr
    with pytest.raises(ValueError):
        ray.get_actor(f"gateway:{port}", namespace=ray.get_runtime_context().namespace)
