"""Streaming reads planned by the cluster over REST (what the Spark streaming source
calls): a query plans micro-batch after micro-batch while its topic is produced to,
split twice and merged; reading each batch's ranges from the segments gives every
message once, each key in order, and a key never in two ranges of one batch."""

from __future__ import annotations

import base64
import socket
import time
from collections import defaultdict
from collections.abc import Iterator
from typing import Any

import pytest
import ray
from conftest import TIER_ROOT
from test_gateway import http

from actors.gateway.server import start_gateway, stop_gateway
from clients import Producer, ScalableTopicsAdmin
from runtime import wire
from runtime.batch import make_batch, serialize_batch
from runtime.errors import SegmentTerminated
from runtime.hashing import HASH_MASK, key_hash, murmur3_32
from runtime.names import TopicName
from runtime.sink_parts import SinkPart, SinkWrite, with_sequences
from storage.catalog import Catalog
from tests.segments import segment_actor, served_segments

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


# --- the sink's writes -------------------------------------------------------------------


def stored_values(topic: str, admin: ScalableTopicsAdmin) -> list[str]:
    layout = admin.get_layout(topic)
    values = []
    for info in layout.all_segments.values():
        handle = segment_actor(info.name(TopicName.parse(topic)))
        batch = ray.get(handle.read.remote(0, 100_000))
        values += [v.decode() for v in batch.column("value").to_pylist()]
    return values


def chunk(prefix: str, keyed: int, unkeyed: int = 0) -> list[dict[str, Any]]:
    records = [
        {"key": f"k{i}", "value": base64.b64encode(f"{prefix}-{i}".encode()).decode()}
        for i in range(keyed)
    ]
    return records + [
        {"value": base64.b64encode(f"{prefix}-n{i}".encode()).decode(), "properties": {"p": "1"}}
        for i in range(unkeyed)
    ]


def record_parts(topic: str, query: str, batch: int) -> list[SinkPart]:
    """What a write records before appending (a crash may follow): one part per active
    segment, at the next sequence of the write's producer there. A split's children
    start in the background: their actors are waited for first."""
    from clients import ScalableTopicsAdmin

    ScalableTopicsAdmin().wait_until_ready(topic, 60)
    layout, name = Catalog().require_topic(TopicName.parse(topic)).layout, TopicName.parse(topic)
    producer = f"sink:{query}:3:0"
    active = sorted(layout.active_segments.items())
    lasts = {
        s: ray.get(segment_actor(info.name(name)).last_sequence.remote(producer))
        for s, info in active
    }
    parts = with_sequences([(s, info.hash_range) for s, info in active], lasts)
    catalog = Catalog()
    found = catalog.sink_write(name, query, 3, 0)
    catalog.put_sink_write(
        name, query, 3, 0, SinkWrite(batch=batch, parts=tuple(parts)), found and found[1]
    )
    return parts


def crash_after_first_part(
    topic: str, query: str, batch: int, records: list[dict[str, Any]]
) -> tuple[int, int]:
    """A write that recorded its parts and stored only the first before its process died:
    (rows stored, the segment whose part was not)."""
    first, second, *_ = record_parts(topic, query, batch)
    name = TopicName.parse(topic)
    mine = [r for r in records if key_hash(r["key"]) in first.hash_range]
    values = [base64.b64decode(r["value"]) for r in mine]
    handle = segment_actor(Catalog().require_topic(name).layout.get(first.segment).name(name))
    producer = f"sink:{query}:3:0"
    ray.get(
        handle.append.remote(make_batch(values, [r["key"] for r in mine]), producer, first.sequence)
    )
    return len(mine), second.segment


