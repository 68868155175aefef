"""The REST admin gateway over real HTTP on loopback, against a real local Ray.

Every endpoint is exercised; malformed and conflicting requests must come back
as 4xx JSON and leave the metadata exactly as it was; ``AdminHttpClient`` must
be a drop-in for ``ScalableTopicsAdmin`` (same methods, results, typed errors).
"""

from __future__ import annotations

import asyncio
import inspect
import json
import os
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import ray
from aiohttp.test_utils import TestClient, TestServer
from ports import free_port

import clients.http
from actors.admin.service import admin_service_actor
from actors.control.controller_host import controller_actor
from actors.gateway.routes import ROUTES, openapi_document
from actors.gateway.server import create_app, start_gateway, stop_gateway
from clients import AdminHttpClient, Producer, ScalableTopicsAdmin
from runtime.errors import (
    ConflictError,
    InconsistentRequestError,
    InvalidArgumentError,
    InvalidNameError,
    RequestTimeoutError,
    ScalableTopicsError,
    SegmentNotActiveError,
    SegmentNotFoundError,
    SegmentsNotAdjacentError,
    SubscriptionAlreadyExistsError,
    SubscriptionNotFoundError,
    TopicAlreadyExistsError,
    TopicNotFoundError,
    UnavailableError,
)
from runtime.layout import SegmentLayout
from runtime.names import TopicName
from runtime.rest import TOPIC_PATH

TENANT, NAMESPACE = "gw", "ns"
SCALABLE = f"/admin/v2/scalable/{TENANT}/{NAMESPACE}"
SEGMENTS = f"/admin/v2/segments/{TENANT}/{NAMESPACE}"


def http(
    url: str, method: str, path: str, body: Any = None, headers: dict[str, str] | None = None
) -> tuple[int, Any]:
    """One real HTTP request; ``body`` is sent raw if a str, as JSON otherwise."""
    data = body.encode() if isinstance(body, str) else None
    if body is not None and not isinstance(body, str):
        data = json.dumps(body).encode()
    request = urllib.request.Request(url + path, data=data, method=method)
    request.add_header("Content-Type", "application/json")
    for name, value in (headers or {}).items():
        request.add_header(name, value)
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            status, raw = response.status, response.read()
    except urllib.error.HTTPError as err:
        status, raw = err.code, err.read()
    return status, json.loads(raw) if raw else None


@pytest.fixture(scope="module")
def gateway(ray_cluster) -> Iterator[str]:
    port = free_port()
    url = start_gateway(port)
    yield url
    stop_gateway(port)


@pytest.fixture(scope="module")
def admin(ray_cluster) -> ScalableTopicsAdmin:
    return ScalableTopicsAdmin()


# --- the document and the liveness probe ------------------------------------------------


def test_openapi_lists_every_route_and_health(gateway: str) -> None:
    status, doc = http(gateway, "GET", "/openapi.json")
    assert status == 200 and doc["openapi"].startswith("3.")
    expected = {(route.path, route.method.lower()) for route in ROUTES}
    listed = {(path, method) for path, item in doc["paths"].items() for method in item}
    assert listed == expected
    schemas = doc["components"]["schemas"]
    assert {"CreateTopicBody", "CreateSubscriptionBody", "CreateSegmentBody", "ErrorBody"} <= set(
        schemas
    )
    create = doc["paths"][f"{ROUTES[1].path}"]["put"]
    assert create["requestBody"]["required"] is True
    assert schemas["CreateTopicBody"]["properties"]["numSegments"]["maximum"] == 65536
    for item in doc["paths"].values():
        for operation in item.values():
            error = operation["responses"]["400"]["content"]["application/json"]["schema"]
            assert error == {"$ref": "#/components/schemas/ErrorBody"}
            assert "500" not in operation["responses"], operation["operationId"]
            # one document whatever the authentication state (it is off here): every
            # checked operation takes a token or none, and may answer 401 and 403
            checked = "x-permission" in operation
            assert checked == (operation["tags"] != ["meta"]), operation["operationId"]
            refusals = {"401", "403"} & set(operation["responses"])
            assert refusals == ({"401", "403"} if checked else set()), operation["operationId"]
            assert operation.get("security") == ([{"bearerAuth": []}, {}] if checked else None)
    assert doc["components"]["securitySchemes"] == {
        "bearerAuth": {"type": "http", "scheme": "bearer"}
    }
    assert doc == openapi_document()
    status, health = http(gateway, "GET", "/healthz")
    assert status == 200 and health["status"] == "ok"
    assert health["metadata"] == {"backend": "rocksdb", "durable": True}  # the embedded Ray
    (endpoint,) = health["metrics"]  # one node; scraping it finds our metrics
    with urllib.request.urlopen(endpoint, timeout=10) as scraped:
        assert scraped.status == 200 and b"ray_" in scraped.read()


# --- every endpoint, the happy path -----------------------------------------------------


