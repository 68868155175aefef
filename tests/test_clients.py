"""Client acceptance on a real local Ray: producers, consumers, sessions, DAG order."""

from __future__ import annotations

import random
import threading
import time
from collections import defaultdict
from collections.abc import Callable

import pyarrow as pa
import pyarrow.compute as pc
import pytest
import ray

from actors.control.controller_host import controller_actor
from actors.control.coordinator_host import coordinator_actor
from actors.registry import named_actors
from clients import (
    RECEIVED_SCHEMA,
    Checkpoint,
    CheckpointConsumer,
    Producer,
    QueueConsumer,
    ScalableTopicsAdmin,
    StreamConsumer,
)
from runtime.errors import InvalidArgumentError, SendTimeoutError
from runtime.names import TopicName
from tests.segments import served_segments, stop_serving


@pytest.fixture(scope="module")
def admin(ray_cluster) -> ScalableTopicsAdmin:
    return ScalableTopicsAdmin()


@ray.remote(num_cpus=0)
def produce(topic: str, producer: int, count: int, keys: int) -> list[tuple[str, str]]:
    """Send ``count`` keyed messages; return the (key, value) of every acknowledged one."""
    sent = []
    with Producer(topic) as prod:
        futures = []
        for i in range(count):
            key, value = f"k{(i * 7 + producer) % keys}", f"{producer}:{i}"
            futures.append((key, value, prod.send(value.encode(), key=key)))
        prod.flush()
    for key, value, future in futures:
        if future.exception() is None:
            sent.append((key, value))
    return sent


class Collector:
    """Drains a stream consumer on a thread, acknowledging everything it receives."""

    def __init__(self, consumer: StreamConsumer, sink: list, stop: threading.Event) -> None:
        self.consumer, self.sink, self.stop = consumer, sink, stop
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self.stop.is_set():
            for message in self.consumer.receive_batch(500, timeout=0.2):
                self.sink.append((message.key, message.value.decode(), time.monotonic()))
                self.consumer.acknowledge_cumulative(message)

    def close(self) -> None:
        self.stop.set()
        self.thread.join()
        self.consumer.close()


def check_delivery(sent: list[tuple[str, str]], received: list[tuple]) -> None:
    """Every acked send received once, and per key each producer's order kept."""
    got = [(k, v) for k, v, *_ in received]
    assert len(got) == len(set(got)), f"{len(got) - len(set(got))} duplicates"
    assert set(got) == set(sent), f"missing {len(set(sent) - set(got))} messages"
    by_key: dict[tuple[str, str], list[int]] = defaultdict(list)
    for key, value in got:
        producer, seq = value.split(":")
        by_key[(key, producer)].append(int(seq))
    expected: dict[tuple[str, str], list[int]] = defaultdict(list)
    for key, value in sent:
        producer, seq = value.split(":")
        expected[(key, producer)].append(int(seq))
    for pair, seqs in expected.items():
        assert by_key[pair] == seqs, f"order broken for {pair}"


def wait_for(predicate, timeout_s: float = 30.0, what: str | Callable[[], str] = "condition"):
    """Poll ``predicate``; ``what`` may be a callable that describes the state on failure."""
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, (
            f"timed out waiting for {what() if callable(what) else what}"
        )
        time.sleep(0.1)


