"""The metrics reach Ray's Prometheus export with the right tags and plausible values.

Scrapes the real endpoint of a Ray node (``metrics_export_port``): no dashboard is
needed, the node's metrics agent serves it. The session's Ray exports every 10 s
(``RAY_metrics_report_interval_ms`` in ``conftest.py``); how fresh a backlog age is
at the embedded head's own setting is checked on an embedded Ray of its own.
"""

from __future__ import annotations

import re
import time
import urllib.request
from collections import defaultdict

import pytest
import ray
from test_embedded import Place, place  # noqa: F401 - tests/ is on sys.path under pytest

from clients import Producer, StreamConsumer
from runtime.batch import make_batch
from runtime.errors import SegmentTerminated
from runtime.names import TopicName
from tests.segments import segment_actor

_SAMPLE = re.compile(r"^(\w+)\{(.*)\} (\S+)$")
_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


def scrape() -> dict[str, list[tuple[dict[str, str], float]]]:
    node = ray._private.worker.global_worker.node
    url = f"http://{node.node_ip_address}:{node.metrics_export_port}/metrics"
    samples: dict[str, list[tuple[dict[str, str], float]]] = defaultdict(list)
    for line in urllib.request.urlopen(url, timeout=10).read().decode().splitlines():
        match = _SAMPLE.match(line)
        if match and match.group(1).startswith("ray_raytopics_"):
            labels = dict(_LABEL.findall(match.group(2)))
            samples[match.group(1).removeprefix("ray_raytopics_")].append(
                (labels, float(match.group(3)))
            )
    return samples


def total(samples, metric: str, **tags: str) -> float | None:
    """Sum over every series (one per worker process) whose labels include ``tags``."""
    values = [v for labels, v in samples.get(metric, []) if tags.items() <= labels.items()]
    return sum(values) if values else None


def test_metrics_are_exported_with_tags_and_plausible_values(admin, unique) -> None:
    topic = f"topic://metrics/ns/t-{unique}"
    admin.create_scalable_topic(topic, 2)
    admin.create_subscription(topic, "billing")
    with Producer(topic) as producer:
        for i in range(200):
            producer.send(b"v" * 50, key=f"k{i}")
    consumer = StreamConsumer(topic, "billing", "c1")
    acked = 0
    while acked < 60:
        for message in consumer.receive_batch(60 - acked, timeout=5):
            consumer.acknowledge_cumulative(message)
            acked += 1
    admin.split_segment(topic, 0)
    sealed = admin.get_layout(topic).get(0)
    name = TopicName.parse(topic).segment(0, sealed.hash_range.start, sealed.hash_range.end)
    with pytest.raises(SegmentTerminated):
        ray.get(segment_actor(name).append.remote(make_batch([b"late"])))

    expected = {
        ("messages_in_total", ()): lambda v: v == 200,
        ("bytes_in_total", ()): lambda v: v > 200 * 50,
        ("messages_out_total", ()): lambda v: v >= 60,
        ("bytes_out_total", ()): lambda v: v > 60 * 50,
        ("append_latency_ms_count", ()): lambda v: v >= 2,
        ("append_latency_ms_sum", ()): lambda v: 0 < v < 60_000,
        ("backlog_messages", (("subscription", "billing"),)): lambda v: v == 200 - acked,
        ("consumers", (("subscription", "billing"),)): lambda v: v == 1,
        ("segments", (("state", "ACTIVE"),)): lambda v: v == 3,
        ("segments", (("state", "SEALED"),)): lambda v: v == 1,
        ("layout_operations_total", (("kind", "split"),)): lambda v: v == 1,
        ("layout_operation_seconds_count", (("kind", "split"),)): lambda v: v == 1,
        ("controller_leader_epoch", ()): lambda v: v >= 1,
        (
            "rejected_requests_total",
            (("component", "segment"), ("code", "segment_terminated")),
        ): lambda v: v >= 1,
    }
    deadline, failing = time.monotonic() + 90, {}
    while time.monotonic() < deadline:
        samples = scrape()
        values = {key: total(samples, key[0], topic=topic, **dict(key[1])) for key in expected}
        failing = {k: v for k, v in values.items() if v is None or not expected[k](v)}
        if not failing:
            break
        time.sleep(2)
    assert not failing, f"metrics missing or implausible: {failing}"
    per_segment = {labels["segment"] for labels, _ in samples["messages_in_total"]
                   if labels.get("topic") == topic}  # fmt: skip
    assert per_segment == {"0000-7fff-0", "8000-ffff-1"}
    consumer.close()
    admin.delete_scalable_topic(topic)


AGE_CHECK = """
import sys
sys.path[:0] = ["tests"]
from runtime import connect
connect("local", log_to_driver=False)
from clients import ScalableTopicsAdmin
import test_metrics
test_metrics.backlog_age_is_the_age_of_the_oldest_unacknowledged_message(
    ScalableTopicsAdmin(), "embedded"
)
print("CHECKED")
"""