def test_every_endpoint(gateway: str, admin: ScalableTopicsAdmin, unique: str) -> None:
    topic, base = f"topic://{TENANT}/{NAMESPACE}/life-{unique}", f"{SCALABLE}/life-{unique}"
    status, meta = http(gateway, "PUT", base, {"numSegments": 2, "properties": {"team": "a"}})
    assert status == 201 and meta == admin.get_metadata(topic)
    assert meta["properties"] == {"team": "a"} and len(meta["segments"]) == 2
    assert http(gateway, "GET", base) == (200, meta)
    assert topic in http(gateway, "GET", SCALABLE)[1]
    status, ready = http(gateway, "GET", f"{base}/status?waitS=20")  # segments start behind
    assert status == 200 and ready == {
        "topic": topic, "state": "ready", "segments": 2, "running": 2, "notRunning": []
    }  # fmt: skip

    body = {"position": "latest", "sessionGraceS": 5}
    assert http(gateway, "PUT", f"{base}/subscriptions/s1", body) == (204, None)
    assert http(gateway, "PUT", f"{base}/subscriptions/s2") == (204, None)
    assert http(gateway, "GET", f"{base}/subscriptions") == (200, ["s1", "s2"])

    status, split = http(gateway, "POST", f"{base}/split/0")
    assert status == 200 and (split["kind"], split["parents"], split["children"]) == (
        "split",
        [0],
        [2, 3],
    )
    status, merge = http(gateway, "POST", f"{base}/merge/2/3")
    assert status == 200 and (merge["parents"], merge["children"], merge["epoch"]) == (
        [2, 3],
        [4],
        2,
    )
    status, stats = http(gateway, "GET", f"{base}/stats")
    assert status == 200 and (stats["activeSegments"], stats["sealedSegments"]) == (2, 3)
    assert set(stats["subscriptions"]) == {"s1", "s2"}

    assert http(gateway, "DELETE", f"{base}/subscriptions/s2") == (204, None)
    assert admin.list_subscriptions(topic) == ["s1"]

    segment = f"{SEGMENTS}/life-{unique}/ffff-ffff-900"  # outside the layout: low-level API
    assert http(gateway, "PUT", segment, {"subscriptions": ["s1"]}) == (204, None)
    status, refused = http(gateway, "POST", f"{segment}/terminate")
    assert (status, refused["error"]) == (404, "segment_not_found")  # not in the layout
    assert http(gateway, "DELETE", f"{segment}?force=true") == (204, None)
    active = f"{SEGMENTS}/life-{unique}/8000-ffff-1"
    assert http(gateway, "POST", f"{active}/terminate?force=true") == (200, {"endOffset": 0})

    assert http(gateway, "DELETE", base) == (204, None)
    assert http(gateway, "GET", base)[1]["error"] == "topic_not_found"
    assert topic not in admin.list_scalable_topics(f"{TENANT}/{NAMESPACE}")


# --- malformed and conflicting requests -------------------------------------------------

# (id, method, path, body, status, error code); {T}: the prepared topic's path,
# {S}: its segments path, {N}: a topic that does not exist (and must not appear).
BAD_REQUESTS = [
    ("bad-json", "PUT", "{N}", '{"numSegments": 2', 400, "invalid_request"),
    ("no-body", "PUT", "{N}", None, 400, "invalid_request"),
    ("body-not-object", "PUT", "{N}", [2], 400, "invalid_argument"),
    ("num-as-string", "PUT", "{N}", {"numSegments": "4"}, 400, "invalid_argument"),
    ("num-as-bool", "PUT", "{N}", {"numSegments": True}, 400, "invalid_argument"),
    ("num-zero", "PUT", "{N}", {"numSegments": 0}, 400, "invalid_argument"),
    ("num-too-many", "PUT", "{N}", {"numSegments": 65537}, 400, "invalid_argument"),
    ("unknown-field", "PUT", "{N}", {"numSegments": 2, "color": "red"}, 400, "invalid_argument"),
    ("property-not-str", "PUT", "{N}", {"numSegments": 2, "properties": {"a": 1}}, 400,
     "invalid_argument"),
    ("bad-topic-name", "PUT", f"{SCALABLE}/bad$name", {"numSegments": 1}, 400, "invalid_name"),
    ("bad-tenant-name", "GET", "/admin/v2/scalable/-gw/ns", None, 400, "invalid_name"),
    # not ASCII: counted as an "invalid" topic, since Ray refuses such metric tags
    ("non-ascii-namespace", "GET", "/admin/v2/scalable/gw/%C2%80", None, 400, "invalid_name"),
    ("topic-exists", "PUT", "{T}", {"numSegments": 1}, 409, "topic_exists"),
    ("delete-missing-topic", "DELETE", "{N}", None, 404, "topic_not_found"),
    ("stats-missing-topic", "GET", "{N}/stats", None, 404, "topic_not_found"),
    ("status-missing-topic", "GET", "{N}/status", None, 404, "topic_not_found"),
    ("status-wait-word", "GET", "{T}/status?waitS=soon", None, 400, "invalid_argument"),
    ("status-wait-too-long", "GET", "{T}/status?waitS=20.5", None, 400, "invalid_argument"),
    ("status-wait-negative", "GET", "{T}/status?waitS=-1", None, 400, "invalid_argument"),
    ("layout-missing-topic", "GET", "{N}/layout?knownEpoch=0", None, 404, "topic_not_found"),
    ("layout-epoch-word", "GET", "{T}/layout?knownEpoch=one", None, 400, "invalid_argument"),
    ("layout-epoch-negative", "GET", "{T}/layout?knownEpoch=-1", None, 400,
     "invalid_argument"),
    ("layout-wait-too-long", "GET", "{T}/layout?waitS=21", None, 400, "invalid_argument"),
    ("join-missing-topic", "PUT", "{N}/subscriptions/s1/consumers/c1", None, 404,
     "topic_not_found"),
    ("join-unknown-subscription", "PUT", "{T}/subscriptions/nope/consumers/c1", None, 404,
     "subscription_not_found"),
    ("join-bad-name", "PUT", "{T}/subscriptions/s1/consumers/b%24d", None, 400, "invalid_name"),
    ("poll-not-joined", "GET", "{T}/subscriptions/s1/consumers/ghost/assignment", None, 404,
     "consumer_not_registered"),
    ("poll-version-word", "GET", "{T}/subscriptions/s1/consumers/c1/assignment?knownVersion=x",
     None, 400, "invalid_argument"),
    ("poll-version-below", "GET", "{T}/subscriptions/s1/consumers/c1/assignment?knownVersion=-2",
     None, 400, "invalid_argument"),
    ("poll-wait-too-long", "GET", "{T}/subscriptions/s1/consumers/c1/assignment?waitS=21", None,
     400, "invalid_argument"),
    ("release-negative", "POST", "{T}/subscriptions/s1/consumers/c1/release/1",
     {"position": -1}, 400, "invalid_argument"),
    ("finish-not-joined", "POST", "{T}/subscriptions/s1/consumers/ghost/finished/0", None, 404,
     "consumer_not_registered"),
    ("cursor-unknown-segment", "GET", "{T}/subscriptions/s1/cursors/99", None, 404,
     "segment_not_found"),
    ("cursor-unknown-subscription", "GET", "{T}/subscriptions/nope/cursors/1", None, 404,
     "subscription_not_found"),
    ("ack-no-body", "POST", "{T}/subscriptions/s1/cursors/1", None, 400, "invalid_request"),
    ("ack-offset-string", "POST", "{T}/subscriptions/s1/cursors/1", {"offset": "0"}, 400,
     "invalid_argument"),
    # segment 1 holds no message: offset 0 is not written, so not acknowledged
    ("ack-not-written", "POST", "{T}/subscriptions/s1/cursors/1", {"offset": 0}, 400,
     "invalid_argument"),
    ("split-negative-id", "POST", "{T}/split/-1", None, 400, "invalid_argument"),
    ("split-word-id", "POST", "{T}/split/one", None, 400, "invalid_argument"),
    ("split-fraction-id", "POST", "{T}/split/1.5", None, 400, "invalid_argument"),
    ("split-with-body", "POST", "{T}/split/1", {"force": True}, 400, "invalid_argument"),
    ("split-sealed", "POST", "{T}/split/0", None, 409, "segment_not_active"),
    ("split-unknown", "POST", "{T}/split/99", None, 404, "segment_not_found"),
    ("merge-not-adjacent", "POST", "{T}/merge/2/1", None, 409, "segments_not_adjacent"),
    ("merge-with-itself", "POST", "{T}/merge/2/2", None, 409, "segments_not_adjacent"),
    ("merge-sealed", "POST", "{T}/merge/0/1", None, 409, "segment_not_active"),
    ("subscription-exists", "PUT", "{T}/subscriptions/s1", None, 409, "subscription_exists"),
    ("subscription-unknown", "DELETE", "{T}/subscriptions/nope", None, 404,
     "subscription_not_found"),
    ("subscription-position", "PUT", "{T}/subscriptions/s2", {"position": "middle"}, 400,
     "invalid_argument"),
    ("subscription-grace", "PUT", "{T}/subscriptions/s2", {"sessionGraceS": 0}, 400,
     "invalid_argument"),
    ("subscription-name", "PUT", "{T}/subscriptions/b%24d", None, 400, "invalid_name"),
    ("descriptor-malformed", "PUT", "{S}/zzzz-1", None, 400, "invalid_name"),
    # well-formed, yet no segment can have that range: it names nothing (404)
    ("descriptor-range", "POST", "{S}/ffff-0000-5/terminate", None, 404, "segment_not_found"),
    ("segment-subscriptions-type", "PUT", "{S}/0000-00ff-50", {"subscriptions": "s1"}, 400,
     "invalid_argument"),
    ("segment-of-missing-topic", "PUT", f"{SEGMENTS}/missing/0000-ffff-0", None, 404,
     "topic_not_found"),
    ("delete-active-segment", "DELETE", "{S}/8000-ffff-1", None, 409, "conflict"),
    ("terminate-active-segment", "POST", "{S}/8000-ffff-1/terminate", None, 409, "conflict"),
    ("terminate-wrong-range", "POST", "{S}/8000-bfff-1/terminate", None, 404,
     "segment_not_found"),  # segment 1 exists, with another range: this descriptor names none
    ("terminate-not-in-layout", "POST", "{S}/0000-00ff-70/terminate", None, 404,
     "segment_not_found"),
    ("force-not-bool", "DELETE", "{S}/8000-ffff-1?force=maybe", None, 400, "invalid_argument"),
    ("unknown-query", "DELETE", "{S}/8000-ffff-1?forse=true", None, 400, "invalid_argument"),
    ("unknown-route", "GET", "/admin/v2/nothing", None, 404, "not_found"),
    ("namespace-only-route", "GET", f"/admin/v2/scalable/{TENANT}", None, 404, "not_found"),
    ("wrong-method", "POST", "{T}", None, 405, "method_not_allowed"),
    ("wrong-method-stats", "DELETE", "{T}/stats", None, 405, "method_not_allowed"),
]  # fmt: skip


