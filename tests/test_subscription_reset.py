"""Resetting a subscription in time on a real topic: to a publish time (through a split:
segments that end before it count as finished, parents still before children), to
earliest and latest, clearing the backlog; and what is refused, with nothing changed.
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import pytest
from test_tiering import produce as produce_keyed

from clients import CheckpointConsumer, ScalableTopicsAdmin, StreamConsumer
from clients.checkpoint_consumer import Checkpoint
from clients.ray_data import read_topic_dataset
from runtime.errors import ConflictError, InvalidArgumentError, SubscriptionNotFoundError
from runtime.subscription import reset_ms, reset_target


def produce(topic: str, count: dict[str, int], n: int) -> list[tuple[str, int]]:
    """``n`` more ``key:sequence`` messages; returns them as (key, sequence)."""
    sent: list[tuple[str, int]] = []
    produce_keyed(topic, sent, count, n)
    return sent


@pytest.fixture
def topic(admin: ScalableTopicsAdmin, unique: str) -> Iterator[str]:
    """A topic of two segments with subscription ``s`` at Earliest."""
    name = f"topic://reset/ns/t-{unique}"
    admin.create_scalable_topic(name, 2)
    admin.create_subscription(name, "s", "earliest")
    yield name
    admin.delete_scalable_topic(name)


def receive(topic: str, subscription: str, expected: int) -> list[tuple[str, int, int]]:
    """(key, sequence, segment) of what a stream consumer gets, in order: ``expected``
    messages, then 2 s more to see any that should not come."""
    consumer = StreamConsumer(topic, subscription, "c")
    got: list[tuple[str, int, int]] = []
    deadline = time.monotonic() + 60
    quiet_until = None
    while time.monotonic() < deadline:
        batch = consumer.receive_batch(500, timeout=0.5)
        got += [(m.key, int(m.value.decode().split(":")[1]), m.segment_id) for m in batch]
        if batch:
            consumer.acknowledge_cumulative(batch)
        if len(got) >= expected:
            quiet_until = quiet_until or time.monotonic() + 2
            if time.monotonic() >= quiet_until:
                break
    consumer.close()
    return got


def in_key_order(got: list[tuple[str, int, int]]) -> bool:
    last: dict[str, int] = {}
    for key, seq, _ in got:
        if key in last and seq != last[key] + 1:
            return False
        last[key] = seq
    return True


def test_targets_are_checked_before_anything_is_asked() -> None:
    assert reset_target("earliest") == "earliest" and reset_target(1764000000000) == 1764000000000
    for bad in ("yesterday", -1, 1764000000, True, 1.5e12, None):  # seconds, not ms: refused
        with pytest.raises(InvalidArgumentError, match="earliest.*latest.*milliseconds"):
            reset_target(bad)
    moment = datetime(2001, 9, 9, 1, 46, 40, tzinfo=UTC)  # 10**9 seconds after 1970
    assert reset_ms(moment) == 1_000_000_000_000
    with pytest.raises(InvalidArgumentError, match="timezone"):
        reset_ms(datetime(2026, 11, 26, 10, 0))


def test_a_reset_to_a_time_replays_exactly_what_came_after_it(
    admin: ScalableTopicsAdmin, topic: str
) -> None:
    count: dict[str, int] = defaultdict(int)
    phase_a = produce(topic, count, 300)
    time.sleep(0.05)
    t1 = datetime.now(UTC)
    time.sleep(0.05)
    phase_b = produce(topic, count, 300)
    admin.split_segment(topic, 0)
    phase_c = produce(topic, count, 300)
    everything = phase_a + phase_b + phase_c
    assert len(receive(topic, "s", len(everything))) == len(everything)  # all acknowledged

    done = admin.reset_subscription(topic, "s", t1)
    assert not done["inTheFuture"] and len(done["positions"]) == 4
    got = receive(topic, "s", len(phase_b + phase_c))
    assert sorted((k, s) for k, s, _ in got) == sorted(phase_b + phase_c)
    assert in_key_order(got)
    children = set(admin.get_layout(topic).get(0).child_ids)
    assert {segment for _, _, segment in got} & children, "the split's children were read"

    # the same moment for readers that keep their own positions
    start = Checkpoint.at_timestamp(topic, t1)
    assert start.finished == () and start.positions[0] > 0  # past phase A, not finished
    reader = CheckpointConsumer(topic, "cp", "r", start=start)
    taken: list[tuple[str, int, int]] = []
    deadline = time.monotonic() + 60
    while len(taken) < len(phase_b + phase_c) and time.monotonic() < deadline:
        batch = reader.receive_batch(500, timeout=0.5)
        taken += [(m.key, int(m.value.decode().split(":")[1]), m.segment_id) for m in batch]
    taken += [(m.key, 0, 0) for m in reader.receive_batch(500, timeout=2)]  # none more
    reader.close()
    assert sorted((k, s) for k, s, _ in taken) == sorted(phase_b + phase_c)
    assert in_key_order(taken)
    assert read_topic_dataset(topic, start=t1).count() == len(phase_b + phase_c)
    assert read_topic_dataset(topic, end=t1).count() == len(phase_a)
    later_ms = int(t1.timestamp() * 1000) + 10**9
    assert read_topic_dataset(topic, start=later_ms).count() == 0

    admin.reset_subscription(topic, "s", "earliest")
    got = receive(topic, "s", len(everything))
    assert sorted((k, s) for k, s, _ in got) == sorted(everything) and in_key_order(got)

    admin.reset_subscription(topic, "s", "earliest")
    assert admin.get_stats(topic)["subscriptions"]["s"]["backlog"] == len(everything)
    admin.clear_backlog(topic, "s")
    assert admin.get_stats(topic)["subscriptions"]["s"]["backlog"] == 0
    assert receive(topic, "s", 0) == []
    later = produce(topic, count, 50)  # what comes after a clear is received
    assert sorted((k, s) for k, s, _ in receive(topic, "s", 50)) == sorted(later)

    admin.reset_subscription(topic, "s", t1)
    admin.reset_subscription(topic, "s", "latest")  # latest: nothing left either
    assert receive(topic, "s", 0) == []


def test_refusals_name_what_is_allowed_and_change_nothing(
    admin: ScalableTopicsAdmin, topic: str
) -> None:
    count: dict[str, int] = defaultdict(int)
    produce(topic, count, 100)
    before = admin.get_stats(topic)["subscriptions"]["s"]["backlog"]

    with pytest.raises(SubscriptionNotFoundError, match="no subscription 'nope'"):
        admin.reset_subscription(topic, "nope", "earliest")
    with pytest.raises(InvalidArgumentError, match="earliest.*latest"):
        admin.reset_subscription(topic, "s", "an hour ago")
    consumer = StreamConsumer(topic, "s", "connected")
    consumer.receive_batch(10, timeout=2)
    with pytest.raises(ConflictError, match="registered consumer.*connected.*close them"):
        admin.reset_subscription(topic, "s", "latest")
    consumer.close()
    assert admin.get_stats(topic)["subscriptions"]["s"]["backlog"] == before

    # a time still to come: every cursor at its end, and said so
    done = admin.reset_subscription(topic, "s", datetime.now(UTC) + timedelta(days=1))
    assert done["inTheFuture"]
    assert admin.get_stats(topic)["subscriptions"]["s"]["backlog"] == 0