def test_scalability_under_load_with_splits_merges_and_rebalancing(admin, unique):
    topic = f"topic://clients/ns/load-t-{unique}"
    admin.create_scalable_topic(topic, 4)
    admin.create_subscription(topic, "orders")
    received: list[tuple] = []
    stops = [threading.Event() for _ in range(3)]
    c1 = Collector(StreamConsumer(topic, "orders", "c1"), received, stops[0])
    c2 = Collector(StreamConsumer(topic, "orders", "c2"), received, stops[1])
    producers = [produce.remote(topic, p, 50_000, 1_000) for p in range(3)]

    time.sleep(2)
    admin.split_segment(topic, 0)
    admin.split_segment(topic, 2)
    c3 = Collector(StreamConsumer(topic, "orders", "c3"), received, stops[2])  # joins late
    admin.split_segment(topic, 5, at=[0x2800, 0x3000])  # [2000-3fff] into three
    admin.merge_segments(topic, 10, 8, 9)  # and back in one operation
    layout = admin.get_layout(topic)
    active = sorted(layout.active_segments.values(), key=lambda s: s.hash_range.start)
    admin.merge_segments(topic, active[-2].segment_id, active[-1].segment_id)
    c1.close()  # leaves while the others keep going

    sent = [m for batch in ray.get(producers) for m in batch]
    assert len(sent) == 150_000, "every send should have been acknowledged"
    wait_for(lambda: len(received) >= len(sent), 120, "all messages")
    time.sleep(1)
    c2.close()
    c3.close()
    check_delivery(sent, received)
    assert admin.get_stats(topic)["subscriptions"]["orders"]["backlog"] == 0
    admin.delete_scalable_topic(topic)


@ray.remote(num_cpus=0)
class ConsumerHost:
    """A stream consumer in its own process, so killing the process disconnects it."""

    def __init__(self, topic: str, subscription: str, name: str, join: bool = True) -> None:
        self.args = (topic, subscription, name)
        self.consumer: StreamConsumer | None = None
        if join:
            self.join()

    def join(self) -> None:
        """Join the group; a host started with ``join=False`` is a warm process waiting to."""
        self.consumer = StreamConsumer(*self.args, poll_timeout_s=1.0)

    def assigned(self) -> list[int]:
        return self.consumer.assigned_segments()

    def drain(self, idle_s: float = 1.0) -> list[tuple[str, str]]:
        got = []
        while (message := self.consumer.receive(timeout=idle_s)) is not None:
            got.append((message.key, message.value.decode()))
            self.consumer.acknowledge_cumulative(message)
        return got


def owners(topic: str, subscription: str) -> dict[int, str]:
    snapshot = ray.get(coordinator_actor(TopicName.parse(topic), subscription).snapshot.remote())
    return {share["segmentId"]: share["consumer"] for share in snapshot["owners"]}


def test_sessions_survive_disconnects_within_grace_and_coordinator_restarts(admin, unique):
    topic = f"topic://clients/ns/sessions-t-{unique}"
    admin.create_scalable_topic(topic, 4)
    admin.create_subscription(topic, "s", session_grace_s=8)
    a = ConsumerHost.remote(topic, "s", "a")
    b = ConsumerHost.remote(topic, "s", "b")
    wait_for(lambda: len(ray.get(a.assigned.remote())) == 2, what="a balanced")
    wait_for(lambda: len(ray.get(b.assigned.remote())) == 2, what="b balanced")
    a_segments, b_segments = ray.get(a.assigned.remote()), ray.get(b.assigned.remote())
    a_again = ConsumerHost.remote(topic, "s", "a", join=False)
    ray.get(a_again.__ray_ready__.remote())  # its process is up before a goes

    ray.kill(a, no_restart=True)  # a disconnects without leaving
    killed_at = time.monotonic()
    time.sleep(2)
    assert owners(topic, "s") == {**{s: "a" for s in a_segments}, **{s: "b" for s in b_segments}}
    a = a_again
    ray.get(a.join.remote())  # back within the grace period
    assert time.monotonic() - killed_at < 8, "the test was too slow to rejoin within the grace"
    wait_for(lambda: ray.get(a.assigned.remote()) == a_segments, what="a's segments back")
    assert ray.get(b.assigned.remote()) == b_segments, "b must not be rebalanced"

    coordinator = coordinator_actor(TopicName.parse(topic), "s")
    ray.kill(coordinator.host, no_restart=False)  # Ray restarts it; sessions come from metadata
    time.sleep(2)
    assert owners(topic, "s") == {**{s: "a" for s in a_segments}, **{s: "b" for s in b_segments}}
    assert ray.get(a.assigned.remote()) == a_segments
    assert ray.get(b.assigned.remote()) == b_segments

    ray.kill(a, no_restart=True)  # gone for longer than the grace period
    wait_for(lambda: len(ray.get(b.assigned.remote())) == 4, 30, "a's segments moving to b")
    ray.kill(b, no_restart=True)
    admin.delete_scalable_topic(topic)


