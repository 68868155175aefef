"""Spark Structured Streaming on topics, with real Spark on Ray (RayDP) and the JVM
connector: micro-batches through splits, a merge and a segment's restart; a restart
from the checkpoint; a start at a publish time under Trigger.Once, then AvailableNow;
segments that speak only TLS; a lost segment; bad options refused when the query is
defined."""

from __future__ import annotations

import contextlib
import socket
import threading
import time
import urllib.request
from collections import Counter, defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from test_data_plane_tls import _topic as tls_topic
from test_data_plane_tls import pki  # noqa: F401  (a fixture)

from clients import Producer, ScalableTopicsAdmin
from runtime import tls
from runtime.hashing import key_hash
from runtime.names import TopicName
from tests.segments import crash_host_of, lose_storage
from tests.txn_support import commit_beside_an_abort

TENANT, NAMESPACE = "sparkstream", "ns"


class Sent:
    """What was produced: per key, the sequence of its values."""

    def __init__(self, topic: str) -> None:
        self.topic = topic
        self.values: list[str] = []
        self.count: dict[str, int] = defaultdict(int)

    def produce(self, n: int, keys: int = 23) -> None:
        with Producer(self.topic) as producer:
            for i in range(n):
                key = f"k{i % keys}"
                value = f"{key}:{self.count[key]}"
                self.count[key] += 1
                producer.send(value.encode(), key=key)
                self.values.append(value)


class Batches:
    """A foreachBatch sink that keeps each micro-batch's rows, in batch order."""

    def __init__(self) -> None:
        self.rows: list[tuple[int, str, str, int, int]] = []
        self.lock = threading.Lock()

    def __call__(self, frame: Any, batch_id: int) -> None:
        rows = frame.select("key", "value", "segment_id", "offset").collect()
        with self.lock:
            self.rows += [
                (batch_id, r.key, bytes(r.value).decode(), r.segment_id, r.offset) for r in rows
            ]

    def values(self) -> list[str]:
        with self.lock:
            return [value for _, _, value, _, _ in self.rows]

    def wait_for(self, count: int, timeout_s: float = 180) -> None:
        deadline = time.monotonic() + timeout_s
        while len(self.values()) < count and time.monotonic() < deadline:
            time.sleep(0.5)


def check_key_order(rows: list[tuple[int, str, str, int, int]], from_start: bool = True) -> None:
    """Batch by batch, and within a batch in offset order of the one segment that holds
    the key (a key is never in two segments of one batch): each key's values follow
    one another, from its first (``from_start``) or from the first read."""
    last: dict[str, int] = {}
    segments: dict[tuple[int, str], set[int]] = defaultdict(set)
    for batch_id, key, _value, segment, _ in rows:
        segments[(batch_id, key)].add(segment)
    assert all(len(s) == 1 for s in segments.values()), "a key read from two segments at once"
    for _, key, value, _, _ in sorted(rows, key=lambda r: (r[0], r[3], r[4])):
        sequence = int(value.split(":")[1])
        if not from_start:
            last.setdefault(key, sequence - 1)
        assert last.get(key, -1) == sequence - 1, (key, sequence, last.get(key))
        last[key] = sequence


EVERY_HALF_SECOND = {"processingTime": "500 milliseconds"}


def merge_the_lowest_two(admin: ScalableTopicsAdmin, topic: str) -> None:
    """Merge the two active segments with the lowest hash ranges (neighbours)."""
    active = sorted(
        admin.get_layout(topic).active_segments.values(), key=lambda s: s.hash_range.start
    )
    admin.merge_segments(topic, active[0].segment_id, active[1].segment_id)


def start(
    spark,
    topic: str,
    sink: Batches,
    checkpoint: Path,
    trigger: dict[str, Any] = EVERY_HALF_SECOND,
    **options: str,
) -> Any:
    reader = spark.readStream.format("raytopics").option("topic", topic)
    for name, value in options.items():
        reader = reader.option(name, value)
    return (
        reader.load()
        .writeStream.foreachBatch(sink)
        .option("checkpointLocation", str(checkpoint))
        .trigger(**trigger)
        .start()
    )


def run_to_end(
    spark, topic: str, sink: Batches, checkpoint: Path, trigger: dict[str, Any], **options: str
) -> None:
    """A query under a trigger that stops by itself (Once, AvailableNow): it must."""
    query = start(spark, topic, sink, checkpoint, trigger, **options)
    assert query.awaitTermination(120), "the query did not stop by itself"
    assert query.exception() is None