@pytest.mark.integration  # an embedded Ray of its own
def test_backlog_age_is_the_age_of_the_oldest_unacknowledged_message(place: Place) -> None:  # noqa: F811
    """Run as a program on an embedded Ray of its own, as a user's program starts one
    (no ``RAY_`` variable of this session's: the embedded head's export interval)."""
    done = place.run(AGE_CHECK, timeout=300)
    assert done.code == 0, done.stdout[-3000:] + done.stderr[-5000:]
    assert done.stdout.strip().splitlines()[-1] == "CHECKED", done.stdout


def backlog_age_is_the_age_of_the_oldest_unacknowledged_message(admin, unique: str) -> None:
    """In stats (taken when asked) and in Prometheus, where a scrape at any moment is
    within 2 s of the truth at that moment (the embedded head exports every second,
    and the controller takes the ages again between its rounds)."""
    topic = f"topic://metrics/ns/age-{unique}"
    admin.create_scalable_topic(topic, 2)
    admin.set_policy(topic, {"retention": {"timeS": 86400}})  # maintenance every second
    admin.create_subscription(topic, "lagging")
    admin.create_subscription(topic, "peek")
    with Producer(topic) as producer:
        for i in range(20):
            producer.send(b"v", key=f"k{i}")
    peek = StreamConsumer(topic, "peek", "p")
    seen = []
    while len(seen) < 20:
        seen += peek.receive_batch(20, timeout=5)
    peek.acknowledge_cumulative(seen)
    peek.close()
    oldest_ms = min(m.publish_time for m in seen).timestamp() * 1000
    time.sleep(3)

    stats = admin.get_stats(topic)
    truth = time.time() - oldest_ms / 1000
    assert abs(stats["subscriptions"]["lagging"]["backlogAgeS"] - truth) < 1.0
    assert stats["subscriptions"]["peek"]["backlogAgeS"] == 0.0
    per_segment = [s["subscriptions"]["lagging"]["backlogAgeS"] for s in stats["segments"].values()]
    assert max(per_segment) == pytest.approx(
        stats["subscriptions"]["lagging"]["backlogAgeS"], abs=1
    )

    first = time.monotonic() + 30
    while total(scrape(), "backlog_age_seconds", topic=topic, subscription="lagging") is None:
        assert time.monotonic() < first, "backlog_age_seconds was never exported"
        time.sleep(0.2)
    # (value, truth when the scrape began, truth when it ended): on a loaded machine a
    # scrape takes a second or more, and the value is of some moment within it.
    scraped: list[tuple[float, float, float]] = []
    exports = set()
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline or len(scraped) < 12:
        began = time.time() - oldest_ms / 1000
        value = total(scrape(), "backlog_age_seconds", topic=topic, subscription="lagging")
        assert value is not None, "backlog_age_seconds is not exported"
        scraped.append((value, began, time.time() - oldest_ms / 1000))
        exports.add(value)
        time.sleep(0.23)
    assert len(exports) >= 10, f"the age was not exported anew every second or so: {exports}"
    late = [s for s in scraped if not s[1] - 2.0 <= s[0] <= s[2] + 0.5]
    assert not late, f"{len(late)} of {len(scraped)} scrapes more than 2 s off: {late}"
    # every per-segment metric tags a segment alike, by its descriptor: joins work
    samples = scrape()
    tagged = {
        metric: {labels["segment"] for labels, _ in series if labels.get("topic") == topic}
        for metric, series in samples.items()
        if any("segment" in labels and labels.get("topic") == topic for labels, _ in series)
    }
    assert {"segment_backlog_age_seconds", "messages_in_total"} <= tagged.keys(), tagged
    for metric, segments in tagged.items():
        assert segments == {"0000-7fff-0", "8000-ffff-1"}, (metric, segments)
    admin.delete_scalable_topic(topic)


def test_append_latency_counts_every_write(admin, unique) -> None:
    """``append_latency_ms`` is the distribution of all writes, not a sample of the first
    ones of each second: 300 appends sent one after another (each its own write) in
    about a second are 300 observations."""
    topic = f"topic://metrics/ns/latency-{unique}"
    admin.create_scalable_topic(topic, 1)
    info = admin.get_layout(topic).get(0)
    segment = segment_actor(info.name(TopicName.parse(topic)))
    for i in range(300):
        ray.get(segment.append.remote(make_batch([f"v{i}".encode()])))
    deadline = time.monotonic() + 30
    while (count := total(scrape(), "append_latency_ms_count", topic=topic)) != 300:
        assert time.monotonic() < deadline, f"{count} writes observed, not 300"
        time.sleep(0.5)
    admin.delete_scalable_topic(topic)