def test_a_sink_write_is_stored_once_through_replays_splits_and_a_crash_between_parts(
    gateway: str, admin: ScalableTopicsAdmin, unique: str
) -> None:
    topic = f"topic://{TENANT}/{NAMESPACE}/sink-{unique}"
    base = f"/admin/v2/scalable/{TENANT}/{NAMESPACE}/sink-{unique}"
    admin.create_scalable_topic(topic, 2)
    query = f"q-{unique}"

    def write(batch: int, records: list[dict[str, Any]], chunk_no: int = 0) -> dict[str, Any]:
        body = {"queryId": query, "batchId": batch, "partitionId": 3, "chunk": chunk_no}
        status, answer = http(gateway, "POST", f"{base}/stream/write", body | {"records": records})
        assert status == 200, answer
        return answer

    first = chunk("b0", 50, 10)
    assert write(0, first) == {"stored": 60, "duplicate": False}
    assert write(0, first) == {"stored": 0, "duplicate": True}  # a replay
    admin.split_segment(topic, 0)
    assert write(0, first) == {"stored": 0, "duplicate": True}  # a replay after a split
    assert write(1, chunk("b1", 40)) == {"stored": 40, "duplicate": False}
    assert write(0, first) == {"stored": 0, "duplicate": True}  # older than the last batch

    # a crash after the write recorded its parts and stored one of them, then a split
    # of the segment whose part was not stored yet: the replay stores exactly the rest
    third = chunk("b2", 30)
    stored_first, unstored = crash_after_first_part(topic, query, 2, third)
    admin.split_segment(topic, unstored)
    assert write(2, third) == {"stored": 30 - stored_first, "duplicate": False}
    assert write(2, third) == {"stored": 0, "duplicate": True}

    values = stored_values(topic, admin)
    expected = [f"b0-{i}" for i in range(50)] + [f"b0-n{i}" for i in range(10)]
    expected += [f"b1-{i}" for i in range(40)] + [f"b2-{i}" for i in range(30)]
    assert sorted(values) == sorted(expected)

    status, refused = http(
        gateway, "POST", f"{base}/stream/write",
        {"queryId": query, "batchId": 5, "partitionId": 0, "records": [{"value": "!!"}]},
    )  # fmt: skip
    assert (status, refused["error"]) == (400, "invalid_argument") and "value" in refused["message"]
    admin.delete_scalable_topic(topic)


def test_a_sink_write_is_stored_once_when_its_segments_merge_between_a_crash_and_the_replay(
    gateway: str, admin: ScalableTopicsAdmin, unique: str
) -> None:
    """A merged child owns the ranges of parts that were stored and of parts that were
    not: the replay stores only the latter; two unstored parts meeting on one child
    take a sequence each."""
    topic = f"topic://{TENANT}/{NAMESPACE}/merge-{unique}"
    base = f"/admin/v2/scalable/{TENANT}/{NAMESPACE}/merge-{unique}"
    admin.create_scalable_topic(topic, 2)
    query = f"q-{unique}"

    def write(batch: int, records: list[dict[str, Any]]) -> dict[str, Any]:
        body = {"queryId": query, "batchId": batch, "partitionId": 3, "records": records}
        status, answer = http(gateway, "POST", f"{base}/stream/write", body)
        assert status == 200, answer
        return answer

    first = chunk("m0", 60)
    stored, _ = crash_after_first_part(topic, query, 0, first)
    assert 0 < stored < 60
    admin.merge_segments(topic, 0, 1)
    assert write(0, first) == {"stored": 60 - stored, "duplicate": False}
    assert write(0, first) == {"stored": 0, "duplicate": True}

    admin.split_segment(topic, 2)
    second = chunk("m1", 60)
    record_parts(topic, query, 1)  # recorded, none stored, then both segments merge
    admin.merge_segments(topic, 3, 4)
    assert write(1, second) == {"stored": 60, "duplicate": False}
    assert write(1, second) == {"stored": 0, "duplicate": True}
    assert Catalog().sink_write(TopicName.parse(topic), query, 3, 0)[0].parts == (
        SinkPart(segment=5, sequence=0, hash_range=admin.get_layout(topic).get(3).hash_range),
        SinkPart(segment=5, sequence=1, hash_range=admin.get_layout(topic).get(4).hash_range),
    )

    values = stored_values(topic, admin)
    expected = [f"m0-{i}" for i in range(60)] + [f"m1-{i}" for i in range(60)]
    assert sorted(values) == sorted(expected)
    admin.delete_scalable_topic(topic)