def test_a_namespaces_topics_share_one_coordinator_host(admin, unique):
    """The coordinators of two topics of one namespace run in one process: deleting one
    topic stops only its coordinators, and a consumer whose host exits for good (as an
    idle host does) goes on with the next one started: it is handed a split's children."""
    namespace = f"clients/coord{unique}"
    first, second = f"topic://{namespace}/a", f"topic://{namespace}/b"
    for topic in (first, second):
        admin.create_scalable_topic(topic, 1)
        admin.create_subscription(topic, "s")
    hosts = {coordinator_actor(TopicName.parse(t), "s").host for t in (first, second)}
    assert len(hosts) == 1
    assert named_actors("coordinators:").count(f"coordinators:{namespace}") == 1
    consumers = {t: StreamConsumer(t, "s", "c", poll_timeout_s=1.0) for t in (first, second)}
    with Producer(second) as prod:
        prod.send(b"before").result(timeout=30)
    before = consumers[second].receive(timeout=30)
    assert before.value == b"before"
    consumers[second].acknowledge_cumulative(before)

    host = hosts.pop()
    with pytest.raises(InvalidArgumentError, match="not of namespace"):
        ray.get(host.call.remote(f"topic://clients/other{unique}/a", "s", "snapshot"))
    assert ray.get(host.stop.remote(first)) == 1, "the first topic's coordinator alone"
    admin.delete_scalable_topic(first)
    consumers.pop(first).close()

    ray.kill(host, no_restart=True)  # gone for good, with the consumer holding its handle
    admin.split_segment(second, 0)  # the children come to it through a coordinator
    with Producer(second) as prod:
        prod.send(b"after").result(timeout=30)
    message = consumers[second].receive(timeout=30)
    assert message is not None and message.value == b"after"
    consumers[second].close()
    admin.delete_scalable_topic(second)


def test_children_are_never_delivered_before_parents_are_drained(admin, unique):
    topic = f"topic://clients/ns/dagorder-t-{unique}"
    admin.create_scalable_topic(topic, 1)
    admin.create_subscription(topic, "s")
    with Producer(topic) as prod:
        for i in range(300):
            prod.send(f"p{i}".encode(), key=f"k{i % 10}")
        prod.flush()
        admin.split_segment(topic, 0)
        for i in range(300):
            prod.send(f"c{i}".encode(), key=f"k{i % 10}")
    events: list[tuple[float, str, int]] = []
    slow = StreamConsumer(topic, "s", "slow")
    fast_stop = threading.Event()
    fast_log: list[tuple] = []
    fast = Collector(StreamConsumer(topic, "s", "fast"), fast_log, fast_stop)
    deadline = time.monotonic() + 60
    # Until every message arrived (a child's turn comes once the parent's drain reached
    # the coordinator, which a loaded machine can take seconds to do), then 1 s more for
    # any duplicate to show.
    while len(events) + len(fast_log) < 600 and time.monotonic() < deadline:
        message = slow.receive(timeout=0.5)
        if message is None:
            continue
        time.sleep(0.002 if message.segment_id == 0 else 0)
        events.append((time.monotonic(), "slow", message.segment_id))
        slow.acknowledge_cumulative(message)
    time.sleep(1)
    fast.close()
    slow.close()
    # Two consumers of one segment share it by key: each reads part of the parent.
    parent_times = [t for t, _, seg in events if seg == 0]
    parent_times += [t for _, value, t in fast_log if value.startswith("p")]
    child_times = [t for t, _, seg in events if seg != 0]
    child_times += [t for _, value, t in fast_log if value.startswith("c")]
    assert len(parent_times) == 300
    assert len(child_times) == 300
    assert min(child_times) > max(parent_times), (
        "a child message was delivered before its parent drained"
    )
    admin.delete_scalable_topic(topic)


