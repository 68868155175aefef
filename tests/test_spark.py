"""Spark on Ray (RayDP) against real segment actors: snapshot reads, completeness, writes.

One Spark session (``conftest.spark``, one small executor) serves the whole
module: starting Spark costs far more than any test here.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter, defaultdict
from pathlib import Path

import pytest
import ray
from conftest import TIER_ROOT

from actors.segment.lookup import find_segment_actor
from clients import Checkpoint, Producer, ScalableTopicsAdmin
from clients.ray_data import read_topic_dataset
from clients.spark import (
    OUTPUT_SCHEMA,
    PartialReadWarning,
    plan_read,
    read_topic,
    write_topic,
)
from runtime.batch import make_batch
from runtime.errors import (
    InvalidArgumentError,
    UnauthenticatedError,
    UnauthorizedError,
    UnavailableSegmentsError,
)
from runtime.hashing import key_hash
from runtime.names import TopicName
from tests.segments import lose_storage, segment_actor, served_segments


@pytest.fixture(scope="module")
def admin(ray_cluster) -> ScalableTopicsAdmin:
    return ScalableTopicsAdmin()


def test_the_driver_agent_is_told_where_to_log(ray_cluster) -> None:
    """RayDP's Java agent kills the Spark driver when it cannot create its log directory,
    and its default (``/tmp/ray/session_latest/logs``) is a stale link whenever Ray runs
    with another temp dir or ``/tmp/ray`` was cleaned: the driver gets this session's."""
    from clients.spark_session import default_configs

    options = default_configs()["spark.driver.extraJavaOptions"].split()
    (logs,) = [o.split("=", 1)[1] for o in options if o.startswith("-Dray.logging.dir=")]
    assert Path(logs).is_dir()
    assert Path(logs).parent.name.startswith("session_")


def test_executors_address_the_systems_namespace_not_the_drivers(ray_cluster, monkeypatch) -> None:
    """A program that joined Ray in a namespace of its own (``ray.init(namespace=...)``,
    then ``connect()``) keeps the system's in ``RAYTOPICS_NAMESPACE``: its executors'
    read and write tasks must look the system's actors up there."""
    from clients.spark_session import default_configs

    monkeypatch.setenv("RAYTOPICS_NAMESPACE", "the-systems-namespace")
    assert ray.get_runtime_context().namespace != "the-systems-namespace"
    configs = default_configs()
    assert configs["spark.executorEnv.RAYTOPICS_NAMESPACE"] == "the-systems-namespace"


def send(producer: Producer, first: int, count: int, keys: int = 97) -> dict[str, list[int]]:
    """Values first..first+count-1 under ``keys`` keys; returns what each key got."""
    values = list(range(first, first + count))
    key_names = [f"key-{v % keys}" for v in values]
    properties = [{"n": str(v)} if v % 10 == 0 else None for v in values]
    producer.send_batch([str(v).encode() for v in values], key_names, properties).result()
    sent: dict[str, list[int]] = defaultdict(list)
    for key, value in zip(key_names, values, strict=True):
        sent[key].append(value)
    return sent


def merge_into(total: dict[str, list[int]], part: dict[str, list[int]]) -> None:
    for key, values in part.items():
        total[key].extend(values)


def per_key(df) -> dict[str, tuple[int, int]]:
    from pyspark.sql import functions as F

    rows = df.groupBy("key").agg(F.count("*").alias("n"), F.sum("value_num").alias("total"))
    return {r.key: (r.n, r.total) for r in rows.collect()}


