"""Tiered topics on real segments: a topic whose policy names a tier (a ``file://``
directory, or a real S3 API server on loopback) is produced to, split twice and
merged once; its sealed segments move to the tier and their local logs go; a new
subscription from Earliest then receives everything, each key in order, parents
before children, read from the tier. Tiers the operator does not allow, and tiers
that cannot be used, are refused when the policy is set, with the reason.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import threading
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path

import pytest
import ray
from conftest import TIER_ROOT
from object_store import PORTS, s3_server, s3_uri
from pyarrow import fs as pafs
from test_metrics import scrape, total

from actors.control.topic_stats import _kept, _segment_stats
from actors.controller_directory import ControllerDirectory
from clients import Producer, QueueConsumer, ScalableTopicsAdmin, StreamConsumer
from runtime.config import ray_namespace
from runtime.errors import TierRefusedError
from runtime.names import TopicName
from runtime.tiering import retry_delay_s
from storage.asleep import SleepingSegments
from storage.catalog import Catalog
from storage.tier import open_tier, read_manifest, tier_directory
from storage.tier_records import TierRecords
from storage.topic_storage import segment_directory
from tests.segments import crash_host_of, served_segments
from tests.txn_support import commit_beside_an_abort


def produce(topic: str, sent: list[tuple[str, int]], count: dict[str, int], n: int) -> None:
    with Producer(topic) as producer:
        for i in range(n):
            key = f"k{i % 31}"
            producer.send(f"{key}:{count[key]}".encode(), key=key)
            sent.append((key, count[key]))
            count[key] += 1


def read_all(
    admin: ScalableTopicsAdmin, topic: str, subscription: str, expected: int, batch: int = 500
) -> list[tuple[str, int]]:
    """(key, sequence) of every ``key:sequence[:…]`` message a new subscription from
    Earliest receives, in the order received, until ``expected`` came (or 120 s)."""
    admin.create_subscription(topic, subscription, "earliest")
    consumer = StreamConsumer(topic, subscription, "c")
    received: list[tuple[str, int]] = []
    deadline = time.monotonic() + 120
    while len(received) < expected and time.monotonic() < deadline:
        messages = consumer.receive_batch(batch, timeout=2)
        received += [(m.key, int(m.value.decode().split(":")[1])) for m in messages]
        if messages:
            consumer.acknowledge_cumulative(messages)
    consumer.close()
    return received


def wait_hibernating(admin: ScalableTopicsAdmin, topic: str, timeout_s: float = 60) -> dict:
    """The stats once every sealed segment is tiered and its actor has exited."""
    deadline = time.monotonic() + timeout_s
    while True:
        stats = admin.get_stats(topic)
        sealed = {i: s for i, s in stats["segments"].items() if s["state"] == "SEALED"}
        waiting = {i: s for i, s in sealed.items() if not (s["tiered"] and s["hibernating"])}
        if sealed and not waiting:
            return stats
        assert time.monotonic() < deadline, f"not tiered and hibernating: {waiting}"
        time.sleep(0.5)


def running_segments(admin: ScalableTopicsAdmin, topic: str) -> set[int]:
    """Ids of the topic's segments whose actor is alive, from Ray's own actor table."""
    name = TopicName.parse(topic)
    alive = served_segments(name)
    segments = admin.get_layout(topic).all_segments.values()
    return {info.segment_id for info in segments if info.name(name).actor_name in alive}


@pytest.mark.parametrize("store", ["file", "s3"])
def test_sealed_segments_move_to_the_tier_and_serve_every_reader_from_there(
    admin: ScalableTopicsAdmin, unique: str, tmp_path: Path, store: str, request
) -> None:
    topic = f"topic://tier/ns/{store}-{unique}"
    if store == "file":
        uri = written = f"file://{TIER_ROOT}/{unique}"
    else:  # the policy names the location; the endpoint and keys are the operator's
        uri = f"s3://tier/{unique}"
        written = s3_uri(request.getfixturevalue("s3_endpoint"), f"tier/{unique}")
    admin.create_scalable_topic(topic, 2)
    admin.set_policy(topic, {"tiering": {"uri": uri, "afterS": 0, "idleS": 2}})
    sent: list[tuple[str, int]] = []
    count: dict[str, int] = defaultdict(int)
    produce(topic, sent, count, 400)
    admin.split_segment(topic, 0)
    produce(topic, sent, count, 400)
    admin.split_segment(topic, 1)
    produce(topic, sent, count, 400)
    active = sorted(
        admin.get_layout(topic).active_segments.values(), key=lambda s: s.hash_range.start
    )
    admin.merge_segments(topic, active[0].segment_id, active[1].segment_id)
    produce(topic, sent, count, 400)

    stats = wait_hibernating(admin, topic)
    assert stats["tieredBytes"] > 0 and "tierError" not in str(stats)
    name, layout = TopicName.parse(topic), admin.get_layout(topic)
    sealed_ids = {i for i, info in layout.all_segments.items() if not info.is_active}
    assert len(sealed_ids) == 4 and stats["hibernatingSegments"] == 4
    assert running_segments(admin, topic) == set(layout.active_segments)  # sealed ones: no process
    filesystem, base = open_tier(written)
    root = Path(os.environ["RAYTOPICS_STORAGE_ROOT"])
    for info in layout.all_segments.values():
        segment = info.name(name)
        local = segment_directory(root, segment, stats["incarnation"])
        manifest = read_manifest(filesystem, tier_directory(base, segment, stats["incarnation"]))
        if info.is_active:
            assert (local / "log").is_dir() and manifest is None
        else:
            assert not local.exists(), f"segment {info.segment_id} kept local files"
            assert manifest is not None and manifest.records > 0
    assert sum(s["records"] for s in stats["segments"].values()) == 1600

    received = read_all(admin, topic, "late", len(sent))
    assert sorted(received) == sorted(sent) and len(received) == len(sent) == 1600
    last: dict[str, int] = {}
    for key, sequence in received:
        assert last.get(key, -1) == sequence - 1, (key, sequence)
        last[key] = sequence
    # The reader woke the sealed segments; unused for idleS they exit again, with the
    # subscription's acknowledgements kept in their records.
    stats = wait_hibernating(admin, topic, 90)
    assert all(
        stats["segments"][str(i)]["subscriptions"]["late"]["backlog"] == 0 for i in sealed_ids
    )
    assert stats["subscriptions"]["late"]["backlog"] == 0
    assert running_segments(admin, topic) == set(layout.active_segments)

    # Retention prunes the drained, hibernating segments: their tiered copies and
    # records go, without waking them.
    tiering = {"uri": uri, "afterS": 0, "idleS": 2}
    admin.set_policy(topic, {"tiering": tiering, "retention": {"timeS": 0}})
    deadline = time.monotonic() + 60
    while set(admin.get_layout(topic).all_segments) & sealed_ids:
        assert time.monotonic() < deadline, admin.get_layout(topic).all_segments.keys()
        time.sleep(0.5)
    records = TierRecords(Catalog().store, name, stats["incarnation"])
    for segment_id in sealed_ids:
        directory = tier_directory(base, layout.get(segment_id).name(name), stats["incarnation"])
        assert read_manifest(filesystem, directory) is None and records.get(segment_id) is None
    admin.delete_scalable_topic(topic)


def test_readers_that_pause_past_idle_s_find_the_segment_started_again(
    admin: ScalableTopicsAdmin, unique: str
) -> None:
    """A tiered segment exits once unused for its ``idleS`` even while it owes a backlog:
    a stream and a queue consumer that stop receiving for longer (their queues full, so
    they stop reading) find it started again when they go on, and get everything once."""
    topic = f"topic://tier/ns/pause-{unique}"
    admin.create_scalable_topic(topic, 1)
    tiering = {"uri": f"file://{TIER_ROOT}/{unique}", "afterS": 0, "idleS": 1}
    admin.set_policy(topic, {"tiering": tiering})
    sent: list[tuple[str, int]] = []
    produce(topic, sent, defaultdict(int), 300)
    admin.split_segment(topic, 0)
    wait_hibernating(admin, topic)
    admin.create_subscription(topic, "stream", "earliest")
    admin.create_subscription(topic, "queue", "earliest")

    def parsed(messages: list) -> list[tuple[str, int]]:
        return [(m.key, int(m.value.decode().split(":")[1])) for m in messages]

    def paused_then_drained(
        take: Callable[[float], list], acknowledge: Callable[[list], object]
    ) -> list[tuple[str, int]]:
        received = parsed(take(30))
        assert received, "the first receive woke nothing"
        deadline = time.monotonic() + 60
        while 0 in running_segments(admin, topic):  # nothing reads while the queue is full
            assert time.monotonic() < deadline, "the paused reader's segment stayed up"
            time.sleep(0.3)
        deadline = time.monotonic() + 60
        while len(set(received)) < len(sent) and time.monotonic() < deadline:
            messages = take(1)
            acknowledge(messages)
            received += parsed(messages)
        return received

    stream = StreamConsumer(topic, "stream", "s", receiver_queue_size=20, read_batch=20)
    got = paused_then_drained(
        lambda wait_s: stream.receive_batch(10, timeout=wait_s),
        lambda batch: batch and stream.acknowledge_cumulative(batch),
    )
    stream.close()
    assert got == sent  # one segment: the order sent, each once
    queue = QueueConsumer(topic, "queue", receive_batch=20, receiver_queue_size=1)
    got = paused_then_drained(
        lambda wait_s: [m for m in [queue.receive(wait_s)] if m is not None],
        lambda batch: [queue.acknowledge(m) for m in batch],
    )
    queue.close()
    assert set(got) == set(sent)  # at least once: what was in flight may come again
    admin.delete_scalable_topic(topic)


def test_stats_of_a_segment_whose_actor_just_ended_wake_nothing(
    admin: ScalableTopicsAdmin, unique: str
) -> None:
    """A move to the tier may commit, and its actor end, while a stats request is under
    way: the request reads what is kept of the segment when it finds no actor, not a
    list of tiered segments read before, and starts nothing (a woken tiered segment
    would run for its whole ``idleS``)."""
    topic = f"topic://tier/ns/ended-{unique}"
    admin.create_scalable_topic(topic, 1)
    tiering = {"uri": f"file://{TIER_ROOT}/{unique}", "afterS": 0, "idleS": 600}
    admin.set_policy(topic, {"tiering": tiering})
    produce(topic, [], defaultdict(int), 50)
    admin.split_segment(topic, 0)
    incarnation = wait_hibernating(admin, topic)["incarnation"]
    name = TopicName.parse(topic)
    segment = admin.get_layout(topic).get(0).name(name)
    kept = _kept(
        segment,
        TierRecords(Catalog().store, name, incarnation),
        SleepingSegments(Catalog().store, name, incarnation),
    )
    reads = []

    def committed_after_the_first_read() -> dict | None:
        reads.append(1)
        return None if len(reads) == 1 else kept()

    stats = asyncio.run(_segment_stats(segment, committed_after_the_first_read, 10))
    assert stats is not None and stats["tiered"] and stats["hibernating"], stats
    assert len(reads) == 2
    assert running_segments(admin, topic) == set(admin.get_layout(topic).active_segments)
    admin.delete_scalable_topic(topic)


def test_tiers_not_allowed_or_not_usable_are_refused_when_the_policy_is_set(
    admin: ScalableTopicsAdmin, unique: str, s3_endpoint: str, kv_snapshot
) -> None:
    """Only the operator decides where and how the cluster writes: a policy's endpoint,
    credentials or options, a sibling of an allowed prefix, and a tier that cannot be
    used are all refused, and nothing is stored or written anywhere."""
    topic = f"topic://tier/ns/refused-{unique}"
    admin.create_scalable_topic(topic, 1)
    blocker = Path(TIER_ROOT) / f"a-file-{unique}"
    blocker.write_text("a file where the tier's directory would be")
    with s3_server() as attacker:  # where a policy's endpoint_override would send the data
        before = kv_snapshot()
        for uri, reason in [
            (f"s3://tier/x-{unique}?endpoint_override={attacker}&scheme=http", "operator's"),
            (f"s3://testing:testing@tier/x-{unique}", "operator's"),
            (f"s3://tier/x-{unique}?scheme=http", "operator's"),
            (f"file://{TIER_ROOT}-sibling/x", "outside the tiers this cluster allows"),
            (f"s3://tierx/{unique}", "outside the tiers"),
            ("file:///etc/raytopics", "outside the tiers this cluster allows"),
            (f"file://{TIER_ROOT}/../etc/x", "must not contain"),
            ("nosuch://bucket", "outside the tiers"),
            ("s3://other-bucket/x", "outside the tiers"),
            (f"file://{blocker}/tier", "not usable"),
        ]:
            with pytest.raises(TierRefusedError, match=reason) as refused:
                admin.set_policy(topic, {"tiering": {"uri": uri, "afterS": 0}})
            assert "testing:testing" not in str(refused.value)  # credentials never echoed
        filesystem, _ = open_tier(s3_uri(attacker, "tier"))
        assert filesystem.get_file_info(pafs.FileSelector("tier", recursive=True)) == []
        assert kv_snapshot() == before, "a refused policy changed metadata"
    with (
        # the operator's "guarded" bucket: a store that refuses the operator's credentials
        s3_server(enforce_auth=True, port=PORTS["guarded"]),
        pytest.raises(TierRefusedError, match="not usable.*ACCESS_DENIED") as refused,
    ):
        admin.set_policy(topic, {"tiering": {"uri": f"s3://guarded/{unique}"}})
    assert "testing:testing" not in str(refused.value)
    assert admin.get_policy(topic)["tiering"] is None
    shown = admin.set_policy(topic, {"tiering": {"uri": f"s3://tier/ok-{unique}"}})
    assert shown["tiering"]["uri"] == f"s3://tier/ok-{unique}"
    assert shown["tiering"]["afterS"] == 60
    admin.delete_scalable_topic(topic)


def produce_bulk(topic: str, count: dict[str, int], n: int) -> None:
    """``n`` keyed ``key:seq`` messages, padded to ~100 bytes, in bulk batches."""
    with Producer(topic) as producer:
        for start in range(0, n, 10_000):
            keys, values = [], []
            for i in range(start, min(start + 10_000, n)):
                key = f"k{i % 31}"
                values.append(f"{key}:{count[key]}:".encode().ljust(100, b"."))
                keys.append(key)
                count[key] += 1
            producer.send_batch(values, keys).result(timeout=120)


class OffloadKiller:
    """Kills, while the moves to the tier run, each chosen segment's actor at the step of
    its move named for it, and the controller at the first step of one more segment's,
    and records which step each kill saw (Ray restarts them all)."""

    def __init__(
        self, topic: str, incarnation: str, uri: str, plan: dict[int, tuple[str, str]]
    ) -> None:
        name, self.plan = TopicName.parse(topic), dict(plan)
        layout = Catalog().require_topic(name).layout
        self.names = {i: layout.get(i).name(name) for i in plan}
        self.controller = ControllerDirectory().get(name).host  # its host
        self.records = TierRecords(Catalog().store, name, incarnation)
        self.filesystem, base = open_tier(uri)
        self.directories = {i: tier_directory(base, n, incarnation) for i, n in self.names.items()}
        self.seen: dict[int, str] = {}
        self.thread = threading.Thread(target=self._watch, daemon=True)

    def _reached(self, segment_id: int, step: str) -> bool:
        directory = self.directories[segment_id]
        if step == "recorded":
            return self.records.get(segment_id) is not None
        found = self.filesystem.get_file_info(f"{directory}/{step}")
        return found.type != pafs.FileType.NotFound

    def _watch(self) -> None:
        deadline = time.monotonic() + 120
        while self.plan and time.monotonic() < deadline:
            for segment_id, (step, victim) in list(self.plan.items()):
                if self._reached(segment_id, step):
                    with contextlib.suppress(ValueError):
                        if victim == "controller":
                            actor = ray.get_actor(self.controller, namespace=ray_namespace())
                            ray.kill(actor, no_restart=False)
                        else:
                            crash_host_of(self.names[segment_id])
                    self.seen[segment_id] = f"{victim} killed at {step}"
                    del self.plan[segment_id]
            time.sleep(0.002)


def test_a_move_to_the_tier_killed_at_any_step_leaves_every_record_readable_once(
    admin: ScalableTopicsAdmin, unique: str
) -> None:
    """Segment actors killed while their records upload, once the tier's copy is committed
    (its manifest), and once the segment's record is; the controller killed while another
    upload runs. Ray restarts them; the moves finish (retried, or found done); a new
    subscription from Earliest then reads every record exactly once, each key in order."""
    topic = f"topic://tier/ns/crash-{unique}"
    admin.create_scalable_topic(topic, 1)
    count: dict[str, int] = defaultdict(int)
    produce_bulk(topic, count, 120_000)
    admin.split_segment(topic, 0)
    produce_bulk(topic, count, 120_000)
    admin.split_segment(topic, 1)
    admin.split_segment(topic, 2)
    produce_bulk(topic, count, 60_000)
    admin.split_segment(topic, 3)
    uri = f"file://{TIER_ROOT}/crash-{unique}"
    plan = {
        0: ("records.parquet", "segment"),
        1: ("manifest.json", "segment"),
        2: ("recorded", "segment"),
        3: ("records.parquet", "controller"),
    }
    killer = OffloadKiller(topic, admin.get_stats(topic)["incarnation"], uri, plan)
    killer.thread.start()
    # idleS: a segment whose controller died before it could end its actor exits once idle
    admin.set_policy(topic, {"tiering": {"uri": uri, "afterS": 0, "idleS": 2}})
    killer.thread.join(130)
    assert len(killer.seen) == 4, killer.seen
    print(killer.seen)
    stats = wait_hibernating(admin, topic, 120)
    assert "tierError" not in str(stats), stats
    total = sum(count.values())
    assert sum(s["records"] for s in stats["segments"].values()) == total

    received = read_all(admin, topic, "after", total, batch=10_000)
    expected = sorted((key, seq) for key, n in count.items() for seq in range(n))
    assert len(received) == total and sorted(received) == expected
    last: dict[str, int] = {}
    for key, seq in received:
        assert last.get(key, -1) == seq - 1, (key, seq)
        last[key] = seq
    admin.delete_scalable_topic(topic)  # its tiered copies and records go with it
    for segment_id, directory in killer.directories.items():
        assert read_manifest(killer.filesystem, directory) is None
        assert killer.records.get(segment_id) is None


def test_a_namespace_default_tiers_the_topics_that_set_no_tiering_of_their_own(
    admin: ScalableTopicsAdmin, unique: str
) -> None:
    namespace = f"tier/defaults-{unique}"
    default_uri, own_uri = f"file://{TIER_ROOT}/ns-{unique}", f"file://{TIER_ROOT}/own-{unique}"
    with pytest.raises(TierRefusedError, match="outside the tiers"):
        admin.set_namespace_policy(namespace, {"tiering": {"uri": "file:///etc/raytopics"}})
    default = {"tiering": {"uri": default_uri, "afterS": 0, "idleS": 1}}
    assert admin.set_namespace_policy(namespace, default)["tiering"]["uri"] == default_uri
    plain, own = f"topic://{namespace}/plain", f"topic://{namespace}/own"
    for topic in (plain, own):
        admin.create_scalable_topic(topic, 1)
    admin.set_policy(own, {"tiering": {"uri": own_uri, "afterS": 0, "idleS": 1}})
    for topic in (plain, own):
        produce(topic, [], defaultdict(int), 200)
        admin.split_segment(topic, 0)
    for topic, uri in ((plain, default_uri), (own, own_uri)):
        stats = wait_hibernating(admin, topic)
        filesystem, base = open_tier(uri)
        segment = admin.get_layout(topic).get(0).name(TopicName.parse(topic))
        manifest = read_manifest(filesystem, tier_directory(base, segment, stats["incarnation"]))
        assert manifest is not None and manifest.records == 200, topic
    assert admin.get_policy(plain)["tiering"] is None  # the topic's own policy is unchanged
    assert admin.get_namespace_policy(namespace)["tiering"]["uri"] == default_uri
    for topic in (plain, own):
        admin.delete_scalable_topic(topic)
    assert admin.set_namespace_policy(namespace, {})["tiering"] is None


def test_a_sealed_segment_holding_transactions_moves_to_the_tier_once_all_are_decided(
    admin: ScalableTopicsAdmin, unique: str
) -> None:
    """Committed and aborted transactions, and one still open when the segment is
    sealed: the segment stays local until that one is decided, then moves with its
    committed records only, and a new subscription reads exactly those from the tier."""
    topic, uri = f"topic://tier/ns/txn-{unique}", f"file://{TIER_ROOT}/txn-{unique}"
    admin.create_scalable_topic(topic, 1)
    admin.set_policy(topic, {"tiering": {"uri": uri, "afterS": 0, "idleS": 1}})
    late = admin.new_transaction(timeout_s=300)
    with Producer(topic) as producer:
        committed = commit_beside_an_abort(admin, producer, 50)
        producer.send(b"late-0", key="k0", txn=late).result(timeout=30)
    admin.split_segment(topic, 0)
    time.sleep(3)  # rounds meanwhile: the undecided transaction keeps it local
    assert not admin.get_stats(topic)["segments"]["0"]["tiered"]
    late.commit()
    stats = wait_hibernating(admin, topic)
    filesystem, base = open_tier(uri)
    segment = admin.get_layout(topic).get(0).name(TopicName.parse(topic))
    manifest = read_manifest(filesystem, tier_directory(base, segment, stats["incarnation"]))
    assert manifest is not None and manifest.records == len(committed) + 1 and manifest.hidden
    admin.create_subscription(topic, "late", "earliest")
    consumer = StreamConsumer(topic, "late", "c")
    received: list[str] = []
    deadline = time.monotonic() + 120
    while len(received) < len(committed) + 1 and time.monotonic() < deadline:
        messages = consumer.receive_batch(500, timeout=2)
        received += [m.value.decode() for m in messages]
        if messages:
            consumer.acknowledge_cumulative(messages)
    assert consumer.receive_batch(500, timeout=2) == []  # nothing more
    consumer.close()
    assert sorted(received) == sorted([*committed, "late-0"])
    assert admin.get_stats(topic)["subscriptions"]["late"]["backlog"] == 0
    admin.delete_scalable_topic(topic)


def test_an_object_store_that_goes_down_is_retried_and_the_local_copy_serves_meanwhile(
    admin: ScalableTopicsAdmin, unique: str
) -> None:
    """The store was up when the policy was set, then goes away: each move fails, is
    retried ever later (``tierError`` in the stats, ``tier_offload_failures_total``), the
    sealed segment keeps serving from its local log; once the store is back the move
    completes and the segment hibernates, every record still there once."""
    assert [retry_delay_s(n) for n in (1, 2, 3, 10)] == [5.0, 10.0, 20.0, 300.0]
    topic = f"topic://tier/ns/down-{unique}"
    admin.create_scalable_topic(topic, 1)
    with s3_server(port=PORTS["flaky"], bucket="flaky"):  # the operator's "flaky" bucket
        uri = f"s3://flaky/down-{unique}"
        admin.set_policy(topic, {"tiering": {"uri": uri, "afterS": 0, "idleS": 1}})
    sent: list[tuple[str, int]] = []
    count: dict[str, int] = defaultdict(int)
    produce(topic, sent, count, 300)
    admin.split_segment(topic, 0)
    deadline = time.monotonic() + 60
    while "tierError" not in (sealed := admin.get_stats(topic)["segments"]["0"]):
        assert time.monotonic() < deadline, sealed
        time.sleep(0.5)
    assert not sealed["tiered"] and sealed["tierError"]["error"] == "unavailable", sealed
    assert "***" in sealed["tierError"]["message"] and "testing:testing" not in str(sealed)
    deadline = time.monotonic() + 60
    while not (failures := total(scrape(), "tier_offload_failures_total", topic=topic)):
        assert time.monotonic() < deadline
        time.sleep(1)
    assert failures >= 1

    while_down = read_all(admin, topic, "while-down", len(sent))
    assert sorted(while_down) == sorted(sent)  # from the local log
    with s3_server(port=PORTS["flaky"], bucket="flaky"):
        stats = wait_hibernating(admin, topic, 90)  # retried after its back-off
        assert "tierError" not in str(stats["segments"]["0"])
        assert sorted(read_all(admin, topic, "after", len(sent))) == sorted(sent)  # from the tier
        admin.delete_scalable_topic(topic)