def test_stream_consumer_waits_out_a_segment_actor_that_is_gone(admin, unique, monkeypatch):
    """A child whose actor is gone when its assignment arrives: the consumer keeps
    asking for it until the controller's next incarnation brings the actor back."""
    import actors.segment.lookup

    monkeypatch.setattr(actors.segment.lookup, "LOOKUP_WAIT_S", 1.0)  # give up fast, many times
    topic = f"topic://clients/ns/lost-t-{unique}"
    admin.create_scalable_topic(topic, 1)
    admin.create_subscription(topic, "s")
    with Producer(topic) as prod:
        prod.send(b"parent", key="k").result()
    consumer = StreamConsumer(topic, "s", "c")
    parent_message = consumer.receive(timeout=30)  # not acked: the parent is not drained
    children = admin.split_segment(topic, 0)["children"]
    layout, name = admin.get_layout(topic), TopicName.parse(topic)
    segments = [
        name.segment(i, s.hash_range.start, s.hash_range.end)
        for i, s in layout.all_segments.items()
        if i in children
    ]
    actor_names = {s.actor_name for s in segments}
    wait_for(lambda: actor_names <= served_segments(name), what="the children's actors")
    for segment in segments:
        stop_serving(segment)  # gone for good, as if deleted
    consumer.acknowledge_cumulative(parent_message)  # drained: the children are assigned
    time.sleep(3)  # ... and their lookups give up, more than once
    ray.kill(controller_actor(name).host, no_restart=False)  # its next incarnation recovers
    wait_for(lambda: actor_names <= served_segments(name), 60, "the children's actors back")
    with Producer(topic) as prod:
        for i in range(20):
            prod.send(f"m{i}".encode(), key=f"k{i}")
    received = set()
    deadline = time.monotonic() + 30
    while len(received) < 20 and time.monotonic() < deadline:
        for message in consumer.receive_batch(100, timeout=0.5):
            received.add(message.value)
            consumer.acknowledge_cumulative(message)
    consumer.close()
    assert received == {f"m{i}".encode() for i in range(20)}
    admin.delete_scalable_topic(topic)


def test_a_failed_segment_lookup_fails_its_sends_instead_of_hanging(admin, unique, monkeypatch):
    """An unexpected error while finding a segment's actor (the GCS unreachable, say)
    fails the sends waiting for it; later sends look the actor up again. (The
    producer also looks every segment up as it starts, with no send waiting yet: a
    failure then fails nothing.)"""
    import actors.segment.lookup as lookup

    real_lookup, failing = lookup.find_segment_actor, [True]

    async def flaky_lookup(name, timeout_s=None, **options):
        if failing[0]:
            raise RuntimeError("GCS unreachable")
        return await real_lookup(name, timeout_s, **options)

    monkeypatch.setattr(lookup, "find_segment_actor", flaky_lookup)  # before the producer
    topic = f"topic://clients/ns/lost-lookup-{unique}"
    admin.create_scalable_topic(topic, 1)
    with Producer(topic) as prod:
        with pytest.raises(SendTimeoutError, match="GCS unreachable"):
            prod.send(b"first").result(timeout=30)
        failing[0] = False
        assert prod.send(b"second").result(timeout=30).offset == 0
    admin.delete_scalable_topic(topic)


