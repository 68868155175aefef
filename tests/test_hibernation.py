"""Hibernation of sealed segments on a topic without tiering: once every subscription has
acknowledged all of a sealed segment and nothing has used it for the policy's ``idleS``,
its actor exits (its files stay); observing it does not wake it; the next reader
starts it again where its files are, and nothing is lost or reordered.
"""

from __future__ import annotations

import time
from collections import defaultdict
from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st
from test_tiering import produce, read_all, running_segments
from waiting import wait_for

from clients import ScalableTopicsAdmin, StreamConsumer
from runtime.hibernation import idle_drained, idle_tiered
from runtime.policy import TopicPolicy


def _stats(**fields) -> dict:  # noqa: ANN003
    base = {"terminated": True, "tiered": False, "hibernating": False, "idleS": 10.0}
    return base | {"subscriptions": {"a": {"backlog": 0}}} | fields


def test_only_sealed_drained_idle_local_segments_may_sleep() -> None:
    stats = {
        1: _stats(),
        2: _stats(terminated=False),  # active
        3: _stats(subscriptions={"a": {"backlog": 0}, "b": {"backlog": 4}}),  # owed to b
        4: _stats(idleS=2.0),  # used lately
        5: _stats(tiered=True),  # the tier's own idleS decides
        6: _stats(hibernating=True),  # already asleep
        7: _stats(subscriptions={}),  # nobody subscribed: nothing owed
    }
    assert idle_drained(stats, 5.0) == [1, 7]
    assert idle_tiered(stats, 5.0) == [5]


@given(st.dictionaries(st.integers(0, 20), st.fixed_dictionaries({
    "terminated": st.booleans(), "tiered": st.booleans(), "hibernating": st.booleans(),
    "idleS": st.floats(0, 100), "subscriptions": st.dictionaries(
        st.sampled_from("abc"), st.fixed_dictionaries({"backlog": st.integers(0, 3)})),
})), st.floats(0, 100))  # fmt: skip
def test_a_segment_that_may_sleep_owes_nothing_and_is_sealed_idle_and_local(
    stats: dict, idle_s: float
) -> None:
    for segment_id in idle_drained(stats, idle_s):
        st_ = stats[segment_id]
        assert st_["terminated"] and not st_["tiered"] and not st_["hibernating"]
        assert st_["idleS"] >= idle_s
        assert all(sub["backlog"] == 0 for sub in st_["subscriptions"].values())


def test_a_namespace_default_hibernation_applies_unless_the_topic_sets_its_own() -> None:
    default = TopicPolicy.parse({"hibernation": {"idleS": 30}})
    assert TopicPolicy().over(default).hibernation.idle_s == 30
    own = TopicPolicy.parse({"hibernation": {}})
    assert own.hibernation.idle_s == 300 and own.over(default).hibernation.idle_s == 300


def drain(topic: str, subscription: str, expected: int) -> int:
    consumer = StreamConsumer(topic, subscription, "c")
    received = 0
    deadline = time.monotonic() + 60
    while received < expected and time.monotonic() < deadline:
        messages = consumer.receive_batch(500, timeout=2)
        received += len(messages)
        if messages:
            consumer.acknowledge_cumulative(messages)
    consumer.close()
    return received


def test_drained_sealed_segments_sleep_and_the_next_reader_wakes_them(
    admin: ScalableTopicsAdmin, unique: str, tmp_path: Path
) -> None:
    topic = f"topic://hibernate/ns/t-{unique}"
    admin.create_scalable_topic(topic, 2)
    admin.create_subscription(topic, "a", "earliest")
    admin.create_subscription(topic, "b", "earliest")
    admin.set_policy(topic, {"hibernation": {"idleS": 1}})
    sent: list[tuple[str, int]] = []
    count: dict[str, int] = defaultdict(int)
    produce(topic, sent, count, 400)
    admin.split_segment(topic, 0)
    admin.split_segment(topic, 1)
    produce(topic, sent, count, 400)
    layout = admin.get_layout(topic)
    sealed = {i for i, info in layout.all_segments.items() if not info.is_active}
    assert drain(topic, "a", 800) == 800

    # "b" still has everything to read: the sealed segments keep their processes.
    time.sleep(6)  # several maintenance rounds, well past idleS
    stats = admin.get_stats(topic)
    assert not any(stats["segments"][str(i)]["hibernating"] for i in sealed)
    assert sealed <= running_segments(admin, topic)

    assert drain(topic, "b", 800) == 800

    def asleep() -> dict | None:
        stats = admin.get_stats(topic)
        return stats if all(stats["segments"][str(i)]["hibernating"] for i in sealed) else None

    stats = wait_for(asleep)
    assert running_segments(admin, topic) == set(layout.active_segments)  # no process
    assert stats["hibernatingSegments"] == 2 and stats["tieredBytes"] == 0
    assert sum(s["records"] for s in stats["segments"].values()) == 800
    assert stats["subscriptions"]["a"]["backlog"] == stats["subscriptions"]["b"]["backlog"] == 0
    assert admin.wait_until_ready(topic, 5)["state"] == "ready"
    time.sleep(3)  # observing (stats, maintenance, readiness) woke nothing
    assert running_segments(admin, topic) == set(layout.active_segments)

    # A new subscription from Earliest wakes them, and gets everything in order.
    received = read_all(admin, topic, "late", len(sent))
    assert sorted(received) == sorted(sent)
    last: dict[str, int] = {}
    for key, sequence in received:
        assert last.get(key, -1) == sequence - 1, (key, sequence)
        last[key] = sequence
    # drained by it too, they sleep again, their cursors as the reader left them
    stats = wait_for(asleep)
    assert all(stats["segments"][str(i)]["subscriptions"]["late"]["backlog"] == 0 for i in sealed)
    assert running_segments(admin, topic) == set(layout.active_segments)

    # retention prunes sleeping segments without waking them
    admin.set_policy(topic, {"hibernation": {"idleS": 1}, "retention": {"timeS": 0}})
    wait_for(lambda: not set(admin.get_layout(topic).all_segments) & sealed)
    admin.delete_scalable_topic(topic)
