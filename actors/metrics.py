"""Every metric the system exports, defined once, with thin recorders for the actors.

Metrics go through ``ray.util.metrics``, so they reach the Ray dashboard and
the node's Prometheus endpoint (``metrics_export_port``) with a ``ray_`` prefix
and no extra infrastructure. Names and tag keys live only here; actors hold a
recorder bound to their own tags and call it once per batch, never per message,
because appends run at millions of messages a second (and the segment recorder
batches further, see ``SegmentMetrics``).

Metric objects are created lazily (on first use in a process): a module import
must not need a connected Ray worker.
"""

from __future__ import annotations

import functools
import time
from dataclasses import dataclass

from ray.util.metrics import Counter, Gauge, Histogram

from runtime.layout import SegmentState
from runtime.names import SegmentName, TopicName, is_valid_part

PREFIX = "raytopics_"
LATENCY_BOUNDARIES_MS = [0.1, 0.25, 0.5, 1, 2.5, 5, 10, 25, 50, 100, 250, 1000]
DURATION_BOUNDARIES_S = [0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60]
_SEGMENT_TAGS = ("topic", "segment")


@dataclass(frozen=True)
class _Metrics:
    messages_in: Counter
    bytes_in: Counter
    messages_out: Counter
    bytes_out: Counter
    append_latency: Histogram
    backlog: Gauge
    backlog_age: Gauge
    segment_backlog_age: Gauge
    consumers: Gauge
    segments: Gauge
    operations: Counter
    operation_duration: Histogram
    leader_epoch: Gauge
    rejected: Counter
    held_back: Counter
    tier_failures: Counter
    tiered: Gauge
    under_replicated: Gauge
    replica_lag: Gauge
    leader_changes: Counter


@functools.cache
def _metrics() -> _Metrics:
    def counter(name: str, doc: str, tags: tuple[str, ...] = _SEGMENT_TAGS) -> Counter:
        return Counter(PREFIX + name, doc, tag_keys=tags)

    def gauge(name: str, doc: str, tags: tuple[str, ...]) -> Gauge:
        return Gauge(PREFIX + name, doc, tag_keys=tags)

    return _Metrics(
        messages_in=counter("messages_in_total", "Messages appended to a segment"),
        bytes_in=counter("bytes_in_total", "Bytes (Arrow IPC) appended to a segment"),
        messages_out=counter("messages_out_total", "Messages delivered from a segment"),
        bytes_out=counter("bytes_out_total", "Bytes delivered from a segment"),
        append_latency=Histogram(
            PREFIX + "append_latency_ms",
            "Time to store one appended batch (write plus the fsync policy), ms",
            boundaries=LATENCY_BOUNDARIES_MS,
            tag_keys=_SEGMENT_TAGS,
        ),
        backlog=gauge(
            "backlog_messages",
            "Unacknowledged messages of a subscription, all segments",
            ("topic", "subscription"),
        ),  # fmt: skip
        backlog_age=gauge(
            "backlog_age_seconds",
            "Age of a subscription's oldest unacknowledged message, all segments (0: none)",
            ("topic", "subscription"),
        ),
        segment_backlog_age=gauge(
            "segment_backlog_age_seconds",
            "Age of a subscription's oldest unacknowledged message in one segment",
            ("topic", "segment", "subscription"),
        ),
        consumers=gauge(
            "consumers", "Registered consumers of a subscription", ("topic", "subscription")
        ),
        segments=gauge("segments", "Segments of a topic by state", ("topic", "state")),
        operations=counter(
            "layout_operations_total", "Completed layout changes", ("topic", "kind")
        ),
        operation_duration=Histogram(
            PREFIX + "layout_operation_seconds",
            "Wall time of a split, merge or prune, seconds",
            boundaries=DURATION_BOUNDARIES_S,
            tag_keys=("topic", "kind"),
        ),
        leader_epoch=gauge("controller_leader_epoch", "Fencing epoch of the leader", ("topic",)),
        rejected=counter(
            "rejected_requests_total",
            "Requests refused with a typed error",
            ("topic", "component", "code"),
        ),  # fmt: skip
        held_back=counter(
            "autoscale_held_back_total",
            "Splits or merges the autoscale policy wanted but could not start",
            ("topic", "kind", "code"),
        ),
        tier_failures=counter(
            "tier_offload_failures_total",
            "Moves of a sealed segment to the tier that failed (retried later)",
            ("topic", "code"),
        ),
        under_replicated=gauge(
            "under_replicated_segments",
            "Replicated active segments with fewer replicas in their role and caught up "
            "than their replication factor",
            ("topic",),
        ),
        replica_lag=gauge(
            "replica_lag_entries",
            "Entries a segment's furthest-behind follower lacks of its leader's log",
            ("topic", "segment"),
        ),
        leader_changes=counter(
            "leader_changes_total",
            "Leader elections of replicated segments won (a new segment's first included)",
            ("topic",),
        ),
        tiered=gauge(
            "segments_by_storage",
            "Segments by where their records are: local disk or the tier",
            ("topic", "storage"),
        ),
    )