def test_a_streaming_read_through_two_splits_and_a_merge_gets_everything_once_in_key_order(
    spark, admin: ScalableTopicsAdmin, unique: str, tmp_path: Path
) -> None:
    topic = f"topic://{TENANT}/{NAMESPACE}/flow-{unique}"
    admin.create_scalable_topic(topic, 2)
    sent = Sent(topic)
    sent.produce(300)
    sink = Batches()
    query = start(
        spark, topic, sink, tmp_path / "cp", startingOffsets="earliest", maxMessagesPerTrigger="250"
    )
    try:
        sink.wait_for(100)
        admin.split_segment(topic, 0)
        sent.produce(300)
        admin.split_segment(topic, 1)
        sent.produce(300)
        merge_the_lowest_two(admin, topic)
        sent.produce(300)
        sink.wait_for(900)
        restarted = admin.get_layout(topic).find_active_segment(0)  # its process dies;
        crash_host_of(restarted.name(TopicName.parse(topic)))
        sent.produce(300)  # Ray starts it again, and the executors find it anew
        sink.wait_for(len(sent.values))
        time.sleep(2)  # nothing more may come
    finally:
        query.stop()
    assert query.exception() is None
    assert sorted(sink.values()) == sorted(sent.values) and len(sink.values()) == 1500
    check_key_order(sink.rows)


def _sink_query(spark, source: str, sink: str, checkpoint: Path, trigger: dict[str, Any]) -> Any:
    """Copies ``source`` into ``sink`` through the raytopics sink, keys kept."""
    return (
        spark.readStream.format("raytopics").option("topic", source)
        .option("startingOffsets", "earliest").load()
        .select("key", "value")
        .writeStream.format("raytopics").option("topic", sink)
        .option("checkpointLocation", str(checkpoint))
        .trigger(**trigger)
        .start()
    )  # fmt: skip


def _sink_rows(spark, admin: ScalableTopicsAdmin, sink: str) -> list[tuple[str, str]]:
    """The sink's records as (key, value), each key's in the order the topic holds them: a
    key's segments form a chain of ancestors, so by creation epoch, then offset."""
    from clients.spark import read_topic

    created = {i: s.created_at_epoch for i, s in admin.get_layout(sink).all_segments.items()}
    rows = read_topic(spark, sink).select("key", "value", "segment_id", "offset").collect()
    ordered = sorted(rows, key=lambda r: (created[r.segment_id], r.segment_id, r.offset))
    return [(r.key, bytes(r.value).decode()) for r in ordered]


def test_the_sink_stores_each_record_once_in_key_order_through_splits_a_merge_and_a_restart(
    spark, admin: ScalableTopicsAdmin, unique: str, tmp_path: Path
) -> None:
    """The sink appends over the segments' data planes, each task's chunks recorded by
    the cluster first: the sink topic splits and merges under the running query, which
    is then stopped (a batch may be cut half-stored) and run again to the end."""
    source = f"topic://{TENANT}/{NAMESPACE}/sink-in-{unique}"
    sink = f"topic://{TENANT}/{NAMESPACE}/sink-out-{unique}"
    admin.create_scalable_topic(source, 2)
    admin.create_scalable_topic(sink, 2)
    sent = Sent(source)
    sent.produce(2_000)
    checkpoint = tmp_path / "cp"
    query = _sink_query(spark, source, sink, checkpoint, EVERY_HALF_SECOND)
    try:
        time.sleep(3)
        admin.split_segment(sink, 0)
        sent.produce(2_000)
        time.sleep(2)
        merge_the_lowest_two(admin, sink)
        sent.produce(1_000)
        time.sleep(1)
    finally:
        query.stop()
    assert query.exception() is None
    sent.produce(500)
    admin.split_segment(sink, 1)
    query = _sink_query(spark, source, sink, checkpoint, {"availableNow": True})
    assert query.awaitTermination(180), "the query did not stop by itself"
    assert query.exception() is None
    rows = _sink_rows(spark, admin, sink)
    assert Counter(v for _, v in rows) == Counter(sent.values), "each record once"
    last: dict[str, int] = {}
    for key, value in rows:
        assert value.startswith(f"{key}:"), (key, value)
        sequence = int(value.split(":")[1])
        assert last.get(key, -1) == sequence - 1, (key, sequence, last.get(key))
        last[key] = sequence