class DataPlaneWriter:
    """What a writer outside Ray (the Java sink) does with the ``stream/sink`` calls: the
    cluster records each chunk, the writer appends its parts over the segments' data
    planes (plain sockets, at the endpoints the gateway names) and finishes it."""

    def __init__(self, gateway: str, base: str, query: str) -> None:
        self.gateway, self.base, self.query = gateway, base, query

    def key(self, chunk_no: int = 0) -> dict[str, Any]:
        return {"queryId": self.query, "partitionId": 3, "chunk": chunk_no}

    def call(self, step: str, body: dict[str, Any], expect: int = 200) -> dict[str, Any]:
        status, answer = http(self.gateway, "POST", f"{self.base}/stream/sink/{step}", body)
        assert status == expect, answer
        return answer

    def open(self, batch: int, records: list[dict[str, Any]]) -> dict[str, Any]:
        hashes = [_routing_hash(r, i) for i, r in enumerate(records)]
        return self.call("open", self.key() | {"batchId": batch, "hashes": hashes})

    def append(
        self, opened: dict[str, Any], part: dict[str, Any], records: list[dict[str, Any]]
    ) -> None:
        """Appends ``part``'s records; raises the segment's error (``SegmentTerminated``)."""
        span = part["hash_range"]
        mine = [
            r for i, r in enumerate(records) if span["start"] <= _routing_hash(r, i) <= span["end"]
        ]
        batch = make_batch(
            [base64.b64decode(r["value"]) for r in mine],
            [r.get("key") for r in mine],
            [r.get("properties") for r in mine],
        )
        status, where = http(self.gateway, "GET", f"{self.base}/stream/endpoint/{part['segment']}")
        assert status == 200, where
        with socket.create_connection((where["host"], where["port"]), timeout=30) as sock:
            sock.sendall(
                wire.encode_hello(None, 1)
                + wire.encode_append(opened["producerId"], part["sequence"], serialize_batch(batch))
            )
            reader = sock.makefile("rb")
            assert wire.decode_welcome(_frame(reader)) & 1
            wire.decode_response(_frame(reader))

    def write(self, batch: int, records: list[dict[str, Any]]) -> int:
        """The whole protocol; the rows it appended (0: the chunk was stored before)."""
        opened = self.open(batch, records)
        if opened["recorded"] is None:
            return 0
        recorded, lasts, stored = opened["recorded"], opened["lastSequences"], 0
        pending = sorted(recorded["write"]["parts"], key=lambda p: (p["segment"], p["sequence"]))
        while pending:
            part = pending.pop(0)
            if opened["resumed"] and lasts.get(str(part["segment"]), -1) >= part["sequence"]:
                continue
            try:
                self.append(opened, part, records)
                stored += _count(part, records)
            except SegmentTerminated:
                held = recorded["write"]["parts"]
                body = self.key() | {"recorded": recorded, "part": part}
                recorded = self.call("reroute", body | {"hashes": opened_hashes(records)})
                pending += [p for p in recorded["write"]["parts"] if p not in held]
                pending.sort(key=lambda p: (p["segment"], p["sequence"]))
        assert self.call("finish", self.key() | {"recorded": recorded}) == {"finished": True}
        return stored


def _routing_hash(record: dict[str, Any], index: int) -> int:
    if record.get("key") is not None:
        return key_hash(record["key"])
    return murmur3_32(f"3:0:{index}".encode()) & HASH_MASK


def opened_hashes(records: list[dict[str, Any]]) -> list[int]:
    return [_routing_hash(r, i) for i, r in enumerate(records)]


