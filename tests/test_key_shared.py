"""Key-shared stream subscriptions: more consumers than segments, each with a share.

A stream subscription with more consumers than readable segments cuts segments into
runs of key buckets (``runtime.assignment``); every consumer reads, each key from one
consumer at a time, and acknowledged messages are not read again when buckets move.
"""

from __future__ import annotations

import contextlib
import itertools
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Iterator

import pytest
import ray

from clients import Producer, ScalableTopicsAdmin, StreamConsumer
from tests.test_clients import wait_for

KEYS = 200


@pytest.fixture(scope="module")
def admin(ray_cluster) -> ScalableTopicsAdmin:
    return ScalableTopicsAdmin()


class Reader:
    """One stream consumer on a thread: what it receives, stamped in one order for all
    readers (a message is stamped before it is acknowledged, so a key's next reader
    stamps its messages after the last reader's)."""

    stamps = itertools.count()
    lock = threading.Lock()
    running: set[Reader] = set()  # closed after each test, whatever its outcome

    def __init__(self, topic: str, name: str, sink: list) -> None:
        self.name, self.sink, self.got = name, sink, 0
        Reader.running.add(self)
        self.consumer = StreamConsumer(topic, "work", name, poll_timeout_s=1.0)
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self.stop.is_set():
            batch = self.consumer.receive_batch(200, timeout=0.2)
            with Reader.lock:
                for message in batch:
                    self.sink.append((message.value.decode(), self.name, next(Reader.stamps)))
            self.got += len(batch)
            if batch:
                self.consumer.acknowledge_cumulative(batch)

    def close(self) -> None:
        Reader.running.discard(self)
        self.stop.set()
        self.thread.join()
        self.consumer.close()


@pytest.fixture(autouse=True)
def _readers_closed() -> Iterator[None]:
    """A failed test's readers are closed too: left polling, their calls would meet the
    session's Ray as it shuts down."""
    yield
    for reader in list(Reader.running):
        with contextlib.suppress(Exception):
            reader.close()


def produce(topic: str, rounds: range) -> list[str]:
    sent = []
    with Producer(topic) as producer:
        for round_ in rounds:
            for key in range(KEYS):
                value = f"k{key}:{round_}"
                producer.send(value.encode(), key=f"k{key}")
                sent.append(value)
        producer.flush()
    return sent


def test_twelve_consumers_share_four_segments_by_key_through_joins_leaves_splits_merges(
    admin, unique
) -> None:
    topic = f"topic://shared/ns/t-{unique}"
    admin.create_scalable_topic(topic, 4)
    admin.create_subscription(topic, "work")
    received: list[tuple[str, str, int]] = []
    readers = {f"c{i}": Reader(topic, f"c{i}", received) for i in range(12)}
    sent = produce(topic, range(0, 20))
    wait_for(lambda: all(r.got for r in readers.values()), 60, lambda: _counts(readers))

    admin.split_segment(topic, 0)  # 5 active segments, still fewer than consumers
    sent += produce(topic, range(20, 30))
    readers.pop("c3").close()  # one leaves, another joins
    readers["c12"] = Reader(topic, "c12", received)
    sent += produce(topic, range(30, 40))
    layout = admin.get_layout(topic)
    active = sorted(layout.active_segments.values(), key=lambda s: s.hash_range.start)
    admin.merge_segments(topic, active[0].segment_id, active[1].segment_id)
    sent += produce(topic, range(40, 60))

    wait_for(lambda: len(received) >= len(sent), 120, lambda: f"{len(received)}/{len(sent)}")
    time.sleep(1.0)  # anything delivered twice would arrive by now
    got = Counter(value for value, _, _ in received)
    twice = {v for v, n in got.items() if n > 1}
    assert not twice, f"delivered twice (value, reader, stamp): {_who(received, twice)}"
    assert set(got) == set(sent)
    by_reader = Counter(name for _, name, _ in received)
    assert all(by_reader[name] for name in readers), by_reader  # everyone read a share
    rounds: dict[str, list[int]] = defaultdict(list)
    for value, _, _ in sorted(received, key=lambda r: r[2]):
        key, round_ = value.split(":")
        rounds[key].append(int(round_))
    assert all(r == sorted(r) for r in rounds.values()), "a key's order broke"
    for reader in readers.values():
        reader.close()
    stats = admin.get_stats(topic)["subscriptions"]["work"]
    assert stats["backlog"] == 0, stats
    admin.delete_scalable_topic(topic)


def _who(received: list[tuple[str, str, int]], values: set[str]) -> list:
    return sorted((r for r in received if r[0] in values), key=lambda r: r[2])[:40]