def test_a_query_restarted_from_its_checkpoint_reads_exactly_what_came_after(
    spark, admin: ScalableTopicsAdmin, unique: str, tmp_path: Path
) -> None:
    topic = f"topic://{TENANT}/{NAMESPACE}/restart-{unique}"
    admin.create_scalable_topic(topic, 2)
    sent = Sent(topic)
    sent.produce(200)
    first = Batches()
    query = start(spark, topic, first, tmp_path / "cp", startingOffsets="earliest")
    first.wait_for(200)
    time.sleep(1)
    query.stop()
    admin.split_segment(topic, 0)
    sent.produce(250)
    second = Batches()
    query = start(spark, topic, second, tmp_path / "cp", startingOffsets="earliest")
    try:
        second.wait_for(250)
        time.sleep(2)
    finally:
        query.stop()
    assert sorted(first.values() + second.values()) == sorted(sent.values)
    assert len(first.values()) + len(second.values()) == 450
    check_key_order(first.rows + [(b + 10_000, *rest) for b, *rest in second.rows])


def test_progress_says_how_far_behind_and_a_minimum_per_trigger_waits_for_records_or_the_delay(
    spark, admin: ScalableTopicsAdmin, unique: str, tmp_path: Path
) -> None:
    sent = _produced(admin, f"behind-{unique}", 2, 300)
    with _reading(spark, sent.topic, tmp_path / "cp", maxMessagesPerTrigger="100") as (query, sink):
        sink.wait_for(300)
        _wait_for_progress(query, lambda p: p["numInputRows"] == 0)
        ran = [p for p in query.recentProgress if p["numInputRows"] > 0]
    behind = [p["sources"][0]["metrics"] for p in ran]
    assert [int(m["totalOffsetsBehindLatest"]) for m in behind] == [200, 100, 0], behind
    first = behind[0]  # 200 left in two segments, shared as the cap shares a batch
    assert int(first["minOffsetsBehindLatest"]) + int(first["maxOffsetsBehindLatest"]) == 200
    assert float(first["avgOffsetsBehindLatest"]) == 100.0
    assert int(first["segmentsRead"]) == 2 and all(int(m["segmentsRead"]) >= 1 for m in behind)

    sent = _produced(admin, f"few-{unique}", 1, 10)
    options = {"minMessagesPerTrigger": "50", "maxTriggerDelay": "6s"}
    with _reading(spark, sent.topic, tmp_path / "few", **options) as (_, sink):
        began = time.monotonic()
        sink.wait_for(10)
        waited = time.monotonic() - began
        sent.produce(60)  # enough: read at once
        sink.wait_for(70)
    assert waited >= 4, f"10 of the 50 records asked for were read after {waited:.1f} s, not 6"
    assert sorted(sink.values()) == sorted(sent.values)
    sizes = sorted(Counter(b for b, *_ in sink.rows).items())
    assert sizes[0][1] == 10, f"the first batch held the 10 there were: {sizes}"

    sent = _produced(admin, f"sized-{unique}", 1, 200)
    with _reading(spark, sent.topic, tmp_path / "sized", maxBytesPerTrigger="1k") as (_, sink):
        sink.wait_for(200)
    assert sorted(sink.values()) == sorted(sent.values)
    sizes = Counter(b for b, *_ in sink.rows)
    assert len(sizes) >= 2 and max(sizes.values()) < 200, f"1 KiB a batch: {sizes}"


def _produced(admin: ScalableTopicsAdmin, name: str, segments: int, count: int) -> Sent:
    """A new topic of ``segments`` segments holding ``count`` records."""
    sent = Sent(f"topic://{TENANT}/{NAMESPACE}/{name}")
    admin.create_scalable_topic(sent.topic, segments)
    sent.produce(count)
    return sent


@contextlib.contextmanager
def _reading(spark, topic: str, checkpoint: Path, **options: str) -> Iterator[tuple[Any, Batches]]:
    """A query from the earliest record into a ``Batches`` sink, stopped after the block."""
    sink = Batches()
    query = start(spark, topic, sink, checkpoint, startingOffsets="earliest", **options)
    try:
        yield query, sink
    finally:
        query.stop()


