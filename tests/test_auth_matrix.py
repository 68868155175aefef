"""Tokens x tenants x operations, each allowed or refused exactly as configured.

Over real HTTP on loopback (a gateway started with the policy) and through the
Python clients: ``ScalableTopicsAdmin`` reading the operator's token file,
``Producer`` and ``QueueConsumer`` checked by the cluster against the stored
policy. The expected table is written out by hand here, not derived from the
policy code, so the test checks the policy rather than mirrors it.
A refused request must leave every metadata entry byte-for-byte as it was.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from actors.gateway import start_gateway, stop_gateway
from clients import Producer, QueueConsumer, ScalableTopicsAdmin
from runtime.auth import AuthPolicy, hash_token
from runtime.errors import (
    ScalableTopicsError,
    TopicNotFoundError,
    UnauthenticatedError,
    UnauthorizedError,
)
from tests.test_gateway import free_port

TOKENS = {name: f"{name}-secret-token-0123456789" for name in ("ops", "acme", "rw", "ro", "gp")}
CONFIG = {
    "tokens": [
        {"principal": "ops", "token": TOKENS["ops"],
         "grants": [{"namespace": "*", "actions": ["admin"]}]},
        {"principal": "acme", "sha256": hash_token(TOKENS["acme"]),
         "grants": [{"namespace": "acme/*", "actions": ["admin"]}]},
        {"principal": "rw", "token": TOKENS["rw"],
         "grants": [{"namespace": "acme/orders", "actions": ["produce", "consume"]}]},
        {"principal": "ro", "token": TOKENS["ro"],
         "grants": [{"namespace": "acme/orders", "actions": ["lookup"]}]},
        {"principal": "gp", "token": TOKENS["gp"],
         "grants": [{"namespace": "globex/ns", "actions": ["produce"]}]},
    ]
}  # fmt: skip
NAMESPACES = ("acme/orders", "acme/billing", "globex/ns")
ALL = {"lookup", "produce", "consume", "admin"}
EXPECTED: dict[str, dict[str, set[str]]] = {
    "ops": dict.fromkeys(NAMESPACES, ALL),
    "acme": {"acme/orders": ALL, "acme/billing": ALL},
    "rw": {"acme/orders": {"lookup", "produce", "consume"}},
    "ro": {"acme/orders": {"lookup"}},
    "gp": {"globex/ns": {"lookup", "produce"}},
}
CALLERS = [*TOKENS, "none", "bogus"]
SECRET = {**TOKENS, "none": None, "bogus": "bogus-token-not-configured-000"}


def expected(caller: str, namespace: str, permission: str) -> int | None:
    """None when allowed; else the HTTP status of the refusal."""
    if caller in ("none", "bogus"):
        return 401
    return None if permission in EXPECTED[caller].get(namespace, set()) else 403


@pytest.fixture(scope="module")
def policy_file(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("auth") / "tokens.json"
    path.write_text(json.dumps(CONFIG))
    return str(path)


@pytest.fixture(scope="module")
def world(ray_cluster, policy_file: str) -> Iterator[dict[str, Any]]:
    """A gateway with the policy, and one topic with subscription ``q`` per namespace."""
    import uuid

    unique = uuid.uuid4().hex[:6]
    policy = AuthPolicy.from_file(policy_file)
    ops = ScalableTopicsAdmin(token=TOKENS["ops"], auth=policy)
    topics = {ns: f"topic://{ns}/base-{unique}" for ns in NAMESPACES}
    for topic in topics.values():
        ops.create_scalable_topic(topic, 1)
        ops.create_subscription(topic, "q")
    port = free_port()
    yield {"url": start_gateway(port, auth=policy), "topics": topics, "unique": unique}
    stop_gateway(port)
    for ns in NAMESPACES:
        for topic in ops.list_scalable_topics(ns):
            ops.delete_scalable_topic(topic)


def http(url: str, method: str, path: str, token: str | None, body: Any = None) -> int:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url + path, data=data, method=method)
    if token is not None:
        request.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return response.status
    except urllib.error.HTTPError as err:
        payload = json.loads(err.read())
        assert token is None or token not in payload["message"]
        return err.code


# (operation, permission, allowed status, request(ns path, base topic name, caller))
REST_OPS: list[tuple[str, str, int, Callable[[str, str, str], tuple[str, str, Any]]]] = [
    ("list", "lookup", 200, lambda ns, base, c: ("GET", ns, None)),
    ("metadata", "lookup", 200, lambda ns, base, c: ("GET", f"{ns}/{base}", None)),
    ("stats", "lookup", 200, lambda ns, base, c: ("GET", f"{ns}/{base}/stats", None)),
    ("subscribe", "consume", 204, lambda ns, b, c: ("PUT", f"{ns}/{b}/subscriptions/{c}", {})),
    ("create", "admin", 201, lambda ns, base, c: ("PUT", f"{ns}/new-{c}", {"numSegments": 1})),
    ("delete-missing", "admin", 404, lambda ns, base, c: ("DELETE", f"{ns}/never-{c}", None)),
]  # fmt: skip


def test_rest_matrix(world: dict[str, Any], kv_snapshot) -> None:
    refused, allowed = [], []
    for caller in CALLERS:
        for ns in NAMESPACES:
            base = world["topics"][ns].rsplit("/", 1)[1]
            for op, permission, ok_status, build in REST_OPS:
                method, path, body = build(f"/admin/v2/scalable/{ns}", base, caller)
                want = expected(caller, ns, permission) or ok_status
                case = (caller, ns, op, method, path, body, want)
                (allowed if want == ok_status else refused).append(case)
    before = kv_snapshot()
    for caller, ns, op, method, path, body, want in refused:
        got = http(world["url"], method, path, SECRET[caller], body)
        assert got == want, (caller, ns, op, got)
    assert kv_snapshot() == before, "a refused request changed metadata"
    for caller, ns, op, method, path, body, want in allowed:
        got = http(world["url"], method, path, SECRET[caller], body)
        assert got == want, (caller, ns, op, got)
    assert len(refused) + len(allowed) == len(CALLERS) * len(NAMESPACES) * len(REST_OPS)
    assert http(world["url"], "GET", "/healthz", None) == 200  # meta endpoints stay open


def _admin_op(admin: ScalableTopicsAdmin, op: str, ns: str, topic: str, caller: str) -> None:
    if op == "lookup":
        admin.get_metadata(topic)
        admin.list_scalable_topics(ns)
    elif op == "consume":
        admin.create_subscription(topic, f"py-{caller}")
    elif op == "admin":
        with pytest.raises(TopicNotFoundError):
            admin.delete_scalable_topic(f"topic://{ns}/never-{caller}")


def _client_op(op: str, topic: str, token: str | None) -> None:
    if op == "produce":
        with Producer(topic, token=token) as producer:
            producer.send(b"x", key="k").result(timeout=60)
    else:
        QueueConsumer(topic, "q", token=token).close()


@pytest.fixture
def stored_policy(policy_file: str) -> Iterator[None]:
    """The policy in the cluster's metadata, where segments and the DAG watch read it."""
    from storage.catalog import Catalog

    Catalog().replace_auth(AuthPolicy.from_file(policy_file))
    yield
    Catalog().disable_auth()


