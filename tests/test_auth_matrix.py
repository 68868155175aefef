"""Tokens x tenants x operations, each allowed or refused exactly as configured.

The policy lives in the cluster (loaded once through the admin API); the
callers run where it is not: REST requests over real HTTP on loopback, and the
Python admin in a separate process whose environment names no policy file, so
only the cluster can decide. The expected table is written out by hand here,
not derived from the policy code, so the test checks the policy rather than
mirrors it. A refused request must leave every metadata entry byte-for-byte as
it was.
"""

from __future__ import annotations

import json
import subprocess
import sys
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from actors.gateway.server import start_gateway, stop_gateway
from clients import AdminHttpClient, Producer, QueueConsumer, ScalableTopicsAdmin
from runtime.auth import hash_token
from runtime.errors import (
    ScalableTopicsError,
    UnauthenticatedError,
    UnauthorizedError,
)
from tests.auth_support import client_env, policy_removed
from tests.test_gateway import free_port

TOKENS = {name: f"{name}-secret-token-0123456789" for name in ("ops", "acme", "rw", "ro", "gp")}
REVOKED = "revoked-secret-token-0123456789"
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
# The first policy also knew this token (with admin everywhere); the second, in force
# during the tests, does not: a revoked token.
FIRST = {
    "tokens": [
        *CONFIG["tokens"],
        {
            "principal": "old",
            "token": REVOKED,
            "grants": [{"namespace": "*", "actions": ["admin"]}],
        },
    ]
}
NAMESPACES = ("acme/orders", "acme/billing", "globex/ns")
ALL = {"lookup", "produce", "consume", "admin"}
EXPECTED: dict[str, dict[str, set[str]]] = {
    "ops": dict.fromkeys(NAMESPACES, ALL),
    "acme": {"acme/orders": ALL, "acme/billing": ALL},
    "rw": {"acme/orders": {"lookup", "produce", "consume"}},
    "ro": {"acme/orders": {"lookup"}},
    "gp": {"globex/ns": {"lookup", "produce"}},
}
ADMIN_EVERYWHERE = {"ops"}  # who may act on "*": the storage check, the policy itself
CALLERS = [*TOKENS, "none", "bogus", "revoked"]
SECRET = {**TOKENS, "none": None, "bogus": "bogus-token-not-configured-000", "revoked": REVOKED}


def expected(caller: str, namespace: str, permission: str) -> int | None:
    """None when allowed; else the HTTP status of the refusal."""
    if caller in ("none", "bogus", "revoked"):
        return 401
    if permission == "authenticated":  # a transaction's operations: any principal
        return None
    if namespace == "*":
        return None if caller in ADMIN_EVERYWHERE else 403
    return None if permission in EXPECTED[caller].get(namespace, set()) else 403


# --- the operations ------------------------------------------------------------------------


@dataclass(frozen=True)
class Op:
    """One admin operation, over REST and in Python.

    ``ok``: the status when allowed (404 for a mutation aimed at what does not exist:
    the check passed, nothing changed); ``None``: run only where it is refused (it
    would turn authentication off or delete other tests' storage)."""

    name: str
    permission: str  # of the namespace; "*" ops need admin on every namespace
    ok: int | None
    method: str
    path: str  # {ns}: tenant/namespace, {base}: the namespace's topic, {c}: the caller
    body: Any
    python: str  # the ScalableTopicsAdmin method
    args: tuple[Any, ...]  # {topic}, {never}, {ns}, {c} filled in
    kwargs: dict[str, Any] | None = None