def _wait_for_progress(query: Any, done: Any, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if query.lastProgress is not None and done(query.lastProgress):
            return
        time.sleep(0.2)
    raise AssertionError(f"no such progress within {timeout_s} s: {query.lastProgress}")


def test_a_query_from_a_publish_time_runs_once_then_available_now_and_stops_by_itself(
    spark, admin: ScalableTopicsAdmin, unique: str, tmp_path: Path
) -> None:
    topic = f"topic://{TENANT}/{NAMESPACE}/time-{unique}"
    admin.create_scalable_topic(topic, 2)
    sent = Sent(topic)
    sent.produce(100)
    time.sleep(0.05)
    after = int(time.time() * 1000)
    time.sleep(0.05)
    sent.produce(150)

    once = Batches()  # everything published from `after` on, in one batch
    run_to_end(spark, topic, once, tmp_path / "cp", {"once": True}, startingTimestamp=str(after))
    assert sorted(once.values()) == sorted(sent.values[100:])
    assert {batch for batch, *_ in once.rows} == {0}

    admin.split_segment(topic, 1)
    sent.produce(100)
    now = Batches()  # what came since, in batches of at most 40, then the query ends
    run_to_end(
        spark, topic, now, tmp_path / "cp", {"availableNow": True}, maxMessagesPerTrigger="40"
    )
    assert sorted(now.values()) == sorted(sent.values[250:])
    sizes = Counter(batch for batch, *_ in now.rows)
    assert len(sizes) >= 3 and max(sizes.values()) <= 40, sizes
    check_key_order(once.rows + [(b + 10_000, *rest) for b, *rest in now.rows], from_start=False)


def test_a_query_and_a_batch_read_get_only_committed_transactions(
    spark, admin: ScalableTopicsAdmin, unique: str, tmp_path: Path
) -> None:
    """Aborted transactions' records (in the middle of each segment), transactions'
    markers (at their ends), and a transaction still open: the streaming source and
    ``read_topic`` step over the first two, never taking them for records lost, and stop
    at the third, whose messages come once it commits."""
    from clients.spark import read_topic

    topic = f"topic://{TENANT}/{NAMESPACE}/txn-{unique}"
    admin.create_scalable_topic(topic, 2)
    with Producer(topic) as producer:
        committed = commit_beside_an_abort(admin, producer, 30)
        batch = [bytes(v).decode() for v in read_topic(spark, topic).toPandas()["value"]]
        assert sorted(batch) == committed
        sink = Batches()
        run_to_end(
            spark, topic, sink, tmp_path / "cp", {"availableNow": True}, startingOffsets="earliest"
        )
        assert sorted(sink.values()) == committed
        later = admin.new_transaction(timeout_s=300)
        for i in range(5):
            producer.send(f"later-{i}".encode(), key=f"k{i}", txn=later)
        producer.flush()
    more = Batches()
    query = start(spark, topic, more, tmp_path / "cp")
    try:
        time.sleep(2)  # triggers run meanwhile: the open transaction holds every reader
        assert more.values() == []
        later.commit()
        more.wait_for(5)
        assert sorted(more.values()) == [f"later-{i}" for i in range(5)]
    finally:
        query.stop()


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"topic": "topic://sparkstream/ns/none-such"}, "topic_not_found"),
        ({"startingOffsets": "{not json"}, "startingOffsets"),
        ({"maxMessagesPerTrigger": "-5"}, "maxMessagesPerTrigger must be an integer >= 1"),
        ({"startingOffsets": "earliest", "startingTimestamp": "0"}, "exclude each other"),
        ({"failOnDataLoss": "maybe"}, "failOnDataLoss must be true or false"),
        ({"minMessagesPerTrigger": "0"}, "minMessagesPerTrigger must be an integer >= 1"),
        ({"maxTriggerDelay": "soon"}, "maxTriggerDelay must be a duration"),
        ({"maxBytesPerTrigger": "lots"}, "maxBytesPerTrigger must be a size"),
    ],
)
def test_bad_options_fail_at_load_naming_the_option(
    spark,
    admin: ScalableTopicsAdmin,
    unique: str,
    options: dict[str, str],
    message: str,
) -> None:
    topic = f"topic://{TENANT}/{NAMESPACE}/bad-{unique}"
    admin.create_scalable_topic(topic, 1)
    reader = spark.readStream.format("raytopics").option("topic", topic)
    for name, value in options.items():
        reader = reader.option(name, value)
    with pytest.raises(Exception, match=message):
        reader.load()
    admin.delete_scalable_topic(topic)