class SegmentMetrics:
    """Recorder of one segment actor, cheap enough for the append path.

    Recording a Ray metric costs microseconds, so counts are summed in plain
    integers and handed to Ray at most once per ``FLUSH_S`` (and whenever the
    controller's maintenance round asks for stats). Append latency is kept for
    every write and observed at the flush: the histogram is the distribution of all
    writes, so its p99 is theirs (a sample of the first writes of each second would
    leave out the slow ones queued behind them).
    """

    FLUSH_S = 1.0

    def __init__(self, name: SegmentName) -> None:
        self._tags = {"topic": str(name.topic), "segment": name.descriptor}
        self._topic = str(name.topic)
        self._counts = [0, 0, 0, 0]  # messages in, bytes in, messages out, bytes out
        self._latencies_ms: list[float] = []
        self._last_flush = time.monotonic()

    def appended(self, count: int, nbytes: int, latency_s: float) -> None:
        self._counts[0] += count
        self._counts[1] += nbytes
        self._latencies_ms.append(latency_s * 1000.0)
        self._flush_if_due()

    def delivered(self, count: int, nbytes: int) -> None:
        self._counts[2] += count
        self._counts[3] += nbytes
        self._flush_if_due()

    def rejected(self, code: str) -> None:
        record_rejected(self._topic, "segment", code)

    def flush(self) -> None:
        m = _metrics()
        counters = (m.messages_in, m.bytes_in, m.messages_out, m.bytes_out)
        for counter, value in zip(counters, self._counts, strict=True):
            if value:
                counter.inc(value, self._tags)
        for latency in self._latencies_ms:
            m.append_latency.observe(latency, self._tags)
        self._counts = [0, 0, 0, 0]
        self._latencies_ms = []
        self._last_flush = time.monotonic()

    def _flush_if_due(self) -> None:
        if time.monotonic() - self._last_flush >= self.FLUSH_S:
            self.flush()


class ControllerMetrics:
    """Recorder of one topic's controller: leadership, layout, subscriptions, operations."""

    def __init__(self, topic: TopicName) -> None:
        self._topic = str(topic)

    def leader(self, epoch: int) -> None:
        _metrics().leader_epoch.set(epoch, {"topic": self._topic})

    def layout(self, active: int, sealed: int) -> None:
        gauge = _metrics().segments
        gauge.set(active, {"topic": self._topic, "state": SegmentState.ACTIVE.value})
        gauge.set(sealed, {"topic": self._topic, "state": SegmentState.SEALED.value})

    def subscription(self, name: str, backlog: int, consumers: int) -> None:
        tags = {"topic": self._topic, "subscription": name}
        _metrics().backlog.set(backlog, tags)
        _metrics().consumers.set(consumers, tags)

    def backlog_ages(
        self, subscriptions: dict[str, float], segments: dict[tuple[str, str], float]
    ) -> None:
        """Ages in seconds: per subscription, and per (segment descriptor, subscription)."""
        m = _metrics()
        for name, age in subscriptions.items():
            m.backlog_age.set(age, {"topic": self._topic, "subscription": name})
        for (descriptor, name), age in segments.items():
            tags = {"topic": self._topic, "segment": descriptor, "subscription": name}
            m.segment_backlog_age.set(age, tags)

    def operation(self, kind: str, duration_s: float) -> None:
        tags = {"topic": self._topic, "kind": str(kind)}
        _metrics().operations.inc(1, tags)
        _metrics().operation_duration.observe(duration_s, tags)

    def held_back(self, kind: str, code: str) -> None:
        _metrics().held_back.inc(1, {"topic": self._topic, "kind": kind, "code": code})

    def storage(self, local: int, tiered: int) -> None:
        gauge = _metrics().tiered
        gauge.set(local, {"topic": self._topic, "storage": "local"})
        gauge.set(tiered, {"topic": self._topic, "storage": "tier"})

    def tier_failed(self, code: str) -> None:
        _metrics().tier_failures.inc(1, {"topic": self._topic, "code": code})

    def replicas(self, under_replicated: int, lag: dict[str, int]) -> None:
        """``lag``: per segment descriptor, its furthest-behind follower's missing entries."""
        _metrics().under_replicated.set(under_replicated, {"topic": self._topic})
        for descriptor, entries in lag.items():
            _metrics().replica_lag.set(entries, {"topic": self._topic, "segment": descriptor})

    def leader_changed(self) -> None:
        _metrics().leader_changes.inc(1, {"topic": self._topic})


def record_rejected(topic: str, component: str, code: str) -> None:
    """Count a refused request (``code`` is a ``runtime.errors`` code).

    ``topic`` is the topic (``topic://`` name, or the ``tenant/namespace/topic``
    path as a REST request gave it; empty when it named none), which may be
    exactly what was wrong with it: such a name is counted as ``invalid``,
    because Ray refuses tag values that are not ASCII (the refusal would become
    a 500) and because every garbled name would otherwise be a series of its own.
    """
    parts = [part for part in topic.removeprefix("topic://").split("/") if part]
    label = (topic or "-") if all(is_valid_part(part) for part in parts) else "invalid"
    _metrics().rejected.inc(1, {"topic": label, "component": component, "code": code})