SEG = "/admin/v2/segments/{ns}/never-{c}/0000-ffff-0"
NEVER_SEGMENT = "segment://{ns}/never-{c}/0000-ffff-0"
TXNS = "/admin/v2/transactions"
TXN = TXNS + "/txn-never-{c}"
OPS: tuple[Op, ...] = (
    Op("list", "lookup", 200, "GET", "/admin/v2/scalable/{ns}", None,
       "list_scalable_topics", ("{ns}",)),
    Op("metadata", "lookup", 200, "GET", "/admin/v2/scalable/{ns}/{base}", None,
       "get_metadata", ("{topic}",)),
    Op("stats", "lookup", 200, "GET", "/admin/v2/scalable/{ns}/{base}/stats", None,
       "get_stats", ("{topic}",)),
    Op("subscriptions", "lookup", 200, "GET", "/admin/v2/scalable/{ns}/{base}/subscriptions",
       None, "list_subscriptions", ("{topic}",)),
    Op("policy", "lookup", 200, "GET", "/admin/v2/scalable/{ns}/{base}/policy", None,
       "get_policy", ("{topic}",)),
    Op("limits", "lookup", 200, "GET", "/admin/v2/limits/{ns}", None,
       "get_namespace_limits", ("{ns}",)),
    Op("ns-policy", "lookup", 200, "GET", "/admin/v2/namespace-policies/{ns}", None,
       "get_namespace_policy", ("{ns}",)),
    Op("status", "lookup", 200, "GET", "/admin/v2/scalable/{ns}/{base}/status", None,
       "get_status", ("{topic}",)),
    # what Spark's streaming source and sink call (the Python client has no method of its
    # own for them: its generic call presents the caller's token all the same)
    Op("stream-start", "consume", 200, "POST", "/admin/v2/scalable/{ns}/{base}/stream/initial",
       {"startingOffsets": "earliest"}, "_call", ("stream_initial", "{topic}", "earliest")),
    # where a segment listens: lookup, as the layout that names it (its data plane checks
    # produce or consume itself); a producer outside Ray asks it too
    Op("stream-endpoint", "lookup", 200, "GET",
       "/admin/v2/scalable/{ns}/{base}/stream/endpoint/0", None,
       "_call", ("stream_endpoint", "{topic}", 0)),
    Op("stream-write", "produce", 200, "POST", "/admin/v2/scalable/{ns}/{base}/stream/write",
       {"queryId": "matrix-rest", "batchId": 0, "partitionId": 0, "records": []},
       "_call", ("stream_write", "{topic}", "matrix-python", 0, 0, 0, [])),
    Op("stream-sink-open", "produce", 200, "POST",
       "/admin/v2/scalable/{ns}/{base}/stream/sink/open",
       {"queryId": "matrix-rest", "batchId": 0, "partitionId": 0, "chunk": 0, "hashes": []},
       "_call", ("sink_open", "{topic}", "matrix-python", 0, 0, 0, [])),
    # what a stream consumer outside Ray calls: its membership and its cursors
    Op("consumer-join", "consume", 404, "PUT",
       "/admin/v2/scalable/{ns}/never-{c}/subscriptions/s/consumers/c", None,
       "_call", ("register_consumer", "{never}", "s", "c")),
    Op("cursor", "consume", 404, "GET",
       "/admin/v2/scalable/{ns}/never-{c}/subscriptions/s/cursors/0", None,
       "_call", ("get_cursor", "{never}", "s", 0)),
    Op("acknowledge", "consume", 404, "POST",
       "/admin/v2/scalable/{ns}/never-{c}/subscriptions/s/cursors/0", {"offset": 0},
       "_call", ("acknowledge_cumulative", "{never}", "s", 0, 0)),
    Op("subscribe", "consume", 204, "PUT", "/admin/v2/scalable/{ns}/{base}/subscriptions/r-{c}",
       {}, "create_subscription", ("{topic}", "p-{c}")),
    Op("reset", "consume", 404, "POST",
       "/admin/v2/scalable/{ns}/never-{c}/subscriptions/s/reset", {"to": "earliest"},
       "reset_subscription", ("{never}", "s", "earliest")),
    Op("clear-backlog", "consume", 404, "POST",
       "/admin/v2/scalable/{ns}/never-{c}/subscriptions/s/clear-backlog", None,
       "clear_backlog", ("{never}", "s")),
    # consume deletes the subscriptions its principal created; others' need admin
    Op("unsubscribe", "consume", 404, "DELETE",
       "/admin/v2/scalable/{ns}/{base}/subscriptions/never-{c}", None,
       "delete_subscription", ("{topic}", "never-{c}")),
    Op("unsubscribe-other", "admin", None, "DELETE",
       "/admin/v2/scalable/{ns}/{base}/subscriptions/q", None,
       "delete_subscription", ("{topic}", "q")),
    Op("create", "admin", 201, "PUT", "/admin/v2/scalable/{ns}/new-r-{c}", {"numSegments": 1},
       "create_scalable_topic", ("topic://{ns}/new-p-{c}", 1)),
    Op("delete", "admin", 404, "DELETE", "/admin/v2/scalable/{ns}/never-{c}", None,
       "delete_scalable_topic", ("{never}",)),
    Op("split", "admin", 404, "POST", "/admin/v2/scalable/{ns}/never-{c}/split/0", None,
       "split_segment", ("{never}", 0)),
    Op("merge", "admin", 404, "POST", "/admin/v2/scalable/{ns}/never-{c}/merge/0/1", None,
       "merge_segments", ("{never}", 0, 1)),
    Op("set-policy", "admin", 404, "PUT", "/admin/v2/scalable/{ns}/never-{c}/policy",
       {"retention": {"timeS": 60}}, "set_policy", ("{never}", {"retention": {"timeS": 60}})),
    Op("set-limits", "admin", 200, "PUT", "/admin/v2/limits/{ns}",
       {"max_topics_per_namespace": 10000}, "set_namespace_limits", ("{ns}",),
       {"max_topics_per_namespace": 10000}),
    # an empty default (every part unset): allowed, it changes no topic of the namespace
    Op("set-ns-policy", "admin", 200, "PUT", "/admin/v2/namespace-policies/{ns}", {},
       "set_namespace_policy", ("{ns}", {})),
    Op("create-segment", "admin", 404, "PUT", SEG, {}, "create_segment", (NEVER_SEGMENT,)),
    Op("terminate-segment", "admin", 404, "POST", SEG + "/terminate", None,
       "terminate_segment", (NEVER_SEGMENT,)),
    Op("delete-segment", "admin", 404, "DELETE", SEG, None, "delete_segment", (NEVER_SEGMENT,)),
    Op("recover", "admin", 404, "POST", "/admin/v2/scalable/{ns}/never-{c}/recover", {},
       "recover_topic", ("{never}",)),
    Op("check-storage", "*", 200, "GET", "/admin/v2/storage", None, "check_storage", ()),
    Op("delete-storage", "*", None, "DELETE", "/admin/v2/storage/orphaned", None,
       "check_storage", (True,)),
    Op("auth-status", "*", 200, "GET", "/admin/v2/auth", None, "auth_status", ()),
    Op("auth-load", "*", 200, "PUT", "/admin/v2/auth", CONFIG, "load_auth", (CONFIG,)),
    Op("auth-disable", "*", None, "DELETE", "/admin/v2/auth", None, "disable_auth", ()),
    # transactions: any principal begins one, and acts only on its own (below)
    # (a time-out that outlasts the module: an expiry would change metadata meanwhile)
    Op("new-transaction", "authenticated", 201, "POST", TXNS, {"timeoutS": 900},
       "new_transaction", (), {"timeout_s": 900}),
    Op("get-transaction", "authenticated", 404, "GET", TXN, None,
       "get_transaction", ("txn-never-{c}",)),
    Op("commit-transaction", "authenticated", 404, "POST", TXN + "/commit", None,
       "commit_transaction", ("txn-never-{c}",)),
    Op("abort-transaction", "authenticated", 404, "POST", TXN + "/abort", None,
       "abort_transaction", ("txn-never-{c}",)),
    Op("list-transactions", "*", 200, "GET", TXNS, None, "list_transactions", ()),
    Op("transaction-acknowledge", "consume", 404, "POST",
       SEG + "/transactions/txn-never-{c}/acknowledgements", {"subscription": "q", "offset": 0},
       "transaction_acknowledge", ("txn-never-{c}", NEVER_SEGMENT, "q", 0)),
)  # fmt: skip


