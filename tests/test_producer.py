"""Producer batching on a real local Ray: sends that meet in a segment's queue go as one
append, and every send still learns exactly where its messages were stored."""

from __future__ import annotations

import os
import signal
import time
from collections import defaultdict

import pytest
import ray

from clients import Producer
from runtime.errors import (
    ClientClosedError,
    ProducerQueueFullError,
    SendTimeoutError,
    UnseenSendFailuresError,
)
from runtime.names import TopicName
from tests.segments import segment_actor


def _stored(admin, topic: str) -> dict[tuple[int, int], tuple[str, bytes]]:
    """(segment id, offset) -> (key, value) of everything in the topic's segments."""
    name, stored = TopicName.parse(topic), {}
    for info in admin.get_layout(topic).all_segments.values():
        segment = segment_actor(
            name.segment(info.segment_id, info.hash_range.start, info.hash_range.end)
        )
        batch = ray.get(segment.read.remote(0, 100_000))
        rows = zip(
            batch.column("offset").to_pylist(),
            batch.column("key").to_pylist(),
            batch.column("value").to_pylist(),
            strict=True,
        )
        for offset, key, value in rows:
            stored[(info.segment_id, offset)] = (key, value)
    return stored


def test_queued_sends_merge_into_one_append_and_each_learns_its_ids(admin, unique):
    topic = f"topic://public/default/merge-{unique}"
    admin.create_scalable_topic(topic, 2)
    sent: list[tuple[str, bytes, object]] = []  # (key, value, future | (future, row))
    with Producer(topic, window=1, linger_ms=50) as producer:
        for i in range(40):  # singles and batches interleaved, several keys per batch
            if i % 3 == 0:
                key, value = f"k{i % 7}", f"one-{i}".encode()
                sent.append((key, value, producer.send(value, key=key)))
                continue
            keys = [f"k{(i + j) % 7}" for j in range(5)]
            values = [f"bulk-{i}-{j}".encode() for j in range(5)]
            future = producer.send_batch(values, keys=keys)
            sent.extend(
                (k, v, (future, j)) for j, (k, v) in enumerate(zip(keys, values, strict=True))
            )
        producer.flush(timeout_s=60)
        appends = sum(sender.next_sequence for sender in producer._core.senders.values())
    # Without merging: 14 singles + 26 batches over 2 segments is at least 40 appends.
    assert appends < 20

    stored = _stored(admin, topic)
    assert len(stored) == len(sent) == 144
    by_key: dict[str, list[tuple[tuple[int, int], bytes]]] = defaultdict(list)
    for key, value, handle in sent:
        if isinstance(handle, tuple):
            result, row = handle[0].result(), handle[1]
            where = (int(result.segment_ids[row]), int(result.offsets[row]))
        else:
            message_id = handle.result()
            where = (message_id.segment_id, message_id.offset)
        assert stored[where] == (key, value)  # each send reports its own place
        by_key[key].append((where, value))
    for places in by_key.values():  # one segment per key, offsets in send order
        assert len({segment for (segment, _), _ in places}) == 1
        offsets = [offset for (_, offset), _ in places]
        assert offsets == sorted(offsets)
    admin.delete_scalable_topic(topic)


def test_close_with_a_timeout_fails_what_is_still_unanswered(admin, unique):
    """A segment that stops answering (its process stopped, as a hung machine would)
    must not make ``close(timeout_s)`` hang; the sends it never answered fail."""
    topic = f"topic://public/default/close-{unique}"
    admin.create_scalable_topic(topic, 1)
    name = TopicName.parse(topic).segment(0, 0, 0xFFFF)
    producer = Producer(topic)
    producer.send(b"first").result(timeout=60)  # connected and answering
    pid = ray.get(segment_actor(name).ready.remote())["pid"]
    os.kill(pid, signal.SIGSTOP)
    try:
        stuck = producer.send_batch([b"x"] * 10)
        started = time.monotonic()
        with pytest.raises(UnseenSendFailuresError, match="1 send to"):
            producer.close(timeout_s=1.0)  # nobody had looked at the stuck send's future
        assert time.monotonic() - started < 10
        with pytest.raises(SendTimeoutError, match="may or may not be stored"):
            stuck.result(timeout=0)
    finally:
        os.kill(pid, signal.SIGCONT)
    with pytest.raises(ClientClosedError):
        producer.send(b"late")
    admin.delete_scalable_topic(topic)