@pytest.mark.parametrize("storage", ["local", "tiered", "tiered-s3"])
def test_read_after_splits_and_merges_returns_every_record_once(
    admin, spark, unique, storage: str, request
) -> None:
    """``tiered``: the sealed segments are read from the topic's tier (a ``file://`` one)
    by a Parquet scan, and by Ray Data from the files too, without waking them;
    ``tiered-s3``: from an S3 server on loopback, by the tasks with ``pyarrow``."""
    topic = f"topic://spark/ns/read-dag-{storage}-{unique}"
    admin.create_scalable_topic(topic, num_segments=2)
    admin.create_subscription(topic, "audit")
    if storage == "tiered":
        tier = {"uri": f"file://{TIER_ROOT}/spark-{unique}", "afterS": 0, "idleS": 1}
        admin.set_policy(topic, {"tiering": tier})
    elif storage == "tiered-s3":
        request.getfixturevalue("s3_endpoint")  # the operator's s3://tier/ bucket, up
        uri = f"s3://tier/spark-{unique}"
        admin.set_policy(topic, {"tiering": {"uri": uri, "afterS": 0, "idleS": 1}})
    sent: dict[str, list[int]] = defaultdict(list)
    with Producer(topic) as producer:
        merge_into(sent, send(producer, 0, 4_000))
        admin.split_segment(topic, 0)  # -> 2 [0000-3fff], 3 [4000-7fff]
        merge_into(sent, send(producer, 4_000, 4_000))
        admin.split_segment(topic, 1)  # -> 4 [8000-bfff], 5 [c000-ffff]
        merge_into(sent, send(producer, 8_000, 4_000))
        admin.merge_segments(topic, 3, 4)  # -> 6 [4000-bfff]
        merge_into(sent, send(producer, 12_000, 4_000))
    layout = admin.get_layout(topic)
    assert len(layout.all_segments) == 7
    if storage != "local":
        wait_hibernating(admin, topic, 4)

    df = read_topic(spark, topic)
    assert df.missing_segments == ()
    assert df.schema.simpleString() == (
        "struct<key:string,value:binary,hash:int,segment_id:bigint,offset:bigint,"
        "publish_time:timestamp,properties:map<string,string>>"
    )
    numbered = df.selectExpr("*", "cast(cast(value as string) as bigint) as value_num")
    expected = {key: (len(values), sum(values)) for key, values in sent.items()}
    assert per_key(numbered) == expected  # counts and checksums, aggregated by Spark

    rows = numbered.collect()
    assert len(rows) == 16_000
    assert len({(r.segment_id, r.offset) for r in rows}) == 16_000
    by_key: dict[str, list] = defaultdict(list)
    for row in rows:
        assert row.hash == key_hash(row.key)
        assert row.hash in layout.all_segments[row.segment_id].hash_range
        assert row.properties == ({"n": str(row.value_num)} if row.value_num % 10 == 0 else None)
        by_key[row.key].append(row)
    for key, values in sent.items():  # parents before children, offsets in order
        in_order = sorted(by_key[key], key=lambda r: (r.segment_id, r.offset))
        assert [r.value_num for r in in_order] == values

    # From a subscription's cursors: segment 0 (tiered or not) acknowledged up to 999.
    name = TopicName.parse(topic)
    first = layout.all_segments[0]
    segment = name.segment(0, first.hash_range.start, first.hash_range.end)
    handle = asyncio.run(find_segment_actor(segment))  # wakes it if it hibernates
    ray.get(handle.ack_cumulative.remote("audit", 999))
    if storage != "local":
        wait_hibernating(admin, topic, 4)
    after = read_topic(spark, topic, subscription="audit")
    assert after.count() == 15_000
    assert after.where("segment_id = 0 and offset < 1000").count() == 0
    assert read_topic_dataset(topic, rows_per_partition=3_000).count() == 16_000
    if storage != "local":
        plan = after.read_plan
        assert {r.segment_id for r in plan.ranges if r.tier is not None} == {0, 1, 3, 4}
        alive = served_segments(name)
        woken = [i for i, s in layout.all_segments.items() if s.name(name).actor_name in alive]
        assert sorted(woken) == sorted(layout.active_segments)  # reading woke none
    admin.delete_scalable_topic(topic)


def wait_hibernating(admin, topic: str, sealed: int) -> None:
    deadline = time.monotonic() + 60
    while True:
        segments = admin.get_stats(topic)["segments"].values()
        if sum(s["hibernating"] for s in segments) == sealed:
            return
        assert time.monotonic() < deadline, segments
        time.sleep(0.5)