def _fill(value: Any, names: dict[str, str]) -> Any:
    if isinstance(value, str):
        return value.format(**names)
    if isinstance(value, tuple | list):
        return [_fill(v, names) for v in value]
    return value


@dataclass(frozen=True)
class Case:
    caller: str
    namespace: str  # "*" for the ops that span every namespace
    op: Op
    want: int  # the status expected: a refusal's, else op.ok

    @property
    def refused(self) -> bool:
        return self.want in (401, 403)


def cases() -> list[Case]:
    found = []
    for caller in CALLERS:
        for op in OPS:
            for ns in ("*",) if op.permission in ("*", "authenticated") else NAMESPACES:
                refusal = expected(caller, ns, "admin" if op.permission == "*" else op.permission)
                if refusal is None and op.ok is None:
                    continue
                found.append(Case(caller, ns, op, refusal or op.ok))
    return found


def test_the_table_covers_every_caller_and_operation() -> None:
    every = cases()
    assert {c.caller for c in every} == set(CALLERS)
    assert {c.op.name for c in every if c.refused} == {op.name for op in OPS}
    assert {c.op.name for c in every if not c.refused} == {op.name for op in OPS if op.ok}
    assert {c.caller for c in every if c.op.name == "auth-load" and not c.refused} == {"ops"}


