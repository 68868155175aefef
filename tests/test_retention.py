"""Retention on a real local Ray: drained sealed segments leave the DAG and the disk."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

from test_clients import Collector, wait_for

from clients import Producer, StreamConsumer
from runtime.names import TopicName
from storage.topic_storage import segment_directory


def test_twenty_split_merge_cycles_leave_only_active_segments(admin, unique) -> None:
    topic = f"topic://retain/ns/t-{unique}"
    name = TopicName.parse(topic)
    root = Path(os.environ["RAYTOPICS_STORAGE_ROOT"])
    admin.create_scalable_topic(topic, 1)
    admin.create_subscription(topic, "fast")
    admin.create_subscription(topic, "slow")
    admin.set_policy(topic, {"retention": {"timeS": 0}})
    received: list[tuple] = []
    fast = Collector(StreamConsumer(topic, "fast", "f"), received, threading.Event())
    with Producer(topic) as producer:
        for cycle in range(20):
            for i in range(20):
                producer.send(f"{cycle}:{i}".encode(), key=f"k{i}")
            producer.flush()
            (only,) = admin.get_layout(topic).active_segments
            admin.split_segment(topic, only)
            admin.merge_segments(topic, *admin.get_layout(topic).active_segments)
    wait_for(lambda: len(received) >= 400, 60, "the fast subscription to drain")
    layout = admin.get_layout(topic)
    assert 0 in layout.all_segments, "'slow' has a backlog on segment 0: retention must keep it"
    segments = {i: name.segment(i, s.hash_range.start, s.hash_range.end)
                for i, s in layout.all_segments.items()}  # fmt: skip
    assert len(segments) == 61
    incarnation = admin.get_stats(topic)["incarnation"]

    slow_received: list[tuple] = []
    slow = Collector(StreamConsumer(topic, "slow", "s"), slow_received, threading.Event())
    wait_for(lambda: len(slow_received) >= 400, 90, "the slow subscription to drain")
    wait_for(lambda: len(admin.get_layout(topic).all_segments) == 1, 60, "pruning")
    layout = admin.get_layout(topic)
    (active,) = layout.active_segments
    assert active == 60 and layout.get(active).parent_ids == ()
    layout.check_invariants()
    gone = [i for i, seg in segments.items() if i != active]
    assert all(not segment_directory(root, segments[i], incarnation).exists() for i in gone)
    assert segment_directory(root, segments[active], incarnation).exists()
    stats = admin.get_stats(topic)
    assert stats["sealedSegments"] == 0 and stats["subscriptions"]["slow"]["backlog"] == 0
    fast.close()
    slow.close()
    admin.delete_scalable_topic(topic)
    assert not any(segment_directory(root, s, incarnation).exists() for s in segments.values())


def test_active_segments_are_truncated_by_time(admin, unique) -> None:
    topic = f"topic://retain/ns/a-{unique}"
    admin.create_scalable_topic(topic, 1)
    with Producer(topic) as producer:
        for i in range(50):
            producer.send(b"x" * 100, key=str(i))
    admin.set_policy(topic, {"retention": {"timeS": 1}})
    time.sleep(1)

    def emptied() -> bool:
        return admin.get_stats(topic)["segments"]["0"]["records"] == 0

    wait_for(emptied, 30, "time retention of the active segment")
    assert admin.get_stats(topic)["segments"]["0"]["endOffset"] == 50
    admin.delete_scalable_topic(topic)