def test_ray_dataset_and_bounds(admin, unique) -> None:
    topic = f"topic://spark/ns/read-bounds-{unique}"
    admin.create_scalable_topic(topic, num_segments=2)
    admin.create_subscription(topic, "audit")
    with Producer(topic) as producer:
        send(producer, 0, 3_000)
    name = TopicName.parse(topic)
    layout = admin.get_layout(topic)
    handles = {
        sid: segment_actor(name.segment(sid, s.hash_range.start, s.hash_range.end))
        for sid, s in layout.all_segments.items()
    }
    ends = {sid: ray.get(h.ready.remote())["endOffset"] for sid, h in handles.items()}

    dataset = read_topic_dataset(topic, rows_per_partition=500)
    assert dataset.missing_segments == ()
    assert dataset.count() == 3_000
    assert dataset.schema().base_schema == OUTPUT_SCHEMA
    assert len(dataset.read_plan.ranges) == sum((e + 499) // 500 for e in ends.values())

    ray.get(handles[0].ack_cumulative.remote("audit", 99))  # cursor of segment 0 at 100
    from_cursor = plan_read(topic, subscription="audit")
    assert from_cursor.rows == 3_000 - 100

    middle = Checkpoint(topic, positions={0: 10, 1: 20})
    assert plan_read(topic, end=middle).rows == 30
    assert plan_read(topic, start=middle).rows == 3_000 - 30
    assert plan_read(topic, start=Checkpoint(topic, finished=(0,))).rows == ends[1]
    with pytest.raises(InvalidArgumentError, match="not both"):  # refused by the cluster
        plan_read(topic, subscription="audit", start=middle)
    tail = read_topic_dataset(topic, start=middle, end=Checkpoint(topic, positions={0: 15}))
    rows = sorted(tail.take_all(), key=lambda r: r["offset"])
    assert [(r["segment_id"], r["offset"]) for r in rows] == [(0, n) for n in range(10, 15)]
    admin.delete_scalable_topic(topic)


def test_segment_outside_the_layout_is_neither_required_nor_read(admin, unique) -> None:
    """A child that an in-flight split has created but not yet published in the layout."""
    topic = f"topic://spark/ns/read-inflight-{unique}"
    admin.create_scalable_topic(topic, num_segments=1)
    with Producer(topic) as producer:
        send(producer, 0, 100)
    name, layout = TopicName.parse(topic), admin.get_layout(topic)
    child = name.segment(layout.next_segment_id, 0, 0x7FFF)
    admin.create_segment(str(child))
    ray.get(segment_actor(child).append.remote(make_batch([b"early"], ["key-1"])))

    plan = plan_read(topic)
    assert [(r.segment_id, r.start, r.end) for r in plan.ranges] == [(0, 0, 100)]
    assert plan.missing_segments == ()
    admin.delete_scalable_topic(topic)


def test_unavailable_segments_fail_the_read_or_are_reported(admin, spark, unique) -> None:
    topic = f"topic://spark/ns/read-lost-{unique}"
    admin.create_scalable_topic(topic, num_segments=3)
    with Producer(topic) as producer:
        send(producer, 0, 3_000)
    name, layout = TopicName.parse(topic), admin.get_layout(topic)
    counts = Counter(
        layout.find_active_segment(key_hash(f"key-{v % 97}")).segment_id for v in range(3_000)
    )
    lost = [0, 2]
    incarnation = admin.get_stats(topic)["incarnation"]
    lose_storage([layout.get(sid).name(name) for sid in lost], incarnation)

    started = time.monotonic()
    with pytest.raises(UnavailableSegmentsError) as failure:
        read_topic(spark, topic, unavailable_timeout_s=3)
    assert failure.value.segment_ids == lost
    assert time.monotonic() - started < 15
    assert "allow_partial" in failure.value.message

    with pytest.warns(PartialReadWarning, match=r"segments \[0, 2\] are missing"):
        partial = read_topic(spark, topic, allow_partial=True, unavailable_timeout_s=3)
    assert partial.missing_segments == (0, 2)
    served = partial.groupBy("segment_id").count().collect()
    assert {(r.segment_id, r["count"]) for r in served} == {(1, counts[1])}


def test_write_then_read_gives_the_same_rows(admin, spark, unique) -> None:
    topic = f"topic://spark/ns/write-bulk-{unique}"
    admin.create_scalable_topic(topic, num_segments=4)
    source = spark.range(0, 200_000, numPartitions=4).selectExpr(
        "concat('user-', cast(id % 997 as string)) as key",
        "cast(concat('event-', cast(id as string)) as binary) as value",
    )
    result = write_topic(source, topic)
    assert (result.rows, result.partitions) == (200_000, 4)
    assert result.retried_partitions == () and result.at_least_once_partitions == ()

    back = read_topic(spark, topic)
    assert back.missing_segments == ()
    expected = fingerprint(source)
    assert expected[0] == 200_000
    assert fingerprint(back) == expected
    admin.delete_scalable_topic(topic)


def fingerprint(df) -> tuple[int, int, int]:
    """Row count and two independent order-free checksums of the (key, value) multiset."""
    row = df.selectExpr(
        "count(*) as n",
        "sum(xxhash64(key, value)) as h1",
        "sum(cast(hash(key, value) as bigint)) as h2",
    ).first()
    return row.n, row.h1, row.h2


def test_a_retried_write_task_does_not_duplicate(admin, spark, unique) -> None:
    """The first attempt of partition 1 fails after storing 4 of its 6 chunks; Spark retries
    it, and the retry finds those chunks recorded as stored and stores only the others."""
    topic = f"topic://spark/ns/write-retry-{unique}"
    admin.create_scalable_topic(topic, num_segments=2)
    from pyspark.sql.functions import udf

    @udf("binary")
    def fail_first_attempt(value: bytes, row: int) -> bytes:
        from pyspark import TaskContext

        if row == 55_000 and TaskContext.get().attemptNumber() == 0:
            raise RuntimeError("injected failure")
        return value

    source = spark.range(0, 60_000, numPartitions=2).selectExpr(
        "concat('k', cast(id % 50 as string)) as key",
        "cast(cast(id as string) as binary) as raw",
        "id",
    )
    failing = source.select("key", fail_first_attempt("raw", "id").alias("value"))
    result = write_topic(failing, topic, chunk_rows=5_000)
    assert result.rows == 60_000
    assert result.retried_partitions == (1,)
    assert result.at_least_once_partitions == ()

    back = read_topic(spark, topic).selectExpr("cast(cast(value as string) as bigint) as n")
    stats = back.selectExpr("count(*) as rows", "sum(n) as s1", "sum(n * n) as s2").first()
    values = range(60_000)  # each of 0..59999 exactly once, no duplicate and no loss
    assert (stats.rows, stats.s1, stats.s2) == (60_000, sum(values), sum(v * v for v in values))
    admin.delete_scalable_topic(topic)


def test_a_write_task_retried_after_a_split_still_stores_each_row_once(
    admin, spark, unique, tmp_path
) -> None:
    """The first attempt of partition 1 fails after storing some of its 6 chunks and, before
    Spark retries it, both segments split: the retry stores only the chunks still missing,
    in the children that own their rows now. Each row once, none lost."""
    import threading

    topic = f"topic://spark/ns/write-resplit-{unique}"
    admin.create_scalable_topic(topic, num_segments=2)
    from pyspark.sql.functions import udf

    failing, split = tmp_path / "failing", tmp_path / "split"

    @udf("binary")
    def fail_first_attempt(value: bytes, row: int) -> bytes:
        import time

        from pyspark import TaskContext

        if row == 55_000 and TaskContext.get().attemptNumber() == 0:
            failing.touch()
            deadline = time.monotonic() + 60
            while not split.exists() and time.monotonic() < deadline:
                time.sleep(0.05)
            raise RuntimeError("injected failure")
        return value

    def split_when_failing() -> None:
        while not failing.exists():
            time.sleep(0.05)
        admin.split_segment(topic, 0)
        admin.split_segment(topic, 1)
        split.touch()

    splitter = threading.Thread(target=split_when_failing, daemon=True)
    splitter.start()
    source = spark.range(0, 60_000, numPartitions=2).selectExpr(
        "concat('k', cast(id % 50 as string)) as key",
        "cast(cast(id as string) as binary) as raw",
        "id",
    )
    failing_rows = source.select("key", fail_first_attempt("raw", "id").alias("value"))
    result = write_topic(failing_rows, topic, chunk_rows=5_000)
    splitter.join(timeout=60)
    assert split.exists() and admin.get_layout(topic).epoch == 2
    assert (result.rows, result.retried_partitions, result.at_least_once_partitions) == (
        60_000,
        (1,),
        (),
    )
    back = read_topic(spark, topic)
    children = back.where("segment_id >= 2").count()
    assert children >= 1, "the retried chunk goes to the segments that own its rows now"
    numbers = back.selectExpr("cast(cast(value as string) as bigint) as n")
    stats = numbers.selectExpr("count(*) as rows", "sum(n) as s1", "sum(n * n) as s2").first()
    values = range(60_000)
    assert (stats.rows, stats.s1, stats.s2) == (60_000, sum(values), sum(v * v for v in values))
    admin.delete_scalable_topic(topic)


def test_write_properties_and_unkeyed_rows(admin, spark, unique) -> None:
    topic = f"topic://spark/ns/write-props-{unique}"
    admin.create_scalable_topic(topic, num_segments=2)
    source = spark.createDataFrame(
        [(f"v{i}", {"i": str(i)} if i % 2 else None) for i in range(100)],
        "payload string, props map<string,string>",
    )
    write_topic(source, topic, key_col=None, value_col="payload", properties_col="props")
    rows = read_topic(spark, topic).collect()
    assert len(rows) == 100 and all(r.key is None and r.hash is None for r in rows)
    got = {bytes(r.value).decode(): r.properties for r in rows}
    assert got == {f"v{i}": ({"i": str(i)} if i % 2 else None) for i in range(100)}
    admin.delete_scalable_topic(topic)


def test_reads_and_writes_present_the_callers_token(admin, spark, unique, monkeypatch) -> None:
    """With a policy in the cluster, ``read_topic`` / ``write_topic`` are refused before any
    Spark task runs unless the token may consume / produce (no token, a wrong, a revoked
    or another namespace's token: refused), and the Spark tasks present the caller's
    token to the segments (whose checks would refuse them otherwise)."""
    from actors.guard import REFRESH_S
    from runtime.auth import AuthPolicy
    from storage.catalog import Catalog

    monkeypatch.delenv("RAYTOPICS_TOKEN", raising=False)
    source, target = f"topic://spark/auth/src-{unique}", f"topic://spark/auth/dst-{unique}"
    admin.create_scalable_topic(source, num_segments=2)
    admin.create_scalable_topic(target, num_segments=1)
    with Producer(source) as producer:
        send(producer, 0, 1_000)
    names = ("reader", "writer", "other", "revoked")
    tokens = {name: f"spark-{name}-token-0123456789" for name in names}
    grants = {"reader": ("spark/auth", "consume"), "writer": ("spark/auth", "produce")}
    grants |= {"other": ("spark/elsewhere", "consume"), "revoked": ("spark/auth", "consume")}

    def store(given: dict[str, tuple[str, str]]) -> None:
        doc = [
            {
                "principal": name,
                "token": tokens[name],
                "grants": [{"namespace": ns, "actions": [action]}],
            }
            for name, (ns, action) in given.items()
        ]
        Catalog().replace_auth(AuthPolicy.from_config({"tokens": doc}))

    store(grants)
    store({name: grant for name, grant in grants.items() if name != "revoked"})
    time.sleep(1.5 * REFRESH_S)  # every process applies a stored policy within REFRESH_S
    try:
        with pytest.raises(UnauthenticatedError):
            read_topic(spark, source)
        with pytest.raises(UnauthenticatedError):
            read_topic(spark, source, token="not-a-token-of-this-cluster")
        with pytest.raises(UnauthenticatedError):
            read_topic(spark, source, token=tokens["revoked"])
        with pytest.raises(UnauthorizedError):
            read_topic(spark, source, token=tokens["other"])
        with pytest.raises(UnauthorizedError):
            read_topic(spark, source, token=tokens["writer"])
        df = read_topic(spark, source, token=tokens["reader"])
        assert df.count() == 1_000
        with pytest.raises(UnauthorizedError):
            write_topic(df, target, token=tokens["reader"])
        assert write_topic(df, target, token=tokens["writer"]).rows == 1_000
    finally:
        Catalog().disable_auth()
        time.sleep(1.5 * REFRESH_S)
    assert admin.get_stats(target)["records"] == 1_000, "the refused write stored nothing"
    admin.delete_scalable_topic(source)
    admin.delete_scalable_topic(target)