# --- the cluster ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def world(ray_cluster) -> Iterator[dict[str, Any]]:
    """The policy loaded into the cluster (a first version, then one that revokes a
    token), one topic with subscription ``q`` per namespace, and a gateway."""
    unique = uuid.uuid4().hex[:6]
    with policy_removed():
        first = ScalableTopicsAdmin().load_auth(FIRST)  # authentication off: no token needed
        ops = ScalableTopicsAdmin(token=TOKENS["ops"])
        assert ops.load_auth(CONFIG)["version"] == first["version"] + 1
        topics = {ns: f"topic://{ns}/base-{unique}" for ns in NAMESPACES}
        for topic in topics.values():
            ops.create_scalable_topic(topic, 1)
            ops.create_subscription(topic, "q")
        port = free_port()
        try:
            yield {"url": start_gateway(port), "topics": topics, "unique": unique}
        finally:
            stop_gateway(port)
            for txn in ops.list_transactions():  # begun by the matrix: none may time out later
                if txn["principal"] in TOKENS and txn["status"] == "open":
                    ops.abort_transaction(txn["txnId"])
            for ns in NAMESPACES:
                for topic in ops.list_scalable_topics(ns):
                    ops.delete_scalable_topic(topic)


def _names(world: dict[str, Any], case: Case) -> dict[str, str]:
    ns = case.namespace
    topic = world["topics"].get(ns, "")
    return {
        "ns": ns,
        "c": f"{case.caller}-{world['unique']}",
        "topic": topic,
        "base": topic.rsplit("/", 1)[-1],
        "never": f"topic://{ns}/never-{case.caller}",
    }


# --- REST ----------------------------------------------------------------------------------


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
        assert set(payload) == {"error", "message"}
        assert token is None or token not in payload["message"]
        return err.code


def _rest(world: dict[str, Any], case: Case) -> int:
    path = _fill(case.op.path, _names(world, case))
    return http(world["url"], case.op.method, path, SECRET[case.caller], case.op.body)


def test_rest_matrix(world: dict[str, Any], kv_snapshot) -> None:
    every = cases()
    before = kv_snapshot()
    for case in (c for c in every if c.refused):
        got = _rest(world, case)
        assert got == case.want, (case.caller, case.namespace, case.op.name, got)
    assert kv_snapshot() == before, "a refused request changed metadata"
    for case in (c for c in every if not c.refused):
        got = _rest(world, case)
        assert got == case.want, (case.caller, case.namespace, case.op.name, got)
    assert http(world["url"], "GET", "/healthz", None) == 200  # meta endpoints stay open
    assert http(world["url"], "GET", "/openapi.json", None) == 200


# --- Python, from a process that has no policy of its own ---------------------------------

# Reads cases on stdin, answers each with 0 (done) or the HTTP status of the typed error.
# A token the cluster refuses already fails ScalableTopicsAdmin's constructor; the same
# client with that check skipped (the token swapped in afterwards) must still be refused
# by the cluster, call by call.
CLIENT = """
import asyncio, inspect, json, sys
from clients import ScalableTopicsAdmin
from runtime.errors import ScalableTopicsError

request = json.load(sys.stdin)
clients, results = {}, {"constructed": {}, "cases": []}
for caller, token in request["callers"].items():
    try:
        clients[caller] = ScalableTopicsAdmin(token=token)
        results["constructed"][caller] = 0
    except ScalableTopicsError as err:
        results["constructed"][caller] = err.http_status
        clients[caller] = ScalableTopicsAdmin(token=request["ops"])
        clients[caller]._token = token
for case in request["cases"]:
    try:
        done = getattr(clients[case["caller"]], case["method"])(*case["args"], **case["kwargs"])
        if inspect.iscoroutine(done):  # the client's generic call (no method of its own)
            asyncio.run(done)
        results["cases"].append(0)
    except ScalableTopicsError as err:
        results["cases"].append(err.http_status)
print("RESULTS " + json.dumps(results))
"""


