"""Property-based fuzzing of every admin endpoint, generated from the gateway's OpenAPI
document and route table, over real HTTP against a real cluster.

Each endpoint gets ``EXAMPLES`` requests with path parameters drawn from real
names, random valid names and garbage, bodies that are shaped like the schema,
random JSON or random bytes, and query strings with real and unknown keys.
Every answer must be documented JSON (never a 5xx, never a hang), and every
refused request must leave the namespace's metadata byte-for-byte as it was.
The fuzzed namespaces get tight limits, so accepted creates and splits stay cheap.
"""

from __future__ import annotations

import json
import re
import urllib.error
import urllib.parse
import urllib.request
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import ray
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from actors.gateway.routes import ROUTES
from actors.gateway.server import start_gateway, stop_gateway
from clients import ScalableTopicsAdmin
from storage.metadata import GcsKeyValue
from tests.test_gateway import free_port

EXAMPLES = 60  # per endpoint with inputs; the module must send 2,000 in all (the last test)
FIXED_EXAMPLES = 20  # per endpoint that takes no path, body or query (the storage check)
TENANT = f"fz{uuid.uuid4().hex[:6]}"
NAMESPACES = (f"{TENANT}/a", f"{TENANT}/b")
SENT: list[int] = []

JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner),
    max_leaves=10,
)
GARBAGE = st.text(st.characters(codec="utf-8"), min_size=1, max_size=30)
VALID_NAME = st.from_regex(r"[A-Za-z0-9][A-Za-z0-9_.=-]{0,20}", fullmatch=True)


@pytest.fixture(scope="module")
def world(ray_cluster) -> Iterator[dict[str, Any]]:
    admin = ScalableTopicsAdmin()
    for ns in NAMESPACES:
        admin.set_namespace_limits(
            ns, max_topics_per_namespace=4, max_segments_per_topic=4, max_segments_per_namespace=8
        )
        admin.create_scalable_topic(f"topic://{ns}/t", 2)
        admin.create_subscription(f"topic://{ns}/t", "s")
    port = free_port()
    yield {"url": start_gateway(port), "namespace": ray.get_runtime_context().namespace}
    stop_gateway(port)
    for ns in NAMESPACES:
        for topic in admin.list_scalable_topics(ns):
            admin.delete_scalable_topic(topic)


def snapshot(namespace: str) -> dict[bytes, bytes]:
    """Every KV entry the fuzzed namespaces own (topics and limits)."""
    store = GcsKeyValue(namespace)
    keys = [key for prefix in (f"/topics/{TENANT}/", f"/limits/{TENANT}/")
            for key in store.keys(prefix.encode())]  # fmt: skip
    return store.get_many(keys)  # one round trip, not one per key


def _param(name: str) -> st.SearchStrategy[str]:
    real = {
        "tenant": st.just(TENANT),
        "namespace": st.sampled_from(["a", "b"]),
        "topic": st.just("t"),
        "subscription": st.just("s"),
        "descriptor": st.sampled_from(["0000-7fff-0", "8000-ffff-1", "0000-ffff-7"]),
    }.get(name, st.integers(0, 5).map(str))
    other = st.integers(-3, 2**70).map(str) if name.startswith("segmentId") else VALID_NAME
    if name in ("tenant", "namespace"):  # only namespaces with limits may be written to
        other = st.sampled_from(["", "..", "a b", "-x", "x" * 200])
    return st.one_of(real, real, other, GARBAGE)


def _body(route) -> st.SearchStrategy[bytes | None]:
    fields = {f.alias or n: f for n, f in route.body.model_fields.items()}
    plausible = {
        "numSegments": st.integers(-2, 6) | st.sampled_from([65536, 65537, 2**63, "4", 1.5]),
        "position": st.sampled_from(["earliest", "latest", "middle", 0]),
        "sessionGraceS": st.floats() | st.sampled_from([0, -1, 5, "5", "NaN"]),
        "subscriptions": st.lists(st.one_of(VALID_NAME, GARBAGE, st.integers()), max_size=3),
        "properties": st.dictionaries(st.text(max_size=5), st.text(max_size=5) | st.integers()),
    }
    shaped = st.fixed_dictionaries(
        {}, optional={k: plausible.get(k, JSON) for k in fields} | {"extra": JSON}
    )
    as_json = st.one_of(shaped, shaped, JSON).map(lambda v: json.dumps(v).encode())
    return st.one_of(st.none(), as_json, st.binary(max_size=40))


def _query(route) -> st.SearchStrategy[dict[str, str]]:
    keys = [*route.query.model_fields, "force", "bogus"]
    value = st.sampled_from(["true", "false", "1", "yes", "", "maybe"]) | GARBAGE
    return st.dictionaries(st.sampled_from(keys), value, max_size=2)


def requests(route) -> st.SearchStrategy[tuple[str, str, bytes | None, dict[str, str]]]:
    """Requests to ``route``: mostly its own method, its path's parameters real or not.
    Built once per route (strategies built inside each draw cost more than the request)."""
    quoted = {
        n: _param(n).map(lambda v: urllib.parse.quote(v, safe=""))
        for n in re.findall(r"{(\w+)}", route.path)
    }
    path = st.fixed_dictionaries(quoted).map(lambda values: route.path.format(**values))
    methods = ["GET", "PUT", "POST", "DELETE", "PATCH"]
    method = st.sampled_from([route.method] * 8 + methods)
    return st.tuples(method, path, _body(route), _query(route))


def send(url: str, method: str, path: str, body: bytes | None, query: dict) -> tuple[int, Any]:
    full = url + path + ("?" + urllib.parse.urlencode(query) if query else "")
    request = urllib.request.Request(full, data=body, method=method)
    request.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(request, timeout=30) as response:  # a hang fails here
            status, raw = response.status, response.read()
    except urllib.error.HTTPError as err:
        status, raw = err.code, err.read()
    return status, json.loads(raw) if raw else None


@pytest.fixture(scope="module")
def documented(world) -> dict[tuple[str, str], set[int]]:
    """Statuses each operation documents, read from the served OpenAPI document."""
    _, doc = send(world["url"], "GET", "/openapi.json", None, {})
    return {
        (path, method.upper()): {int(s) for s in op["responses"]}
        for path, item in doc["paths"].items()
        for method, op in item.items()
    }


def _examples(route) -> int:
    takes_input = "{" in route.path or route.body.model_fields or route.query.model_fields
    return EXAMPLES if takes_input else FIXED_EXAMPLES


@pytest.mark.parametrize("route", ROUTES, ids=[r.operation_id for r in ROUTES])
def test_fuzz_endpoint(route, world, documented) -> None:
    @settings(
        max_examples=_examples(route),
        deadline=None,
        database=None,
        suppress_health_check=list(HealthCheck),
    )
    @given(requests(route))
    def fuzz(request: tuple[str, str, bytes | None, dict[str, str]]) -> None:
        method, path, body, query = request
        before = snapshot(world["namespace"])
        status, payload = send(world["url"], method, path, body, query)
        SENT.append(status)
        assert status < 500, (request, status, payload)
        if status >= 400:
            assert set(payload) == {"error", "message"}, payload
            assert snapshot(world["namespace"]) == before, ("refused but changed", request)
        if method == route.method and status not in (404, 405):
            assert status in documented[(route.path, method)], (request, status, payload)

    fuzz()


@pytest.mark.integration  # counts what the fuzz test above sent to the session's gateway
def test_fuzzing_sent_enough_requests() -> None:
    print(f"fuzz: {len(SENT)} requests, statuses {sorted(set(SENT))}")
    assert len(SENT) >= 2_000 and max(SENT) < 500