@pytest.fixture(scope="module")
def prepared(gateway: str, admin: ScalableTopicsAdmin) -> Iterator[dict[str, str]]:
    """A topic whose segment 0 is sealed (children 2, 3), 1 active, subscription s1."""
    name = f"bad-{uuid.uuid4().hex[:8]}"
    topic = f"topic://{TENANT}/{NAMESPACE}/{name}"
    admin.create_scalable_topic(topic, 2)
    admin.split_segment(topic, 0)
    admin.create_subscription(topic, "s1")
    yield {
        "topic": topic,
        "T": f"{SCALABLE}/{name}",
        "S": f"{SEGMENTS}/{name}",
        "N": f"{SCALABLE}/never-{name}",
    }
    admin.delete_scalable_topic(topic)


def _snapshot(admin: ScalableTopicsAdmin, topic: str) -> tuple[Any, ...]:
    return (
        admin.get_metadata(topic),
        admin.list_subscriptions(topic),
        admin.list_scalable_topics(f"{TENANT}/{NAMESPACE}"),
    )


@pytest.mark.parametrize(
    ("method", "path", "body", "status", "code"),
    [case[1:] for case in BAD_REQUESTS],
    ids=[case[0] for case in BAD_REQUESTS],
)
def test_bad_request_is_refused_and_changes_nothing(
    gateway: str,
    admin: ScalableTopicsAdmin,
    prepared: dict[str, str],
    method: str,
    path: str,
    body: Any,
    status: int,
    code: str,
) -> None:
    before = _snapshot(admin, prepared["topic"])
    got_status, reply = http(gateway, method, path.format(**prepared), body)
    assert (got_status, reply["error"]) == (status, code), reply
    assert set(reply) == {"error", "message"} and reply["message"]
    assert "Traceback" not in reply["message"]
    assert _snapshot(admin, prepared["topic"]) == before