def _python(world: dict[str, Any], batch: list[Case]) -> dict[str, Any]:
    """Run ``batch`` in a fresh client process; environment: no policy file, no token."""
    env = client_env()
    assert "RAYTOPICS_AUTH_TOKENS_FILE" not in env and "RAYTOPICS_TOKEN" not in env
    request = {
        "ops": TOKENS["ops"],
        "callers": {c: SECRET[c] for c in CALLERS},
        "cases": [
            {
                "caller": case.caller,
                "method": case.op.python,
                "args": _fill(case.op.args, _names(world, case)),
                "kwargs": case.op.kwargs or {},
            }
            for case in batch
        ],
    }
    proc = subprocess.run(
        [sys.executable, "-c", CLIENT],
        input=json.dumps(request),
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    for token in TOKENS.values():
        assert token not in proc.stdout + proc.stderr, "a token was printed or logged"
    found = [line for line in proc.stdout.splitlines() if line.startswith("RESULTS ")]
    assert found, proc.stdout[-3000:]
    return json.loads(found[-1].removeprefix("RESULTS "))


def test_python_matrix_in_a_process_without_the_policy(world: dict[str, Any], kv_snapshot):
    every = cases()
    refused = [c for c in every if c.refused]
    before = kv_snapshot()
    answers = _python(world, refused)
    assert kv_snapshot() == before, "a refused call changed metadata"
    for caller in CALLERS:
        want = 401 if caller in ("none", "bogus", "revoked") else 0
        assert answers["constructed"][caller] == want, caller
    for case, got in zip(refused, answers["cases"], strict=True):
        assert got == case.want, (case.caller, case.namespace, case.op.name, got)

    allowed = [c for c in every if not c.refused]
    answers = _python(world, allowed)
    for case, got in zip(allowed, answers["cases"], strict=True):
        want = 0 if case.want < 300 else case.want
        assert got == want, (case.caller, case.namespace, case.op.name, got)


def test_errors_are_typed_through_http_client(world: dict[str, Any]) -> None:
    topic = world["topics"]["acme/billing"]
    with AdminHttpClient(world["url"], token=TOKENS["rw"]) as client:
        with pytest.raises(UnauthorizedError):
            client.get_metadata(topic)
        assert client.get_metadata(world["topics"]["acme/orders"])["epoch"] >= 0
    with AdminHttpClient(world["url"], token="") as client, pytest.raises(UnauthenticatedError):
        client.list_scalable_topics("acme/orders")
    assert issubclass(UnauthorizedError, ScalableTopicsError)


def _json(url: str, method: str, path: str, token: str, body: Any = None) -> dict[str, Any]:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url + path, data=data, method=method)
    request.add_header("Authorization", f"Bearer {token}")
    with urllib.request.urlopen(request, timeout=60) as response:
        return json.loads(response.read())


def test_a_transaction_is_decided_only_by_its_principal(world: dict[str, Any]) -> None:
    """Another tenant holding a transaction's id (an admin of its own namespaces among
    them) may not see, commit, abort or acknowledge in it, nor fence its owner by naming
    the same owner; an admin of every namespace may see it, and its principal commits."""
    url, seg = world["url"], "/admin/v2/segments/acme/orders/never/0000-ffff-0"
    begun = _json(url, "POST", TXNS, TOKENS["rw"], {"timeoutS": 60, "owner": "app"})
    txn = TXNS + "/" + begun["txnId"]
    assert begun["principal"] == "rw" and begun["status"] == "open"
    for caller in ("acme", "gp", "ro"):
        token = TOKENS[caller]
        for method, path, body in (
            ("GET", txn, None),
            ("POST", txn + "/commit", None),
            ("POST", txn + "/abort", None),
            ("POST", f"{seg}/transactions/{begun['txnId']}/acknowledgements",
             {"subscription": "q", "offset": 0}),
        ):  # fmt: skip
            assert http(url, method, path, token, body) == 403, (caller, method, path)
    fenced_nothing = _json(url, "POST", TXNS, TOKENS["gp"], {"timeoutS": 900, "owner": "app"})
    assert fenced_nothing["principal"] == "gp"
    seen = _json(url, "GET", txn, TOKENS["ops"])  # the refusals changed nothing
    assert (seen["status"], seen["acknowledgements"], seen["segments"]) == ("open", 0, [])
    assert _json(url, "POST", txn + "/commit", TOKENS["rw"])["status"] == "committed"


# --- producers and consumers ---------------------------------------------------------------


def test_data_plane_clients_matrix(world: dict[str, Any], monkeypatch):
    """Producers and consumers: the cluster's policy decides (their checks are the data
    plane's), with no policy file and no token in this process's environment."""
    monkeypatch.delenv("RAYTOPICS_AUTH_TOKENS_FILE", raising=False)
    monkeypatch.delenv("RAYTOPICS_TOKEN", raising=False)
    for caller in CALLERS:
        token = SECRET[caller]
        for ns in NAMESPACES:
            topic = world["topics"][ns]
            for op in ("produce", "consume"):
                want = expected(caller, ns, op)
                try:
                    if op == "produce":
                        with Producer(topic, token=token or "") as producer:
                            producer.send(b"x", key="k").result(timeout=60)
                    else:
                        QueueConsumer(topic, "q", token=token or "").close()
                    got = None
                except (UnauthenticatedError, UnauthorizedError) as err:
                    assert not token or token not in str(err)
                    got = err.http_status
                assert got == want, (caller, ns, op, got)