def _rows_of(part: dict[str, Any], records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    span = part["hash_range"]
    hashes = opened_hashes(records)
    return [r for r, h in zip(records, hashes, strict=True) if span["start"] <= h <= span["end"]]


def _count(part: dict[str, Any], records: list[dict[str, Any]]) -> int:
    return len(_rows_of(part, records))


def _frame(reader: Any) -> bytes:
    (length,) = wire.LENGTH.unpack(reader.read(wire.LENGTH.size))
    return reader.read(length)


def test_a_writer_outside_ray_stores_a_chunk_once_over_the_data_plane(
    gateway: str, admin: ScalableTopicsAdmin, unique: str
) -> None:
    """The Java sink's protocol on real segments: a chunk recorded, one part appended,
    the writer gone; its other segment split; the replay is told which part is stored,
    reroutes the other to the split's children, finishes; a third attempt stores nothing."""
    topic = f"topic://{TENANT}/{NAMESPACE}/plane-{unique}"
    base = f"/admin/v2/scalable/{TENANT}/{NAMESPACE}/plane-{unique}"
    admin.create_scalable_topic(topic, 2)
    writer = DataPlaneWriter(gateway, base, f"q-{unique}")
    records = chunk("d0", 50, 10)

    opened = writer.open(0, records)
    assert opened["resumed"] is False and opened["lastSequences"] == {}
    assert opened["producerId"] == f"sink:q-{unique}:3:0"
    first, second = sorted(opened["recorded"]["write"]["parts"], key=lambda p: p["segment"])
    writer.append(opened, first, records)  # ...and the writer dies
    admin.split_segment(topic, second["segment"])
    admin.wait_until_ready(topic, 60)

    again = writer.open(0, records)
    assert again["resumed"] is True and again["recorded"] == opened["recorded"]
    assert again["lastSequences"] == {str(first["segment"]): first["sequence"],
                                      str(second["segment"]): -1}  # fmt: skip
    assert writer.write(0, records) == 60 - _count(first, records)
    assert writer.open(0, records)["recorded"] is None  # stored whole: a replay
    assert writer.write(1, chunk("d1", 20)) == 20
    assert writer.write(0, records) == 0  # older than the last batch
    values = stored_values(topic, admin)
    expected = [f"d0-{i}" for i in range(50)] + [f"d0-n{i}" for i in range(10)]
    assert sorted(values) == sorted(expected + [f"d1-{i}" for i in range(20)])

    # refused whole, with nothing changed: a forged record, hashes outside the space,
    # a finish on a record moved on since
    garbage = writer.key() | {"recorded": {"write": {"parts": "x"}, "version": "v"}}
    assert writer.call("finish", garbage, expect=400)["error"] == "invalid_argument"
    wide = writer.key() | {"batchId": 5, "hashes": [70_000]}
    assert writer.call("open", wide, expect=400)["error"] == "invalid_argument"
    stale = writer.key() | {"recorded": opened["recorded"]}
    assert writer.call("finish", stale, expect=409)["error"] == "bad_version"
    assert writer.write(1, chunk("d1", 20)) == 0
    admin.delete_scalable_topic(topic)


def publish_around_a_time(topic: str) -> int:
    """50 records, then a publish time (ms), then 30 more after it; returns the time."""
    with Producer(topic) as producer:
        producer.send_batch([b"a"] * 50).result()
    time.sleep(0.05)
    middle = int(time.time() * 1000)
    time.sleep(0.05)
    with Producer(topic) as producer:
        producer.send_batch([b"b"] * 30).result()
    return middle


def test_a_query_can_start_at_a_publish_time(
    gateway: str, admin: ScalableTopicsAdmin, unique: str
) -> None:
    topic = f"topic://{TENANT}/{NAMESPACE}/time-{unique}"
    base = f"/admin/v2/scalable/{TENANT}/{NAMESPACE}/time-{unique}"
    admin.create_scalable_topic(topic, 1)
    middle = publish_around_a_time(topic)
    status, first = http(gateway, "POST", f"{base}/stream/initial", {"startingTimestampMs": middle})
    assert status == 200 and first["position"]["next"] == {"0": 50}, first
    later = middle + 3_600_000  # nothing yet: at the end
    assert http(gateway, "POST", f"{base}/stream/initial", {"startingTimestampMs": later})[1][
        "position"
    ]["next"] == {"0": 80}
    both = {"startingTimestampMs": middle, "startingOffsets": "earliest"}
    status, refused = http(gateway, "POST", f"{base}/stream/initial", both)
    assert (status, refused["error"]) == (409, "inconsistent") and "exclude" in refused["message"]
    admin.delete_scalable_topic(topic)


def test_a_query_plans_over_hibernating_tiered_segments_without_waking_them(
    gateway: str, admin: ScalableTopicsAdmin, unique: str
) -> None:
    """Offsets and a publish time's positions of a tiered segment come from its record and
    its file in the tier: starting a query does not start its actor."""
    topic = f"topic://{TENANT}/{NAMESPACE}/tiered-{unique}"
    base = f"/admin/v2/scalable/{TENANT}/{NAMESPACE}/tiered-{unique}"
    admin.create_scalable_topic(topic, 1)
    tier = {"uri": f"file://{TIER_ROOT}/stream-{unique}", "afterS": 0, "idleS": 1}
    admin.set_policy(topic, {"tiering": tier})
    middle = publish_around_a_time(topic)
    admin.split_segment(topic, 0)
    deadline = time.monotonic() + 60
    while not admin.get_stats(topic)["segments"]["0"]["hibernating"]:
        assert time.monotonic() < deadline, admin.get_stats(topic)["segments"]["0"]
        time.sleep(0.5)
    initial = f"{base}/stream/initial"
    status, at_time = http(gateway, "POST", initial, {"startingTimestampMs": middle})
    assert status == 200 and at_time["position"]["next"]["0"] == 50, at_time
    status, earliest = http(gateway, "POST", initial, {"startingOffsets": "earliest"})
    assert status == 200 and earliest["position"]["next"]["0"] == 0, earliest
    name = TopicName.parse(topic)
    sealed = admin.get_layout(topic).get(0).name(name)
    assert sealed.actor_name not in served_segments(name)
    admin.delete_scalable_topic(topic)


def test_a_batch_writers_parts_refused_by_a_split_segment_go_to_its_children_once(
    admin: ScalableTopicsAdmin, unique: str
) -> None:
    """What a Spark batch write's task does (``clients._sink.write_chunks``), without Spark:
    chunk 1's record is opened against two segments, then segment 0 splits before its
    part is appended; the data plane refuses the part (``SegmentTerminated``), the
    cluster gives its range to the children, and every row is stored once, in order."""
    import asyncio

    import pyarrow as pa

    from actors.admin.caller import AdminServiceCaller
    from clients import _sink
    from clients._loop import background_loop

    topic = f"topic://{TENANT}/{NAMESPACE}/batch-{unique}"
    admin.create_scalable_topic(topic, 2)
    admin.wait_until_ready(topic, 60)
    split = []

    class SplitFirst(_sink.DataPlaneSegments):
        """The segments, segment 0 split just before chunk 1's first append to it."""

        async def append(self, segment: str, batch: pa.RecordBatch, producer: str, seq: int):
            if producer.endswith(":1") and segment.endswith(descriptor) and not split:
                split.append(await asyncio.to_thread(admin.split_segment, topic, 0))
                await asyncio.to_thread(admin.wait_until_ready, topic, 60)
            await super().append(segment, batch, producer, seq)

    descriptor = admin.get_layout(topic).get(0).name(TopicName.parse(topic)).descriptor
    chunks = [
        pa.RecordBatch.from_pydict(
            {
                "key": [f"k{i % 40}" for i in range(n * 200, n * 200 + 200)],
                "value": [f"v{i}".encode() for i in range(n * 200, n * 200 + 200)],
                "properties": pa.nulls(200, pa.map_(pa.string(), pa.string())),
            }
        )
        for n in range(3)
    ]
    write = _sink.write_chunks(
        AdminServiceCaller(), topic, f"w{unique}", 0, None, iter(chunks), SplitFirst(None)
    )
    rows, retried = background_loop().run(write)
    assert (rows, retried, len(split)) == (600, False, 1)
    assert admin.get_layout(topic).epoch == 1
    values = stored_values(topic, admin)
    assert sorted(values) == sorted(f"v{i}" for i in range(600))
    layout = admin.get_layout(topic)
    by_key: dict[str, list[int]] = defaultdict(list)  # the parent's rows, then its children's
    for segment_id in (0, 2, 3):
        handle = segment_actor(layout.get(segment_id).name(TopicName.parse(topic)))
        batch = ray.get(handle.read.remote(0, 1000))
        assert batch.num_rows > 0
        keys, values = batch.column("key").to_pylist(), batch.column("value").to_pylist()
        for key, value in zip(keys, values, strict=True):
            by_key[key].append(int(value.decode()[1:]))
    assert all(numbers == sorted(numbers) for numbers in by_key.values())  # per-key order
    admin.delete_scalable_topic(topic)