def test_a_failed_layout_adoption_is_retried_and_sends_go_on(admin, unique, monkeypatch):
    """A producer that fails to adopt a new layout must not keep its sends gated
    (nor leave them refused by the sealed parent): it adopts the layout again."""
    import clients._producer_core as core

    real_retire, failures = core.ProducerCore._retire, []

    async def failing_once(self, retiring, layout):
        if not failures:
            failures.append(layout.epoch)
            raise RuntimeError("injected")
        await real_retire(self, retiring, layout)

    monkeypatch.setattr(core.ProducerCore, "_retire", failing_once)
    topic = f"topic://clients/ns/lost-adopt-{unique}"
    admin.create_scalable_topic(topic, 1)
    with Producer(topic) as prod:
        prod.send(b"before", key="k").result(timeout=30)
        children = admin.split_segment(topic, 0)["children"]
        ids = {
            prod.send(f"m{i}".encode(), key=f"k{i}").result(timeout=30).segment_id
            for i in range(20)
        }
    assert failures and ids <= set(children)
    admin.delete_scalable_topic(topic)


def test_queue_consumers_with_splits_and_negative_acks(admin, unique):
    topic = f"topic://clients/ns/queue-t-{unique}"
    admin.create_scalable_topic(topic, 2)
    admin.create_subscription(topic, "work")
    consumers = [QueueConsumer(topic, "work") for _ in range(4)]
    acked: dict[tuple[int, int], int] = defaultdict(int)
    values: set[str] = set()
    lock, stop = threading.Lock(), threading.Event()
    rnd = random.Random(11)

    def work(consumer: QueueConsumer) -> None:
        while not stop.is_set():
            message = consumer.receive(timeout=0.2)
            if message is None:
                continue
            if rnd.random() < 0.05:
                consumer.negative_acknowledge(message)
                continue
            consumer.acknowledge(message)
            with lock:
                acked[message.message_id] += 1
                values.add(message.value.decode())

    threads = [threading.Thread(target=work, args=(c,), daemon=True) for c in consumers]
    for thread in threads:
        thread.start()
    with Producer(topic) as prod:
        for i in range(20_000):
            prod.send(str(i).encode(), key=f"k{i % 100}")
            if i == 5_000:
                admin.split_segment(topic, 0)
            if i == 12_000:
                admin.split_segment(topic, 1)
    wait_for(
        lambda: len(values) >= 20_000,
        120,
        lambda: f"every message acknowledged ({len(values)} of 20000 after 120 s)",
    )
    time.sleep(0.5)
    stop.set()
    for thread in threads:
        thread.join()
    for consumer in consumers:
        consumer.close()
    assert values == {str(i) for i in range(20_000)}
    wait_for(
        lambda: admin.get_stats(topic)["subscriptions"]["work"]["backlog"] == 0, 10, "backlog 0"
    )
    admin.delete_scalable_topic(topic)


def test_checkpoint_consumer_resumes_exactly_after_its_checkpoint(admin, unique):
    topic = f"topic://clients/ns/ckpt-t-{unique}"
    admin.create_scalable_topic(topic, 2)
    prod = Producer(topic)
    for i in range(1_000):
        prod.send(f"{i}".encode(), key=f"k{i % 20}")
    prod.flush()
    first = CheckpointConsumer(topic, "connector", "reader")
    before = [first.receive(timeout=5) for _ in range(400)]
    assert all(m is not None for m in before)
    checkpoint = Checkpoint.from_json(first.checkpoint().to_json())
    first.close()

    admin.split_segment(topic, 0)
    for i in range(1_000, 2_000):
        prod.send(f"{i}".encode(), key=f"k{i % 20}")
    prod.flush()
    admin.split_segment(topic, 1)
    for i in range(2_000, 3_000):
        prod.send(f"{i}".encode(), key=f"k{i % 20}")
    prod.close()

    resumed = CheckpointConsumer(topic, "connector", "reader", start=checkpoint)
    after: list = []
    deadline = time.monotonic() + 90  # children boot slowly on a loaded machine
    while len(after) < 3_000 - len(before) and time.monotonic() < deadline:
        after += resumed.receive_batch(1_000, timeout=1)
    after += resumed.receive_batch(1_000, timeout=1)  # anything extra would be a bug
    resumed.close()
    seen_before = {int(m.value) for m in before}
    seen_after = [int(m.value) for m in after]
    assert len(seen_after) == len(set(seen_after)), "duplicates after resume"
    assert set(seen_after) == set(range(3_000)) - seen_before, "not exactly what follows"
    per_key: dict[str, list[int]] = defaultdict(list)
    for message in before + after:
        per_key[message.key].append(int(message.value))
    assert all(v == sorted(v) for v in per_key.values()), "key order broken"
    admin.delete_scalable_topic(topic)