def test_messages_say_what_is_wrong_and_what_is_allowed(gateway: str) -> None:
    status, reply = http(gateway, "PUT", f"{SCALABLE}/x", {"numSegments": 2, "color": "red"})
    assert status == 400 and "color" in reply["message"] and "numSegments" in reply["message"]
    status, reply = http(gateway, "POST", f"{SCALABLE}/x/merge/1/-2")
    assert status == 400 and "segmentId2" in reply["message"] and "from 0 to" in reply["message"]
    status, reply = http(gateway, "PUT", f"{SCALABLE}/x", [1, 2])  # not an object at all
    assert status == 400 and reply["message"].startswith("invalid request body: "), reply
    assert "request body: request body" not in reply["message"], reply
    assert "None)" not in reply["message"], reply


# --- the application alone: bugs and oversized bodies -----------------------------------


class _BrokenService:
    async def call(self, method: str, *args: Any, credential: str | None, **kwargs: Any) -> Any:
        raise RuntimeError("a bug\nwith a second line")


def test_unexpected_errors_are_json_500_without_traceback(ray_cluster) -> None:
    async def scenario() -> list[tuple[int, dict[str, Any]]]:
        async with TestClient(TestServer(create_app(_BrokenService()))) as client:
            replies = []
            for method, path, data in (
                ("GET", f"{SCALABLE}/x", None),
                ("PUT", f"{SCALABLE}/x", b"{" + b" " * (2 << 20) + b"}"),
            ):
                response = await client.request(method, path, data=data)
                replies.append((response.status, await response.json()))
            return replies

    (status, bug), (too_big_status, too_big) = asyncio.run(scenario())
    assert status == 500 and bug["error"] == "internal"
    assert "RuntimeError" in bug["message"] and "a bug" not in bug["message"]
    assert too_big_status == 413 and set(too_big) == {"error", "message"}


# --- AdminHttpClient: a drop-in for ScalableTopicsAdmin ---------------------------------


class _SlowService:
    """Answers a status call after the wait it was given and creates a topic in a second;
    anything else never finishes."""

    async def call(self, method: str, *args: Any, credential: str | None, **kwargs: Any) -> Any:
        if method == "topic_status":
            await asyncio.sleep(args[1])
            return {"topic": args[0], "state": "starting", "segments": 1, "running": 0,
                    "notRunning": [0]}  # fmt: skip
        if method == "watch_layout":
            await asyncio.sleep(args[2])
            return {"layout": None}
        if method == "create_scalable_topic":
            await asyncio.sleep(1.0)
            return None
        await asyncio.sleep(3600)


def test_every_request_is_answered_within_the_time_out(ray_cluster) -> None:
    """What the OpenAPI document promises: past the gateway's time-out a request gets a 504
    ``timeout`` (saying a change may still complete), not a hung connection; a status long
    poll (of a topic's status or layout) is kept inside the time-out, so it always answers;
    an operation with a longer
    time-out of its own (a create starts segment processes) is waited for that long."""

    async def scenario() -> list[tuple[int, dict[str, Any], float]]:
        app = create_app(_SlowService(), timeout_s=0.5)
        async with TestClient(TestServer(app)) as client:
            replies = []
            for method, path, body in (
                ("GET", f"{SCALABLE}/t", None),
                ("PUT", f"/admin/v2/limits/{TENANT}/{NAMESPACE}", {"max_topics_per_namespace": 2}),
                ("GET", f"{SCALABLE}/t/status?waitS=20", None),
                ("PUT", f"{SCALABLE}/t", {"numSegments": 1}),
                ("GET", f"{SCALABLE}/t/layout?knownEpoch=3&waitS=20", None),
            ):
                started = time.monotonic()
                response = await client.request(method, path, json=body)
                body = await response.json() if response.status != 201 else {}
                replies.append((response.status, body, time.monotonic() - started))
            return replies

    replies = asyncio.run(scenario())
    (read, read_body, read_s), (change, change_body, change_s), (poll, poll_body, poll_s) = replies[
        :3
    ]
    created, _, created_s = replies[3]
    assert replies[4][:2] == (200, {"layout": None}) and 0.2 < replies[4][2] < 0.5
    assert (read, read_body["error"]) == (504, "timeout") and read_s < 2
    assert (
        "within 0.5s" in read_body["message"] and "RAYTOPICS_REST_TIMEOUT_S" in read_body["message"]
    )
    assert (change, change_body["error"]) == (504, "timeout") and change_s < 2
    assert "may still complete" in change_body["message"]
    assert poll == 200 and poll_body["state"] == "starting" and 0.2 < poll_s < 0.5
    assert created == 201 and 1.0 <= created_s < 3  # past the gateway's 0.5 s: its own 120 s
    document = openapi_document()
    for item in document["paths"].values():
        for operation in item.values():
            assert ("504" in operation["responses"]) == (operation["tags"] != ["meta"])
    own = document["paths"][TOPIC_PATH]["put"]["responses"]["504"]["description"]
    assert "within 120 s (this operation's time-out" in own


def test_a_bad_time_out_setting_is_refused_before_anything_starts(ray_cluster, monkeypatch) -> None:
    port = free_port()
    for bad in ("soon", "0", "-1", "inf"):
        monkeypatch.setenv("RAYTOPICS_REST_TIMEOUT_S", bad)
        with pytest.raises(InvalidArgumentError, match="RAYTOPICS_REST_TIMEOUT_S"):
            start_gateway(port)
    assert not stop_gateway(port)  # nothing was started


def _public_methods(cls: type) -> dict[str, inspect.Signature]:
    return {
        name: inspect.signature(member)
        for name, member in vars(cls).items()
        if callable(member) and not name.startswith("_")
    }