def test_a_segment_gone_for_good_fails_the_query_or_is_skipped_with_a_warning(
    spark, admin: ScalableTopicsAdmin, unique: str, tmp_path: Path
) -> None:
    topic = f"topic://{TENANT}/{NAMESPACE}/lost-{unique}"
    admin.create_scalable_topic(topic, 2)
    sent = Sent(topic)
    sent.produce(200)
    layout = admin.get_layout(topic)
    lost = layout.get(1).name(TopicName.parse(topic))
    lose_storage([lost], admin.get_stats(topic)["incarnation"])
    deadline = time.monotonic() + 30
    while admin.get_status(topic)["state"] == "ready" and time.monotonic() < deadline:
        time.sleep(0.2)

    # both queries at once: each spends its first planning calls waiting for the segment
    strict, lenient = Batches(), Batches()
    failing = start(spark, topic, strict, tmp_path / "strict", startingOffsets="earliest")
    query = start(
        spark, topic, lenient, tmp_path / "lenient", startingOffsets="earliest",
        failOnDataLoss="false",
    )  # fmt: skip
    try:
        with pytest.raises(Exception, match=r"unavailable_segments.*segment 1 did not answer"):
            failing.awaitTermination(120)
        assert strict.values() == []
        owner = layout.find_active_segment
        kept = [v for v in sent.values if owner(key_hash(v.split(":")[0])).segment_id == 0]
        lenient.wait_for(len(kept), timeout_s=120)
        time.sleep(2)
        assert query.isActive and query.exception() is None
    finally:
        query.stop()
    assert sorted(lenient.values()) == sorted(kept)


def test_a_query_reads_segments_that_speak_only_tls_when_it_trusts_their_ca(
    spark,
    pki: dict[str, str],  # noqa: F811  (the fixture imported above)
    unique: str,
    tmp_path: Path,
) -> None:
    """The connector's executors read TLS segments straight, trusting the ``caFile``
    option; with a CA that did not issue the segments' certificate the query fails
    saying so, and reads nothing."""
    with pytest.MonkeyPatch.context() as monkeypatch:
        topic = tls_topic(monkeypatch, unique, pki["cert"], pki["key"])
        monkeypatch.setenv(tls.CA_ENV, pki["ca"])
        sent = Sent(topic)
        sent.produce(500)

    trusted, rogue = Batches(), Batches()
    available_now = {"availableNow": True}
    run_to_end(
        spark, topic, trusted, tmp_path / "trusted", available_now,
        startingOffsets="earliest", caFile=pki["ca"],
    )  # fmt: skip
    assert sorted(trusted.values()) == sorted(sent.values)
    refused = start(
        spark, topic, rogue, tmp_path / "rogue", available_now,
        startingOffsets="earliest", caFile=pki["rogue_ca"],
    )  # fmt: skip
    with pytest.raises(Exception, match=r"tls_error.*not trusted"):
        refused.awaitTermination(120)
    assert rogue.values() == []
    ScalableTopicsAdmin().delete_scalable_topic(topic)


def test_spark_session_points_streaming_at_a_gateway_and_keeps_one_it_was_given(spark) -> None:
    """Every streaming test here runs on ``spark_session``'s session with no other call;
    a gateway set for the session stays its own."""
    from clients.spark_session import spark_session
    from clients.spark_streaming import URL_CONF

    url = spark.conf.get(URL_CONF)
    with urllib.request.urlopen(f"{url}/openapi.json", timeout=10) as answer:
        assert answer.status == 200
    try:
        spark.conf.set(URL_CONF, "http://127.0.0.1:9")
        assert spark_session().conf.get(URL_CONF) == "http://127.0.0.1:9"
        spark.conf.unset(URL_CONF)
        assert spark_session().conf.get(URL_CONF) == url  # this node's gateway again
    finally:
        spark.conf.set(URL_CONF, url)


class _Conf(dict):
    set = dict.__setitem__


class _Session:
    """What ``enable_streaming`` uses of a Spark session: its conf."""

    def __init__(self) -> None:
        self.conf = _Conf()


def test_the_default_port_taken_by_another_program_gives_every_session_one_gateway(
    ray_cluster, monkeypatch
) -> None:
    """Another program holds the default port: the first session gets a gateway on a free
    port, and every later one that same gateway, not one more each."""
    import ray

    from actors.gateway.server import running_gateways, stop_gateway
    from clients import spark_streaming

    host = ray.util.get_node_ip_address()
    before = set(running_gateways())
    monkeypatch.delenv(spark_streaming.GATEWAY_PORT_ENV, raising=False)
    with socket.socket() as taken:
        taken.bind((host, 0))
        taken.listen()
        port = taken.getsockname()[1]
        monkeypatch.setattr(spark_streaming, "DEFAULT_GATEWAY_PORT", port)
        try:
            urls = [spark_streaming.enable_streaming(_Session()) for _ in range(3)]
            assert len(set(urls)) == 1 and not urls[0].endswith(f":{port}"), urls
            with urllib.request.urlopen(f"{urls[0]}/openapi.json", timeout=10) as answer:
                assert answer.status == 200
        finally:
            for started in set(running_gateways()) - before:
                stop_gateway(started)