@ray.remote(num_cpus=0)
class Sink:
    """An application actor holding a consumer next to its own state."""

    def __init__(self, topic: str) -> None:
        self.consumer = StreamConsumer(topic, "app", "sink-actor")
        self.values: list[str] = []

    def pump(self, target: int, timeout_s: float) -> int:
        deadline = time.monotonic() + timeout_s
        while len(self.values) < target and time.monotonic() < deadline:
            for message in self.consumer.receive_batch(1_000, timeout=0.5):
                self.values.append(message.value.decode())
                self.consumer.acknowledge_cumulative(message)
        return len(self.values)

    def values_seen(self) -> list[str]:
        return self.values


@ray.remote(num_cpus=0)
def produce_with(producer: Producer, start: int, count: int) -> int:
    """A producer shipped into a task re-opens itself there."""
    futures = [
        producer.send(str(i).encode(), key=f"k{i % 50}") for i in range(start, start + count)
    ]
    producer.flush()
    return sum(1 for f in futures if f.exception() is None)


def test_acknowledging_a_batch_acknowledges_every_segment_in_it(admin, unique):
    """``acknowledge_cumulative(batch)`` covers each segment's messages in the batch, not
    only the segment of its last message, so a sealed parent finishes and its children
    are delivered."""
    topic = f"topic://clients/ns/ackbatch-t-{unique}"
    admin.create_scalable_topic(topic, 2)
    admin.create_subscription(topic, "s")
    with Producer(topic) as producer:
        producer.send_batch([f"v{i}".encode() for i in range(400)], [f"k{i}" for i in range(400)])
    consumer = StreamConsumer(topic, "s", "c")
    batch: list = []
    while len(batch) < 400:
        batch += consumer.receive_batch(400 - len(batch), timeout=10)
    assert len({m.segment_id for m in batch}) == 2
    with pytest.raises(InvalidArgumentError, match="Message"):
        consumer.acknowledge_cumulative([batch[0], "not a message"])
    consumer.acknowledge_cumulative(batch)
    children = admin.split_segment(topic, 0)["children"]
    with Producer(topic) as producer:
        producer.send_batch([b"after"] * 50, [f"k{i}" for i in range(50)])
    after = []
    deadline = time.monotonic() + 30
    while len(after) < 50 and time.monotonic() < deadline:
        received = consumer.receive_batch(100, timeout=0.5)
        after += received
        consumer.acknowledge_cumulative(received)
    consumer.close()
    assert [m.value for m in after] == [b"after"] * 50
    assert {m.segment_id for m in after} <= {1, *children}
    wait_for(lambda: admin.get_stats(topic)["subscriptions"]["s"]["backlog"] == 0, 15, "no backlog")
    admin.delete_scalable_topic(topic)