def test_failed_sends_that_nobody_looked_at_are_raised_when_the_producer_closes(admin, unique):
    """Leaving ``with Producer(...)`` while sends failed unseen raises how many and the
    first cause; a failure the caller looked at, or an exception already leaving the
    block, is not raised again."""
    topic = f"topic://public/default/unseen-{unique}"
    admin.create_scalable_topic(topic, 1)
    name = TopicName.parse(topic).segment(0, 0, 0xFFFF)
    pid = ray.get(segment_actor(name).ready.remote())["pid"]
    with Producer(topic) as producer:
        producer.send(b"first").result(timeout=60)
    os.kill(pid, signal.SIGSTOP)  # from now on every send times out
    try:
        unseen = pytest.raises(UnseenSendFailuresError)
        with unseen as raised, Producer(topic, send_timeout_s=1.0) as producer:
            for i in range(3):
                producer.send(f"lost-{i}".encode())
            producer.flush()  # raises nothing itself (as Kafka's flush)
        assert raised.value.failed == 3 and raised.value.code == "send_failed"
        assert "3 sends to" in raised.value.message and "SendTimeoutError" in raised.value.message
        with Producer(topic, send_timeout_s=1.0) as producer:
            seen = producer.send(b"looked-at")
            assert isinstance(seen.exception(timeout=30), SendTimeoutError)
        with pytest.raises(KeyError), Producer(topic, send_timeout_s=1.0) as producer:
            producer.send(b"unseen, but the block's own error wins")
            producer.flush()
            raise KeyError("the caller's")
    finally:
        os.kill(pid, signal.SIGCONT)
    admin.delete_scalable_topic(topic)


def test_the_in_flight_budget_refuses_when_full_and_is_released_exactly(admin, unique):
    """``block_if_full=False`` raises once the budget is spent; when the segment answers,
    merged and split chunks alike give back exactly what their sends were charged."""
    topic = f"topic://public/default/budget-{unique}"
    admin.create_scalable_topic(topic, 2)
    name = TopicName.parse(topic).segment(0, 0, 0x7FFF)
    producer = Producer(topic, max_in_flight_bytes=25_000, block_if_full=False, linger_ms=20)
    producer.send_batch([b"warm"] * 4, keys=["a", "b", "c", "d"]).result(timeout=60)
    pid = ray.get(segment_actor(name).ready.remote())["pid"]
    os.kill(pid, signal.SIGSTOP)
    try:
        keys = [f"k{i}" for i in range(60)]
        sent = [producer.send_batch([b"v" * 100] * 60, keys=keys) for _ in range(2)]
        sent.append(producer.send(b"one", key="k1"))
        with pytest.raises(ProducerQueueFullError, match="limit 25000"):
            producer.send_batch([b"v" * 100] * 60, keys=keys)
    finally:
        os.kill(pid, signal.SIGCONT)
    for future in sent:
        future.result(timeout=60)
    assert producer._core.outstanding_bytes == 0
    producer.close()
    admin.delete_scalable_topic(topic)


def test_a_producer_given_its_id_keeps_one_append_per_send(admin, unique):
    """Its sequences must name the same rows when it resends after a restart (a retried
    Spark task): merging, which depends on timing, would break that."""
    topic = f"topic://public/default/fixed-id-{unique}"
    admin.create_scalable_topic(topic, 1)
    with Producer(topic, producer_id=f"writer-{unique}", window=1, linger_ms=50) as producer:
        futures = [producer.send_batch([f"{i}".encode()] * 5) for i in range(10)]
        for future in futures:
            future.result(timeout=60)
        assert producer._core.senders[0].next_sequence == 10
    admin.delete_scalable_topic(topic)


def _connected(producer: Producer, segment_ids: set[int]) -> bool:
    senders = producer._core.senders
    return all(
        sid in senders
        and senders[sid].channel is not None
        and senders[sid].channel._writer is not None
        for sid in segment_ids
    )


def test_a_producer_connects_to_every_active_segment_before_its_first_send(admin, unique):
    """A cold first send waited ~50 ms for the segment actor's address and a TCP
    handshake; a producer now connects to every active segment as it starts (as
    Pulsar's partitioned producer does), and to the children of a split."""
    topic = f"topic://public/default/ahead-{unique}"
    admin.create_scalable_topic(topic, 4)
    with Producer(topic) as producer:
        deadline = time.monotonic() + 30
        active = set(admin.get_layout(topic).active_segments)
        while not _connected(producer, active) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert _connected(producer, active)
        assert all(s.next_sequence == 0 for s in producer._core.senders.values())  # no send yet

        admin.split_segment(topic, min(active))
        children = set(admin.get_layout(topic).active_segments) - active
        while not _connected(producer, children) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert _connected(producer, children)
        producer.send(b"after", key="k").result(timeout=30)