def _counts(readers: dict[str, Reader]) -> str:
    return str({name: r.got for name, r in readers.items()})


def test_a_consumer_per_segment_or_fewer_reads_whole_segments(admin, unique) -> None:
    """Sharing starts only past one consumer a segment: two consumers of two segments
    hold one each, a third cuts one of them in two, and its leaving makes it whole."""
    from actors.control.coordinator_host import coordinator_actor
    from runtime.names import TopicName

    topic = f"topic://shared/ns/w-{unique}"
    admin.create_scalable_topic(topic, 2)
    admin.create_subscription(topic, "work")
    coordinator = coordinator_actor(TopicName.parse(topic), "work")

    def shares() -> list[dict]:
        return ray.get(coordinator.snapshot.remote())["owners"]

    first = [StreamConsumer(topic, "work", f"c{i}", poll_timeout_s=1.0) for i in range(2)]
    wait_for(lambda: len(shares()) == 2 and all("buckets" not in s for s in shares()), 30)
    third = StreamConsumer(topic, "work", "c2", poll_timeout_s=1.0)
    wait_for(lambda: len(shares()) == 3, 30, lambda: str(shares()))
    cut = [s for s in shares() if "buckets" in s]
    assert [s["buckets"] for s in cut] == [
        {"start": 0, "end": 128, "count": 256},
        {"start": 128, "end": 256, "count": 256},
    ]
    shown = admin.get_stats(topic)["subscriptions"]["work"]["buckets"]  # what the console shows
    assert sorted(
        (c, int(seg), b["start"], b["end"]) for c, held in shown.items() for seg, b in held.items()
    ) == sorted(
        (s["consumer"], s["segmentId"], s["buckets"]["start"], s["buckets"]["end"]) for s in cut
    )
    third.close()
    wait_for(lambda: len(shares()) == 2 and all("buckets" not in s for s in shares()), 30)
    for consumer in first:
        consumer.close()
    admin.delete_scalable_topic(topic)


def _steady(topic: str, per_s: int, stop: threading.Event) -> None:
    """Send ``per_s`` keyed messages a second until told to stop."""
    with Producer(topic) as producer:
        sent = 0
        started = time.monotonic()
        while not stop.is_set():
            due = int((time.monotonic() - started) * per_s)
            for i in range(sent, due):
                producer.send(b"x", key=f"k{i % 500}")
            sent = max(sent, due)
            time.sleep(0.02)


@pytest.mark.parametrize("loaded", [True, False], ids=["loaded", "idle"])
def test_consumers_joining_split_a_loaded_topic_and_rebucket_an_idle_one(
    admin, unique, loaded: bool
) -> None:
    """Two segments at 0.7 of their target each (no reason to split by load), then four
    stream consumers join: the busiest splits. With no load, the same consumers leave
    the layout as it is and share it by key bucket."""
    topic = f"topic://shared/ns/scale-{unique}"
    admin.create_scalable_topic(topic, 2)
    admin.create_subscription(topic, "work")
    # minSegments 2: the idle topic's two cold segments would otherwise merge (its policy
    # applies from the moment it is set), and the consumers would join one segment
    policy = {
        "targetMsgsPerS": 500, "windowS": 2, "cooldownS": 0, "consumerSplitLoad": 0.5,
        "minSegments": 2,
    }  # fmt: skip
    admin.set_policy(topic, {"autoscale": policy})
    stop = threading.Event()
    producing = threading.Thread(target=_steady, args=(topic, 700 if loaded else 0, stop))
    producing.start()
    try:
        time.sleep(5)  # two windows measured: nothing to do without consumers
        assert len(admin.get_layout(topic).active_segments) == 2
        consumers = [StreamConsumer(topic, "work", f"c{i}", poll_timeout_s=1.0) for i in range(4)]

        def autoscale() -> dict:
            return admin.get_stats(topic)["autoscale"]

        if loaded:
            wait_for(lambda: len(admin.get_layout(topic).active_segments) > 2, 30, autoscale)
        else:
            wait_for(lambda: (autoscale() or {}).get("rebucket") is not None, 30, autoscale)
            time.sleep(4)  # two more windows: still no split
            assert len(admin.get_layout(topic).active_segments) == 2
            assert "4 stream consumers on 2 segments" in autoscale()["rebucket"]["reason"]
            shown = admin.get_stats(topic)["subscriptions"]["work"]["buckets"]
            assert len(shown) == 4, shown  # each consumer holds a run of a segment's buckets
        for consumer in consumers:
            consumer.close()
    finally:
        stop.set()
        producing.join()
    admin.delete_scalable_topic(topic)