def test_close_leaves_at_once_and_what_was_not_acknowledged_comes_again(admin, unique):
    """``close()`` flushes the acknowledgements made and leaves without waiting for the
    rest (``release_timeout_s`` is for rebalances): the next consumer gets exactly the
    unacknowledged messages, in order."""
    topic = f"topic://clients/ns/closing-t-{unique}"
    admin.create_scalable_topic(topic, 1)
    admin.create_subscription(topic, "s")
    with Producer(topic) as producer:
        producer.send_batch([f"v{i}".encode() for i in range(100)], [f"k{i}" for i in range(100)])
    first = StreamConsumer(topic, "s", "first")
    taken: list = []
    while len(taken) < 100:
        taken += first.receive_batch(100 - len(taken), timeout=10)
    first.acknowledge_cumulative(taken[39])
    started = time.monotonic()
    first.close()
    assert time.monotonic() - started < 5, "close waited for acknowledgements"
    second = StreamConsumer(topic, "s", "second")
    again: list = []
    while len(again) < 60:
        received = second.receive_batch(100, timeout=10)
        assert received, f"only {len(again)} of the 60 unacknowledged came again"
        again += received
    assert [m.value for m in again] == [f"v{i}".encode() for i in range(40, 100)]
    second.close()
    admin.delete_scalable_topic(topic)


def test_a_received_table_holds_the_messages_as_columns_and_acknowledges_per_segment(admin, unique):
    """``receive_table`` is ``receive_batch`` without a Python object per message: the
    same messages, each segment's in offset order, and ``acknowledge_cumulative`` of
    any rows of it acks each segment up to its highest offset among them."""
    topic = f"topic://clients/ns/acktable-t-{unique}"
    admin.create_scalable_topic(topic, 2)
    admin.create_subscription(topic, "s")
    values = [f"v{i}".encode() for i in range(400)]
    with Producer(topic) as producer:
        ids = producer.send_batch(values, [f"k{i}" for i in range(400)]).result()
    consumer = StreamConsumer(topic, "s", "c")
    with pytest.raises(InvalidArgumentError, match="max_messages"):
        consumer.receive_table(0)
    parts = []
    while sum(p.num_rows for p in parts) < 400:
        parts.append(consumer.receive_table(400, timeout=10))
    table = pa.concat_tables(parts)
    assert table.schema == RECEIVED_SCHEMA
    columns = (table.column(c).to_pylist() for c in ("segment_id", "offset", "value"))
    received = {(segment, offset): value for segment, offset, value in zip(*columns, strict=True)}
    stored = zip(ids.segment_ids.tolist(), ids.offsets.tolist(), values, strict=True)
    assert received == {(segment, offset): value for segment, offset, value in stored}
    for segment in set(ids.segment_ids.tolist()):
        offsets = table.filter(pc.equal(table["segment_id"], segment))["offset"].to_pylist()
        assert offsets == sorted(offsets)
    assert consumer.receive_table(10, timeout=0.2).num_rows == 0

    with pytest.raises(InvalidArgumentError, match="segment_id"):
        consumer.acknowledge_cumulative(table.drop_columns(["segment_id"]))
    first = table.slice(0, 10)  # ten rows of one segment, from its start
    consumer.acknowledge_cumulative(first)

    def backlog() -> int:
        return admin.get_stats(topic)["subscriptions"]["s"]["backlog"]

    wait_for(lambda: backlog() == 390, 15, lambda: f"backlog 390, not {backlog()}")
    consumer.acknowledge_cumulative(table.to_batches()[-1])  # a RecordBatch works too
    consumer.acknowledge_cumulative(table)
    wait_for(lambda: backlog() == 0, 15, lambda: f"no backlog, not {backlog()}")
    consumer.close()
    admin.delete_scalable_topic(topic)


def test_ray_actor_consumes_what_ray_tasks_produce(admin, unique):
    topic = f"topic://clients/ns/rayapps-t-{unique}"
    admin.create_scalable_topic(topic, 3)
    admin.create_subscription(topic, "app")
    sink = Sink.remote(topic)
    producer = Producer(topic)
    acked = ray.get([produce_with.remote(producer, i * 5_000, 5_000) for i in range(4)])
    producer.close()
    assert sum(acked) == 20_000
    assert ray.get(sink.pump.remote(20_000, 60)) == 20_000
    assert sorted(map(int, ray.get(sink.values_seen.remote()))) == list(range(20_000))
    ray.kill(sink, no_restart=True)
    admin.delete_scalable_topic(topic)
