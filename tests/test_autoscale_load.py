"""Automatic scaling under a real load ramp on a local Ray: grows, shrinks, never flaps.

Rates are tiny (a segment's target is 100 msgs/s) and windows short, set
through the topic's policy, so the whole ramp fits in about a minute.
"""

from __future__ import annotations

import threading
import time

from test_clients import Collector, check_delivery, wait_for

from clients import Producer, ScalableTopicsAdmin, StreamConsumer
from runtime.layout import SegmentLayout

TARGET, COOLDOWN_S = 100, 1.5
POLICY = {
    "autoscale": {
        "targetMsgsPerS": TARGET,
        "scaleFactor": 2,
        "minSegments": 1,
        "maxSegments": 8,
        "cooldownS": COOLDOWN_S,
        "windowS": 1.5,
    }
}


class LayoutRecorder:
    """Polls the layout and notes when each epoch was first seen."""

    def __init__(self, admin: ScalableTopicsAdmin, topic: str) -> None:
        self.admin, self.topic = admin, topic
        self.seen: dict[int, float] = {}
        self.latest: SegmentLayout = admin.get_layout(topic)
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self.stop.wait(0.1):
            self.latest = self.admin.get_layout(self.topic)
            self.seen.setdefault(self.latest.epoch, time.monotonic())

    def active(self) -> int:
        return len(self.latest.active_segments)

    def close(self) -> None:
        self.stop.set()
        self.thread.join()


def produce(producer: Producer, rate: float, seconds: float, sent: list) -> None:
    """Keyed messages at ``rate`` msgs/s, in 50 ms slices; values number them per key."""
    slices = int(seconds / 0.05)
    for _ in range(slices):
        started = time.monotonic()
        for _ in range(int(rate * 0.05)):
            key = f"k{len(sent) % 50}"
            value = f"0:{len(sent)}"
            producer.send(value.encode(), key=key)
            sent.append((key, value))
        time.sleep(max(0.0, 0.05 - (time.monotonic() - started)))


def flaps(layout: SegmentLayout, seen: dict[int, float]) -> list[str]:
    """Merges that undid a split (same range) sooner than the cool-down allows."""
    found = []
    for merged in layout.all_segments.values():
        if len(merged.parent_ids) != 2:
            continue
        a, b = (layout.get(p) for p in merged.parent_ids)
        if a.parent_ids == b.parent_ids and len(a.parent_ids) == 1:  # siblings of one split
            gap = seen[merged.created_at_epoch] - seen[a.created_at_epoch]
            if gap < COOLDOWN_S - 0.3:
                found.append(f"split {a.parent_ids[0]} undone by {merged.segment_id} in {gap:.1f}s")
    return found


def test_ramp_up_grows_ramp_down_shrinks_without_flapping_or_loss(admin, unique) -> None:
    topic = f"topic://autoscale/ns/t-{unique}"
    admin.create_scalable_topic(topic, 1)
    admin.create_subscription(topic, "all")
    admin.set_policy(topic, POLICY)
    recorder = LayoutRecorder(admin, topic)
    received: list[tuple] = []
    collector = Collector(StreamConsumer(topic, "all", "c"), received, threading.Event())
    sent: list[tuple[str, str]] = []
    peak = 0
    with Producer(topic) as producer:
        for multiple in range(1, 7):  # 1x .. 6x a segment's target
            produce(producer, TARGET * multiple, 1.0, sent)
        deadline = time.monotonic() + 60
        while recorder.active() < 4 and time.monotonic() < deadline:
            produce(producer, TARGET * 6, 1.0, sent)
        peak = recorder.active()
        produce(producer, TARGET * 6, 2.0, sent)
        for multiple in range(6, 0, -1):  # and back down
            produce(producer, TARGET * multiple, 0.5, sent)
        producer.flush()
    assert peak >= 4, f"only {peak} active segments at 6x the target"
    wait_for(lambda: recorder.active() == 1, 90, "the topic to shrink back to minSegments")
    wait_for(lambda: len(received) >= len(sent), 60, "every message")
    (only,) = admin.get_layout(topic).active_segments
    admin.split_segment(topic, only)  # manual operations work alongside the policy...
    wait_for(lambda: recorder.active() == 2, 10, "the manual split")
    wait_for(lambda: recorder.active() == 1, 30, "...and cold halves merge back")
    recorder.close()
    collector.close()

    layout = admin.get_layout(topic)
    layout.check_invariants()
    assert not flaps(layout, recorder.seen)
    splits = sum(1 for s in layout.all_segments.values() if len(s.child_ids) == 2)
    merges = sum(1 for s in layout.all_segments.values() if len(s.parent_ids) == 2)
    assert merges == splits, "every split was merged back, once"
    assert splits <= 7, f"{splits} splits for a peak of at most 8 segments: it oscillated"
    check_delivery(sent, received)
    admin.delete_scalable_topic(topic)