def test_a_gateway_that_never_answers_is_a_time_out_not_an_unreachable_one(monkeypatch) -> None:
    """The HTTP client waits past the gateway's time-out for the gateway's own 504; a
    gateway that took the request and never answers (a hung proxy in between) is then a
    ``RequestTimeoutError`` saying a change may still complete, since it may, not an
    error saying the gateway cannot be reached. An operation with a longer time-out of
    its own (a split) is waited for that long."""
    monkeypatch.setattr(clients.http, "ANSWER_GRACE_S", 0.2)
    pool = ThreadPoolExecutor(1)
    with socket.create_server(("127.0.0.1", 0)) as server:
        server.settimeout(5)
        url = f"http://127.0.0.1:{server.getsockname()[1]}"
        with AdminHttpClient(url, timeout_s=0.3) as client:
            started = time.monotonic()
            stats = pool.submit(client.get_stats, "topic://gw/ns/t")
            held = server.accept()[0]  # taken, never answered
            with pytest.raises(RequestTimeoutError, match="may still complete"):
                stats.result(timeout=5)
            assert 0.45 < time.monotonic() - started < 3
            held.close()

            split = pool.submit(client.split_segment, "topic://gw/ns/t", 0)
            held = server.accept()[0]
            time.sleep(1.0)
            assert not split.done(), "a split waits for its own time-out, not the gateway's"
            held.close()  # the connection drops: that is what the caller is told
            with pytest.raises(UnavailableError, match="cannot reach"):
                split.result(timeout=5)
    pool.shutdown()


def test_http_client_has_the_admin_api() -> None:
    admin_api = _public_methods(ScalableTopicsAdmin)
    client_api = _public_methods(AdminHttpClient)
    for name, signature in admin_api.items():
        assert name in client_api, name
        assert list(client_api[name].parameters.values()) == list(signature.parameters.values()), (
            name
        )


def _same_error(apis: tuple[Any, Any], call: Callable[[Any], Any], expected: type) -> None:
    """Both clients raise exactly ``expected`` for the same call."""
    for api in apis:
        with pytest.raises(ScalableTopicsError) as caught:
            call(api)
        assert type(caught.value) is expected, (api, caught.value)


