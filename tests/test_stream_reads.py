"""Streaming reads planned by the cluster over REST (what the Spark streaming source
calls): a query plans micro-batch after micro-batch while its topic is produced to,
split twice and merged; reading each batch's ranges from the segments gives every
message once, each key in order, and a key never in two ranges of one batch."""

from __future__ import annotations

import socket
from collections import defaultdict
from collections.abc import Iterator
from typing import Any

import pytest
import ray
from test_gateway import http

from actors.gateway import start_gateway, stop_gateway
from actors.segment import segment_actor
from clients import Producer, ScalableTopicsAdmin
from runtime.names import TopicName

TENANT, NAMESPACE = "stream", "ns"


@pytest.fixture(scope="module")
def gateway(ray_cluster) -> Iterator[str]:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    url = start_gateway(port)
    yield url
    stop_gateway(port)


def read_range(topic: str, layout: Any, item: dict[str, Any]) -> list[tuple[str, str]]:
    name = layout.get(item["segmentId"]).name(TopicName.parse(topic))
    assert name.descriptor == item["descriptor"]
    batch = ray.get(segment_actor(name).read.remote(item["from"], item["to"] - item["from"]))
    assert batch.column("offset").to_pylist() == list(range(item["from"], item["to"]))
    values = [v.decode() for v in batch.column("value").to_pylist()]
    return list(zip(batch.column("key").to_pylist(), values, strict=True))


def test_micro_batches_through_splits_and_a_merge_hold_everything_once_in_key_order(
    gateway: str, admin: ScalableTopicsAdmin, unique: str
) -> None:
    topic = f"topic://{TENANT}/{NAMESPACE}/flow-{unique}"
    base = f"/admin/v2/scalable/{TENANT}/{NAMESPACE}/flow-{unique}"
    admin.create_scalable_topic(topic, 2)
    sent: list[tuple[str, str]] = []
    counter = defaultdict(int)

    def produce(n: int) -> None:
        with Producer(topic) as producer:
            for i in range(n):
                key = f"k{i % 17}"
                value = f"{key}:{counter[key]}"
                counter[key] += 1
                producer.send(value.encode(), key=key)
                sent.append((key, value))

    produce(300)
    status, first = http(gateway, "POST", f"{base}/stream/initial", {"startingOffsets": "earliest"})
    assert status == 200, first
    position = first["position"]
    received: list[tuple[str, str]] = []

    def batch(limit: int | None) -> bool:
        nonlocal position
        body = {"start": position} | ({"maxMessages": limit} if limit else {})
        status, latest = http(gateway, "POST", f"{base}/stream/latest", body)
        assert status == 200 and latest["warnings"] == [], latest
        status, planned = http(
            gateway, "POST", f"{base}/stream/ranges", {"start": position, "end": latest["end"]}
        )
        assert status == 200, planned
        layout = admin.get_layout(topic)
        pieces = [read_range(topic, layout, item) for item in planned["ranges"]]
        got = [record for piece in pieces for record in piece]
        assert limit is None or len(got) <= limit
        for key in {k for k, _ in got}:  # read in parallel: a key in one range only
            assert sum(any(k == key for k, _ in piece) for piece in pieces) == 1
        received.extend(got)
        moved = latest["end"] != position
        position = latest["end"]
        return moved

    batch(120)
    admin.split_segment(topic, 0)
    produce(200)
    batch(120)
    admin.split_segment(topic, 1)
    produce(200)
    batch(None)
    layout = admin.get_layout(topic)
    left, right = sorted(layout.active_segments.values(), key=lambda s: s.hash_range.start)[:2]
    admin.merge_segments(topic, left.segment_id, right.segment_id)
    produce(200)
    for _ in range(30):
        if not batch(150) and len(received) == len(sent):
            break
    assert sorted(received) == sorted(sent) and len(received) == len(sent) == 900
    last: dict[str, int] = {}
    for key, value in received:
        sequence = int(value.split(":")[1])
        assert last.get(key, -1) == sequence - 1, (key, sequence)
        last[key] = sequence

    status, endpoint = http(gateway, "GET", f"{base}/stream/endpoint/0")
    assert status == 200 and endpoint["port"] > 0 and endpoint["tls"] is False
    assert http(gateway, "GET", f"{base}/stream/endpoint/99")[1]["error"] == "segment_not_found"

    # a position of another topic, or of the topic before it was deleted and made again
    other = {**position, "topic": "topic://stream/ns/other"}
    status, refused = http(gateway, "POST", f"{base}/stream/latest", {"start": other})
    assert (status, refused["error"]) == (409, "conflict") and "not of" in refused["message"]
    admin.delete_scalable_topic(topic)
    admin.create_scalable_topic(topic, 1)
    status, refused = http(gateway, "POST", f"{base}/stream/latest", {"start": position})
    assert status == 409 and "deleted since" in refused["message"]
    status, refused = http(gateway, "POST", f"{base}/stream/latest", {"start": {"topic": topic}})
    assert (status, refused["error"]) == (400, "invalid_argument")
    status, refused = http(gateway, "POST", f"{base}/stream/initial", {"startingOffsets": {"5": 0}})
    assert (status, refused["error"]) == (404, "segment_not_found")
    admin.delete_scalable_topic(topic)