def test_python_clients_matrix(
    world: dict[str, Any], policy_file: str, stored_policy: None, monkeypatch, kv_snapshot
):
    monkeypatch.setenv("RAYTOPICS_AUTH_TOKENS_FILE", policy_file)
    for caller in CALLERS:
        token = SECRET[caller]
        if caller in ("none", "bogus"):
            with pytest.raises(UnauthenticatedError):
                ScalableTopicsAdmin(token=token or "")
            admin = None
        else:
            admin = ScalableTopicsAdmin(token=token)
        for ns in NAMESPACES:
            topic = world["topics"][ns]
            for op in ("lookup", "consume", "admin", "produce", "consume-client"):
                permission = op.removesuffix("-client")
                want = expected(caller, ns, permission)
                before = kv_snapshot() if want else None
                try:
                    if op in ("produce", "consume-client"):
                        _client_op(op, topic, token or "")
                    elif admin is not None:
                        _admin_op(admin, op, ns, topic, caller)
                    else:
                        continue
                    got = None
                except (UnauthenticatedError, UnauthorizedError) as err:
                    assert not token or token not in str(err)
                    got = err.http_status
                assert got == want, (caller, ns, op, got)
                if want:
                    assert kv_snapshot() == before, (caller, ns, op)


def test_errors_are_typed_through_http_client(world: dict[str, Any]) -> None:
    from clients import AdminHttpClient

    topic = world["topics"]["acme/billing"]
    with AdminHttpClient(world["url"], token=TOKENS["rw"]) as client:
        with pytest.raises(UnauthorizedError):
            client.get_metadata(topic)
        assert client.get_metadata(world["topics"]["acme/orders"])["epoch"] >= 0
    with AdminHttpClient(world["url"], token="") as client, pytest.raises(UnauthenticatedError):
        client.list_scalable_topics("acme/orders")
    assert issubclass(UnauthorizedError, ScalableTopicsError)