def test_the_rest_client_works_from_a_process_without_ray(
    gateway: str, admin: ScalableTopicsAdmin, unique: str
) -> None:
    """A program that is no Ray driver and never imports Ray administers topics over REST."""
    topic = f"topic://{TENANT}/{NAMESPACE}/noray-{unique}"
    program = (
        "import sys\n"
        "from clients import AdminHttpClient\n"
        f"with AdminHttpClient({gateway!r}) as admin:\n"
        f"    admin.create_scalable_topic({topic!r}, 2)\n"
        f"    admin.split_segment({topic!r}, 0, parts=3)\n"
        f"    print(sorted(admin.get_layout({topic!r}).active_segments))\n"
        "assert 'ray' not in sys.modules, 'ray was imported'\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY")}
    done = subprocess.run(
        [sys.executable, "-c", program], env=env, cwd=Path(__file__).resolve().parents[1],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip() == "[1, 2, 3, 4]"
    assert sorted(admin.get_layout(topic).active_segments) == [1, 2, 3, 4]
    admin.delete_scalable_topic(topic)


def test_http_client_round_trip(gateway: str, admin: ScalableTopicsAdmin, unique: str) -> None:
    topic = f"topic://{TENANT}/{NAMESPACE}/rt-{unique}"
    with AdminHttpClient(gateway) as client:
        apis = (admin, client)
        meta = client.create_scalable_topic(topic, 1, {"k": "v"})
        assert meta == admin.get_metadata(topic) == client.get_metadata(topic)
        layout = client.get_layout(topic)
        assert isinstance(layout, SegmentLayout) and layout.to_dict() == meta
        namespace = f"{TENANT}/{NAMESPACE}"
        assert client.list_scalable_topics(namespace) == admin.list_scalable_topics(namespace)

        client.create_subscription(topic, "s1", "latest", 5.0)
        assert client.list_subscriptions(topic) == ["s1"]
        split = client.split_segment(topic, 0)
        assert (split["kind"], split["parents"], split["children"]) == ("split", (0,), (1, 2))
        assert client.merge_segments(topic, 1, 2)["children"] == (3,)
        assert client.get_stats(topic) == admin.get_stats(topic)
        assert asyncio.run(client.get_metadata_async(topic)) == admin.get_metadata(topic)

        _same_error(apis, lambda api: api.create_scalable_topic(topic, 1), TopicAlreadyExistsError)
        _same_error(
            apis, lambda api: api.create_scalable_topic(f"{topic}x", 0), InvalidArgumentError
        )
        _same_error(apis, lambda api: api.get_metadata(f"{topic}-missing"), TopicNotFoundError)
        _same_error(apis, lambda api: api.get_metadata("topic://only/two"), InvalidNameError)
        _same_error(apis, lambda api: api.split_segment(topic, 0), SegmentNotActiveError)
        _same_error(apis, lambda api: api.split_segment(topic, -1), InvalidArgumentError)
        _same_error(apis, lambda api: api.merge_segments(topic, 3, 3), SegmentsNotAdjacentError)
        _same_error(
            apis, lambda api: api.create_subscription(topic, "s1"), SubscriptionAlreadyExistsError
        )
        _same_error(
            apis, lambda api: api.delete_subscription(topic, "s9"), SubscriptionNotFoundError
        )
        _same_error(
            apis,
            lambda api: api.create_subscription(topic, "s9", "latest", -1),
            InvalidArgumentError,
        )
        active = f"segment://{TENANT}/{NAMESPACE}/rt-{unique}/0000-ffff-3"
        _same_error(apis, lambda api: api.delete_segment(active), ConflictError)

        stray = f"segment://{TENANT}/{NAMESPACE}/rt-{unique}/ffff-ffff-90"
        assert client.create_segment(stray, ["s1"]) is None
        _same_error(apis, lambda api: api.terminate_segment(stray), SegmentNotFoundError)
        assert client.delete_segment(stray, force=True) is None
        assert client.terminate_segment(active, force=True) == 0

        client.delete_subscription(topic, "s1")
        client.delete_scalable_topic(topic)
        _same_error(apis, lambda api: api.list_subscriptions(topic), TopicNotFoundError)


def test_a_layout_long_poll_answers_when_a_split_or_merge_commits(
    gateway: str, admin: ScalableTopicsAdmin, unique: str
) -> None:
    """``GET …/layout?knownEpoch=N&waitS=S``: at once when the caller's epoch is stale,
    as soon as a split or merge commits when it is current (not at the end of the wait),
    ``{"layout": null}`` when nothing changed, 404 once the topic is deleted."""
    topic, base = f"topic://{TENANT}/{NAMESPACE}/watch-{unique}", f"{SCALABLE}/watch-{unique}"
    admin.create_scalable_topic(topic, 1)
    with AdminHttpClient(gateway) as client:
        now = http(gateway, "GET", f"{base}/layout")
        assert now == (200, {"layout": admin.get_metadata(topic)})
        epoch = now[1]["layout"]["epoch"]
        started = time.monotonic()
        assert http(gateway, "GET", f"{base}/layout?knownEpoch={epoch}&waitS=1") == (
            200, {"layout": None}
        )  # fmt: skip
        assert time.monotonic() - started >= 1
        assert client.watch_layout(topic, epoch + 7, 20).to_dict() == admin.get_metadata(topic)

        def change_soon(change: Callable[[], Any]) -> threading.Thread:
            thread = threading.Thread(target=lambda: (time.sleep(1), change()))
            thread.start()
            return thread

        for change in (lambda: admin.split_segment(topic, 0),
                       lambda: admin.merge_segments(topic, 1, 2)):  # fmt: skip
            changing = change_soon(change)
            started = time.monotonic()
            newer = client.watch_layout(topic, epoch, 20)
            took = time.monotonic() - started
            changing.join(timeout=60)
            assert newer is not None and newer.epoch > epoch, newer
            assert newer.to_dict() == admin.get_metadata(topic)
            assert 0.9 <= took < 10, took  # woken by the commit, not by the end of the wait
            epoch = newer.epoch
        assert list(newer.active_segments) == [3]

        deleting = change_soon(lambda: admin.delete_scalable_topic(topic))
        with pytest.raises(TopicNotFoundError):
            client.watch_layout(topic, epoch, 20)
        deleting.join(timeout=60)


def test_a_stream_consumer_over_rest_joins_follows_its_assignment_and_leaves(
    gateway: str, admin: ScalableTopicsAdmin, unique: str
) -> None:
    """What a stream consumer outside Ray calls (``clients._remote.RemoteGroupAccess``),
    as raw requests: a join answers the assignment, a poll with it waits and answers
    null, a sealed parent read to its end is finished and its children are assigned,
    acknowledgements move the cursor, and leaving hands everything back."""
    topic, base = f"topic://{TENANT}/{NAMESPACE}/members-{unique}", f"{SCALABLE}/members-{unique}"
    admin.create_scalable_topic(topic, 1)
    admin.create_subscription(topic, "s")
    with Producer(topic) as producer:
        producer.send(b"before the split", key="k").result(timeout=30)
    admin.split_segment(topic, 0)  # 0 sealed with one message; children 1, 2
    me = f"{base}/subscriptions/s/consumers/c1"

    status, joined = http(gateway, "PUT", me)
    assert status == 200 and [s["segmentId"] for s in joined["segments"]] == [0], joined
    version = joined["version"]
    assert http(gateway, "GET", f"{me}/assignment?knownVersion={version}&waitS=0.5") == (
        200, {"assignment": None})  # fmt: skip
    assert http(gateway, "GET", f"{base}/subscriptions/s/cursors/0") == (
        200, {"position": 0, "drained": False})  # fmt: skip
    status, refused = http(gateway, "POST", f"{me}/finished/0", {})
    assert (status, refused["error"]) == (409, "conflict")  # its message is not acknowledged
    assert http(gateway, "POST", f"{base}/subscriptions/s/cursors/0", {"offset": 0}) == (204, None)
    assert http(gateway, "GET", f"{base}/subscriptions/s/cursors/0") == (
        200, {"position": 1, "drained": True})  # fmt: skip
    assert http(gateway, "POST", f"{me}/finished/0", {"position": 1}) == (204, None)
    status, polled = http(gateway, "GET", f"{me}/assignment?knownVersion={version}&waitS=10")
    assert status == 200 and sorted(s["segmentId"] for s in polled["assignment"]["segments"]) == [
        1, 2]  # fmt: skip

    assert http(gateway, "DELETE", me) == (204, None)
    status, gone = http(gateway, "GET", f"{me}/assignment")
    assert (status, gone["error"]) == (404, "consumer_not_registered")
    assert admin.get_stats(topic)["subscriptions"]["s"]["assignments"] == {}
    admin.delete_scalable_topic(topic)


def test_a_split_at_a_hash_over_rest_and_ray(
    gateway: str, admin: ScalableTopicsAdmin, unique: str
) -> None:
    """The upper child starts at ``at`` (``at`` in the body); both clients get
    the same typed refusal for a hash outside the segment, and a split without a body
    still halves."""
    name = f"at-{unique}"
    topic = f"topic://{TENANT}/{NAMESPACE}/{name}"
    admin.create_scalable_topic(topic, 2)  # #0 [0000-7fff], #1 [8000-ffff]
    with AdminHttpClient(gateway) as client:
        assert client.split_segment(topic, 1, at=0x8A00)["children"] == (2, 3)
        assert admin.split_segment(topic, 0, at=0x0100)["children"] == (4, 5)
        ranges = {
            i: (s["hashRange"]["start"], s["hashRange"]["end"])
            for i, s in admin.get_metadata(topic)["segments"].items()
        }
        assert [ranges[str(i)] for i in (2, 3, 4, 5)] == [
            (0x8000, 0x89FF), (0x8A00, 0xFFFF), (0x0000, 0x00FF), (0x0100, 0x7FFF),
        ]  # fmt: skip
        # outside segment 3's range: what only the layout rules out (409); not a hash (400)
        for bad, error in (
            (0x8A00, InconsistentRequestError),
            (0x8000, InconsistentRequestError),
            (0x10000, InvalidArgumentError),
            (-1, InvalidArgumentError),
        ):
            _same_error(
                (admin, client), lambda api, bad=bad: api.split_segment(topic, 3, at=bad), error
            )  # fmt: skip
    status, body = http(gateway, "POST", f"{SCALABLE}/{name}/split/3", {"at": "0x9000"})
    assert (status, body["error"]) == (400, "invalid_argument"), body
    status, body = http(gateway, "POST", f"{SCALABLE}/{name}/split/3")
    assert status == 200 and body["children"] == [6, 7], body
    assert admin.get_layout(topic).get(6).hash_range.end == 0x8A00 + (0xFFFF - 0x8A00) // 2
    with AdminHttpClient(gateway) as client:  # into three: one hash alone in the middle
        assert client.split_segment(topic, 7, at=[0xD000, 0xD001])["children"] == (8, 9, 10)
    assert admin.split_segment(topic, 4, at=(0x10, 0x20))["children"] == (11, 12, 13)
    layout = admin.get_layout(topic)
    spans = [(layout.get(i).hash_range.start, layout.get(i).hash_range.end) for i in range(8, 14)]
    assert spans == [
        (0xC500, 0xCFFF), (0xD000, 0xD000), (0xD001, 0xFFFF),
        (0x0000, 0x000F), (0x0010, 0x001F), (0x0020, 0x00FF),
    ]  # fmt: skip
    # what the document cannot state (order, the segment's range, at with parts) is a 409
    refusals = [
        ({"at": [0x20, 0x10]}, 409, "inconsistent"),
        ({"at": [0x30, 0x30]}, 409, "inconsistent"),
        ({"at": 0x30, "parts": 2}, 409, "inconsistent"),
        ({"at": []}, 400, "invalid_argument"),
    ]
    for body, code, error in refusals:
        status, refused = http(gateway, "POST", f"{SCALABLE}/{name}/split/13", body)
        assert (status, refused["error"]) == (code, error), (body, refused)
    # and back: a run of neighbours merges in one operation, in any order
    with AdminHttpClient(gateway) as client:
        assert client.merge_segments(topic, 10, 8, 9)["parents"] == (8, 9, 10)
        _same_error(
            (admin, client), lambda api: api.merge_segments(topic, 11, 13, 2),
            SegmentsNotAdjacentError,
        )  # fmt: skip
    assert admin.merge_segments(topic, [11, 12, 13])["children"] == (15,)  # a list, as well
    merged = admin.get_layout(topic)
    assert [(merged.get(i).hash_range.start, merged.get(i).hash_range.end) for i in (14, 15)] == [
        (0xC500, 0xFFFF), (0x0000, 0x00FF),
    ]  # fmt: skip
    # into equal parts: #14 [c500-ffff] is 0x3b00 wide
    with AdminHttpClient(gateway) as client:
        assert client.split_segment(topic, 14, parts=4)["children"] == (16, 17, 18, 19)
        refusals = (
            ({"parts": 1}, InvalidArgumentError),
            ({"parts": 65}, InvalidArgumentError),
            ({"at": 0xD000, "parts": 2}, InconsistentRequestError),
        )
        for bad, error in refusals:
            _same_error(
                (admin, client), lambda api, bad=bad: api.split_segment(topic, 15, **bad), error
            )  # fmt: skip
        assert client.merge_segments(topic, [19, 17, 16, 18])["children"] == (20,)
    assert admin.split_segment(topic, 20, parts=3)["children"] == (21, 22, 23)
    split = admin.get_layout(topic)
    assert [split.get(i).hash_range.width for i in (16, 17, 18, 19)] == [0xEC0] * 4
    assert sorted(split.get(i).hash_range.width for i in (21, 22, 23)) == [0x13AA, 0x13AB, 0x13AB]
    admin.delete_scalable_topic(topic)


def test_errors_without_a_known_code_keep_their_status_class() -> None:
    from clients.http import error_from_response

    assert type(error_from_response(409, '{"error": "new_code", "message": "m"}')) is ConflictError
    assert type(error_from_response(404, "<html>proxy</html>")).__name__ == "NotFoundError"
    assert type(error_from_response(409, '{"error": "segments_not_adjacent", "message": "m"}')) is (
        SegmentsNotAdjacentError
    )


def test_unreachable_gateway_is_unavailable() -> None:
    with (
        AdminHttpClient(f"http://127.0.0.1:{free_port()}", timeout_s=5) as client,
        pytest.raises(UnavailableError),
    ):
        client.list_scalable_topics(f"{TENANT}/{NAMESPACE}")


# --- starting and stopping --------------------------------------------------------------


def test_start_gateway_serves_and_busy_ports_fail_cleanly(ray_cluster) -> None:
    port = free_port()
    start_gateway(port)
    try:
        status, health = http(f"http://127.0.0.1:{port}", "GET", "/healthz")
        assert status == 200 and health["status"] == "ok"
        with pytest.raises(ConflictError):
            start_gateway(port, host="0.0.0.0")
    finally:
        assert stop_gateway(port)
    assert not stop_gateway(port)

    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        with pytest.raises(UnavailableError, match="cannot listen"):
            start_gateway(busy.getsockname()[1])
        assert not stop_gateway(busy.getsockname()[1])  # the failed actor was removed


def test_namespace_limits_over_rest(gateway: str, admin: ScalableTopicsAdmin, unique: str) -> None:
    namespace, path = f"{TENANT}/lim-{unique}", f"/admin/v2/limits/{TENANT}/lim-{unique}"
    with AdminHttpClient(gateway) as client:
        limits = client.set_namespace_limits(namespace, max_topics_per_namespace=2)
        assert limits["max_topics_per_namespace"] == 2
        assert (
            limits
            == admin.get_namespace_limits(namespace)
            == client.get_namespace_limits(namespace)
        )
        too_small = {"max_batch_bytes": 1}  # below max_message_bytes: the set is refused whole
        for api in (admin, client):
            with pytest.raises(InconsistentRequestError, match="max_batch_bytes"):
                api.set_namespace_limits(namespace, **too_small)
        assert http(gateway, "PUT", path, too_small)[0] == 409
    for body in ({"max_message_bytes": "4"}, {"bogus": 1}, {"max_message_bytes": 0}, None):
        assert http(gateway, "PUT", path, body)[0] == 400, body
    assert admin.get_namespace_limits(namespace) == limits


# --- a split or merge is applied once, whoever retries it ---------------------------------


def test_the_same_idempotency_key_is_applied_once_and_answered_alike(
    gateway: str, admin: ScalableTopicsAdmin, unique: str
) -> None:
    topic = f"topic://{TENANT}/{NAMESPACE}/key-{unique}"
    admin.create_scalable_topic(topic, 2)
    base = f"{SCALABLE}/key-{unique}"
    key = {"Idempotency-Key": f"split-{unique}"}
    first = http(gateway, "POST", f"{base}/split/0", headers=key)
    again = http(gateway, "POST", f"{base}/split/0", headers=key)
    assert first[0] == 200 and again == first
    assert admin.get_layout(topic).epoch == 1, "a retry must not split again"
    fresh = http(gateway, "POST", f"{base}/split/0", headers={"Idempotency-Key": "other"})
    assert fresh[0] == 409 and fresh[1]["error"] == "segment_not_active"
    for bad in ("", "x" * 65, "two words"):
        status, body = http(gateway, "POST", f"{base}/split/2", headers={"Idempotency-Key": bad})
        assert (status, body["error"]) == (400, "invalid_request"), bad
    assert admin.get_layout(topic).epoch == 1


def test_a_retry_after_other_splits_and_an_admin_service_restart_gets_its_own_result(
    gateway: str, admin: ScalableTopicsAdmin, unique: str
) -> None:
    """A caller whose answer was lost retries after another caller's split committed and
    the admin service restarted: it gets its own completed split, not a refusal."""
    topic = f"topic://{TENANT}/{NAMESPACE}/retry-{unique}"
    admin.create_scalable_topic(topic, 2)
    base = f"{SCALABLE}/retry-{unique}"
    mine = {"Idempotency-Key": f"mine-{unique}"}
    first = http(gateway, "POST", f"{base}/split/0", headers=mine)
    assert first[0] == 200, first
    other = http(gateway, "POST", f"{base}/split/1", headers={"Idempotency-Key": f"o-{unique}"})
    assert other[0] == 200, other
    ray.kill(admin_service_actor(), no_restart=False)
    again = http(gateway, "POST", f"{base}/split/0", headers=mine)
    assert again == first
    assert admin.get_layout(topic).epoch == 2, "the retry must not split again"


def test_a_split_whose_answer_was_lost_with_the_admin_service_is_answered_as_completed(
    gateway: str, admin: ScalableTopicsAdmin, unique: str
) -> None:
    """The controller commits the split and dies (after step 4); while the admin service
    waits for it to come back, the service is killed too. The gateway's retry carries
    the request's id, so the caller gets the completed split, applied once, instead of
    a refusal to split a segment that is no longer active."""
    topic = f"topic://{TENANT}/{NAMESPACE}/lost-{unique}"
    admin.create_scalable_topic(topic, 2)
    ray.get(controller_actor(TopicName.parse(topic)).inject_fault_after_step.remote(4))
    with ThreadPoolExecutor(1) as pool:
        answer = pool.submit(http, gateway, "POST", f"{SCALABLE}/lost-{unique}/split/0")
        deadline = time.monotonic() + 60
        while admin.get_layout(topic).epoch == 0:
            assert not answer.done(), f"answered before the commit: {answer.result()}"
            assert time.monotonic() < deadline, "the split never committed"
            time.sleep(0.01)
        ray.kill(admin_service_actor(), no_restart=False)
        status, body = answer.result(timeout=120)
    assert status == 200, body
    assert (body["kind"], body["parents"]) == ("split", [0])
    assert admin.get_layout(topic).epoch == 1, "the split must be applied exactly once"


def test_a_create_whose_controller_died_midway_is_answered_with_the_topic(
    gateway: str, admin: ScalableTopicsAdmin, unique: str
) -> None:
    """The controller dies once the new topic's segments exist, the create still pending;
    the admin service sends it again (the same request id) to the restarted controller,
    which finishes it and answers with the topic instead of "already exists". The same
    Idempotency-Key sent again gets the same answer; another key gets the conflict."""
    topic = f"topic://{TENANT}/{NAMESPACE}/cr-{unique}"
    controller = controller_actor(TopicName.parse(topic), create=True)
    ray.get(controller.inject_fault_after_step.remote(2))
    mine = {"Idempotency-Key": f"create-{unique}"}
    path, body = f"{SCALABLE}/cr-{unique}", {"numSegments": 2}
    status, created = http(gateway, "PUT", path, body, headers=mine)
    assert status == 201, created
    assert created == admin.get_metadata(topic) and created["epoch"] == 0
    assert http(gateway, "PUT", path, body, headers=mine) == (201, created)
    status, refused = http(gateway, "PUT", path, body, headers={"Idempotency-Key": "other"})
    assert (status, refused["error"]) == (409, "topic_exists")
    with pytest.raises(TopicAlreadyExistsError):  # the Ray client's own fresh id
        admin.create_scalable_topic(topic, 2)
    assert admin.wait_until_ready(topic)["running"] == 2


def test_a_delete_whose_controller_died_before_removing_the_record_is_answered_as_done(
    gateway: str, admin: ScalableTopicsAdmin, unique: str
) -> None:
    """The controller dies with the topic's storage deleted and its record not yet; the
    restarted controller finishes the delete, and the admin service's retry, finding the
    topic gone, answers the delete as done instead of "not found". A delete sent when the
    topic is already gone (no answer lost) is still a 404."""
    topic = f"topic://{TENANT}/{NAMESPACE}/del-{unique}"
    admin.create_scalable_topic(topic, 2)
    ray.get(controller_actor(TopicName.parse(topic)).inject_fault_after_step.remote(6))
    status, body = http(gateway, "DELETE", f"{SCALABLE}/del-{unique}")
    assert status == 204, body
    with pytest.raises(TopicNotFoundError):
        admin.get_metadata(topic)
    status, body = http(gateway, "DELETE", f"{SCALABLE}/del-{unique}")
    assert (status, body["error"]) == (404, "topic_not_found")
