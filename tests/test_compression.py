"""Producer compression: appends travel and are stored as Arrow IPC with a compressed
body, and every reader (stream consumers, bulk reads) gets the records back exactly."""

from __future__ import annotations

import json
import time

import pytest

from clients import Producer, QueueConsumer, ScalableTopicsAdmin, StreamConsumer
from clients.ray_data import read_topic_dataset
from runtime.batch import deserialize_batch, make_batch, serialize_batch
from runtime.errors import InvalidArgumentError

COUNT = 3_000


def events() -> list[tuple[str, bytes]]:
    """Repetitive JSON, as event streams are: few users, pages and kinds."""
    found = []
    for i in range(COUNT):
        body = {"user": f"user-{i % 40}", "event": "page_view", "page": f"/p/{i % 12}", "n": i}
        found.append((f"user-{i % 40}", json.dumps(body).encode()))
    return found


def test_a_compressed_batch_decodes_to_the_same_records() -> None:
    batch = make_batch([v for _, v in events()], [k for k, _ in events()])
    plain = serialize_batch(batch)
    for codec in ("zstd", "lz4"):
        packed = serialize_batch(batch, codec)
        assert len(packed) * 3 < len(plain), codec
        assert deserialize_batch(packed).equals(batch)
    values_only = make_batch([b"x" * 100] * 50)
    assert deserialize_batch(serialize_batch(values_only, "zstd")).equals(values_only)


def test_an_unknown_codec_is_refused_naming_the_known_ones(monkeypatch) -> None:
    # refused before any Ray is joined: a process not connected yet would fail to reach
    # this address instead (unless another test of this process connected it already)
    monkeypatch.setenv("RAY_ADDRESS", "127.0.0.1:1")
    with pytest.raises(InvalidArgumentError, match="'zstd', 'lz4' or None.*gzip"):
        Producer("topic://compress/ns/never", compression="gzip")
    with pytest.raises(InvalidArgumentError, match="data plane transport"):
        Producer("topic://compress/ns/never", compression="zstd", transport="ray")
    with pytest.raises(TypeError, match="batch_bytes"):
        Producer("topic://compress/ns/never", batch_bytes=1)  # a misspelt option
    with pytest.raises(TypeError, match="receive_batch_size"):
        QueueConsumer("topic://compress/ns/never", "s", receive_batch_size=10)


def _stored_bytes(admin: ScalableTopicsAdmin, topic: str) -> int:
    deadline = time.monotonic() + 30
    while (stats := admin.get_stats(topic))["records"] < COUNT:
        assert time.monotonic() < deadline, stats["records"]
        time.sleep(0.2)
    return stats["sizeBytes"]


def test_zstd_shrinks_repetitive_values_on_disk_and_reads_back_exactly(
    admin: ScalableTopicsAdmin, unique: str
) -> None:
    sent = events()
    sizes = {}
    for codec in (None, "zstd", "lz4"):
        topic = f"topic://compress/ns/{codec or 'none'}-{unique}"
        admin.create_scalable_topic(topic, 2)
        admin.create_subscription(topic, "s")
        with Producer(topic, compression=codec) as producer:
            for key, value in sent:
                producer.send(value, key=key)
        sizes[codec] = _stored_bytes(admin, topic)
        consumer = StreamConsumer(topic, "s", "c")
        got: list[tuple[str, bytes]] = []
        while len(got) < COUNT:
            batch = consumer.receive_batch(1_000, timeout=10)
            assert batch, f"{codec}: {len(got)} of {COUNT}"
            got += [(m.key, m.value) for m in batch]
            consumer.acknowledge_cumulative(batch)
        consumer.close()
        assert sorted(got) == sorted(sent), codec
        rows = read_topic_dataset(topic).take_all()
        assert sorted((r["key"], r["value"]) for r in rows) == sorted(sent), codec
        admin.delete_scalable_topic(topic)
    assert sizes[None] >= 3 * sizes["zstd"], sizes
    assert sizes[None] > sizes["lz4"], sizes
