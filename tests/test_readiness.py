"""A new topic's segments start in the background: creating one returns once its
metadata and storage exist, and ``get_status`` / ``wait_until_ready`` /
``GET …/status?waitS=`` say when every segment's actor runs, or which do not."""

from __future__ import annotations

import json
import socket
import time
import urllib.request

import pytest

from actors.gateway.server import start_gateway, stop_gateway
from clients import AdminHttpClient, Producer, ScalableTopicsAdmin, StreamConsumer
from runtime.errors import InvalidArgumentError, TopicNotReadyError, UnavailableSegmentsError
from runtime.names import TopicName
from tests.segments import stop_serving


def test_create_returns_while_the_segments_start_and_the_wait_sees_them_up(
    admin: ScalableTopicsAdmin, unique: str
) -> None:
    topic = f"topic://ready/ns/many-{unique}"
    admin.create_scalable_topic(topic, 12)
    early = admin.get_status(topic)
    # twelve processes cannot boot in the moment since create returned
    assert early["state"] == "starting" and early["running"] < 12, early
    assert early["segments"] == 12 and len(early["notRunning"]) == 12 - early["running"]

    ready = admin.wait_until_ready(topic, 180)
    assert ready == {
        "topic": topic, "state": "ready", "segments": 12, "running": 12, "notRunning": []
    }  # fmt: skip
    assert admin.get_stats(topic)["readiness"] == ready
    with Producer(topic) as producer:
        for i in range(200):
            producer.send(f"v{i}".encode(), key=f"k{i}")
    admin.create_subscription(topic, "s", "earliest")
    consumer = StreamConsumer(topic, "s", "c")
    received: list[bytes] = []
    deadline = time.monotonic() + 60
    while len(received) < 200 and time.monotonic() < deadline:
        for message in consumer.receive_batch(500, timeout=0.5):
            received.append(message.value)
            consumer.acknowledge_cumulative(message)
    consumer.close()
    assert sorted(received) == sorted(f"v{i}".encode() for i in range(200))
    admin.delete_scalable_topic(topic)


def test_a_segment_without_a_running_actor_is_named_everywhere(
    admin: ScalableTopicsAdmin, unique: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    topic = f"topic://ready/ns/down-{unique}"
    admin.create_scalable_topic(topic, 2)
    admin.wait_until_ready(topic, 120)
    layout = admin.get_layout(topic)
    down = layout.get(1).name(TopicName.parse(topic))
    stop_serving(down)
    deadline = time.monotonic() + 30
    while admin.get_status(topic)["state"] == "ready" and time.monotonic() < deadline:
        time.sleep(0.1)
    status = admin.get_status(topic)
    assert (status["state"], status["running"], status["notRunning"]) == ("starting", 1, [1])

    started = time.monotonic()
    with pytest.raises(TopicNotReadyError, match=r"1 of 2 segments running after 1s; not yet: 1"):
        admin.wait_until_ready(topic, 1)
    assert time.monotonic() - started < 5
    with pytest.raises(InvalidArgumentError, match="timeout_s"):
        admin.wait_until_ready(topic, -1)
    impatient = ScalableTopicsAdmin(segment_timeout_s=1)
    with pytest.raises(UnavailableSegmentsError, match="no running actor yet"):
        impatient.get_stats(topic)

    # over REST, through a gateway whose time-out is shorter than the wait asked for: the
    # long poll answers inside it, with the same status
    monkeypatch.setenv("RAYTOPICS_REST_TIMEOUT_S", "2")
    port = _free_port()
    url = start_gateway(port)
    try:
        path = f"/admin/v2/scalable/ready/ns/down-{unique}/status?waitS=20"
        started = time.monotonic()
        with urllib.request.urlopen(url + path, timeout=30) as response:
            assert response.status == 200
            assert json.loads(response.read()) == status
        assert time.monotonic() - started < 2
        with pytest.raises(TopicNotReadyError, match="not yet: 1"):
            AdminHttpClient(url).wait_until_ready(topic, 1)
    finally:
        stop_gateway(port)
    admin.delete_scalable_topic(topic)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]
