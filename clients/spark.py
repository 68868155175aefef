"""The Spark bridge: bounded snapshot reads of a whole topic, and bulk writes (Ray Data's
side, sharing the planning, is ``clients.ray_data``).

Reads
    ``read_topic`` / ``read_topic_dataset`` plan a *snapshot*: one read of the
    layout says which segments exist, and each of them is asked for its end
    offset once, so the result is fixed when the call returns however long
    Spark takes to run it (re-evaluating the DataFrame re-reads the same
    immutable offset ranges). A segment created by a split after that layout
    read is not part of the snapshot, and its sealed parent is read to its
    final end, so every record is read exactly once and every key's records
    form a prefix of its history. Each offset range is read straight from its
    segment actor as Arrow batches, by Ray Data read tasks or by Spark tasks
    on the executors (Ray actors themselves), never through the driver.

Completeness (DESIGN.md, seed 002 "no silent partial results")
    Every segment the layout lists must be served. A listed segment whose
    actor cannot be reached within ``unavailable_timeout_s`` (dead and not
    restarting, or restarting too slowly) makes the read raise
    ``UnavailableSegmentsError`` naming every such segment; one that was pruned
    from the layout meanwhile is no longer required. Reading never creates a
    segment actor: a recreated actor over lost storage would serve an empty
    log as if it were the data. A segment that answers with fewer records
    than its snapshot end also raises, while the read runs.
    ``allow_partial=True`` returns what can be served, warns
    (``PartialReadWarning``) and records the missing ids on the result as
    ``result.missing_segments`` (an empty tuple on a complete read);
    ``result.read_plan`` is the whole plan.

Writes
    ``write_topic`` runs a ``Producer`` in each Spark partition over Arrow
    batches (``mapInArrow``), so rows never pass through the driver. A retried
    or speculative task must not duplicate rows: every attempt of partition
    *p* uses the producer id ``spark-write-{write id}-{p}`` and re-chunks its
    rows at the same boundaries, so its batches get the same per-segment
    sequence numbers and the segments drop the ones already stored (a task
    knows it is a retry from a claim it makes in the metadata store). That holds
    while the layout is the one the write started with; a retry that finds the
    layout changed cannot reproduce the original routing, so it writes under a
    fresh producer id (at-least-once: no loss, possibly duplicates) and
    ``write_topic`` warns and reports those partitions.

Credentials
    Every read and write takes the caller's ``token`` (default ``RAYTOPICS_TOKEN``)
    and the cluster checks it: the plan's layout read needs ``consume`` (a read)
    or ``produce`` (a write) on the topic's namespace, so a refusal is raised by
    ``read_topic`` / ``write_topic`` themselves, before any task runs. Spark and
    Ray Data tasks present the same credential to the segments, so it travels in
    their task closures (never in ``ReadPlan``, which callers get back).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
import uuid
import warnings
from collections import deque
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

import numpy as np
import pyarrow as pa
import ray
from ray.exceptions import (
    ActorDiedError,
    ActorUnavailableError,
    GetTimeoutError,
    RayActorError,
    RayTaskError,
)

from actors.dag_watch import fetch_layout
from actors.segment import MAX_READ_RECORDS, find_segment_actor, segment_actor
from clients._ray import background_loop
from clients.checkpoint_consumer import Checkpoint
from clients.producer import Producer
from runtime.auth import Permission, client_credential
from runtime.batch import PROPERTIES_TYPE
from runtime.config import env_float
from runtime.connect import connect
from runtime.errors import (
    InvalidArgumentError,
    ScalableTopicsError,
    SegmentNotFoundError,
    UnavailableSegmentsError,
)
from runtime.hashing import key_hashes
from runtime.layout import SegmentInfo, SegmentLayout
from runtime.names import SegmentName, TopicName
from runtime.remote import call
from storage.catalog import Catalog

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

__all__ = [
    "OUTPUT_SCHEMA",
    "SPARK_SCHEMA",
    "PartialReadWarning",
    "ReadPlan",
    "SegmentRange",
    "WriteResult",
    "plan_read",
    "read_topic",
    "warm_up",
    "write_topic",
]

# How long a listed segment may stay unreachable (restarting) before a read gives up on it.
DEFAULT_UNAVAILABLE_TIMEOUT_S = env_float("RAYTOPICS_UNAVAILABLE_TIMEOUT_S", 20.0)
# Rows per read task / Spark partition: big enough to amortize a task, small enough
# that a large segment is read by several executors at once.
DEFAULT_ROWS_PER_PARTITION = 1_000_000
# Rows per producer batch written by one Spark task (fixed, so retries re-chunk alike).
DEFAULT_WRITE_CHUNK_ROWS = 50_000
_WRITE_CHUNKS_IN_FLIGHT = 8
_RETRY_PAUSE_S = 0.2
ROW_BYTES_ESTIMATE = 160  # ~100 B value plus key, offset, time, hash
_RESTART_ERRORS = (ActorDiedError, ActorUnavailableError, RayActorError, GetTimeoutError)

OUTPUT_SCHEMA = pa.schema(
    [
        ("key", pa.string()),
        ("value", pa.binary()),
        ("hash", pa.int32()),
        ("segment_id", pa.int64()),
        ("offset", pa.int64()),
        ("publish_time", pa.timestamp("us", tz="UTC")),
        ("properties", PROPERTIES_TYPE),
    ]
)
SPARK_SCHEMA = (
    "key string, value binary, hash int, segment_id long, offset long, "
    "publish_time timestamp, properties map<string,string>"
)
_WRITE_SUMMARY_SCHEMA = "partition int, retry boolean, rows long, exactly_once boolean"
_WRITE_SUMMARY_ARROW = pa.schema(
    [
        ("partition", pa.int32()),
        ("retry", pa.bool_()),
        ("rows", pa.int64()),
        ("exactly_once", pa.bool_()),
    ]
)

Bound = Literal["earliest", "latest"] | Checkpoint


class PartialReadWarning(UserWarning):
    """A read asked for ``allow_partial=True`` and some listed segments were not served."""


# --- the plan -----------------------------------------------------------------------------


@dataclass(frozen=True)
class SegmentRange:
    """Offsets ``[start, end)`` of one segment: the unit of one read task / Spark partition."""

    segment: str
    segment_id: int
    start: int
    end: int

    @property
    def rows(self) -> int:
        return self.end - self.start


@dataclass(frozen=True)
class ReadPlan:
    """What a snapshot read covers, fixed before any record is read."""

    topic: str
    epoch: int
    ranges: tuple[SegmentRange, ...]
    missing_segments: tuple[int, ...] = ()
    unavailable_timeout_s: float = DEFAULT_UNAVAILABLE_TIMEOUT_S

    @property
    def rows(self) -> int:
        return sum(r.rows for r in self.ranges)


@dataclass(frozen=True)
class _Wanted:
    """A segment the snapshot must read, with the bounds known before probing it."""

    info: SegmentInfo
    start: int
    end: int | None  # None: up to the end offset the probe reports


def plan_read(
    topic: str,
    *,
    start: Bound = "earliest",
    end: Bound = "latest",
    subscription: str | None = None,
    allow_partial: bool = False,
    unavailable_timeout_s: float | None = None,
    rows_per_partition: int = DEFAULT_ROWS_PER_PARTITION,
    token: str | None = None,
) -> ReadPlan:
    """Fix the snapshot: one layout read, then every needed segment probed concurrently.

    Raises ``UnavailableSegmentsError`` naming every listed segment that did not
    answer, unless ``allow_partial``; then they are in ``missing_segments``. The
    ``token`` (default ``RAYTOPICS_TOKEN``) needs ``consume``.
    """
    credential = client_credential(token)
    name = TopicName.parse(topic)
    _check_bounds(name, start, end, subscription, rows_per_partition)
    timeout_s = float(
        DEFAULT_UNAVAILABLE_TIMEOUT_S if unavailable_timeout_s is None else unavailable_timeout_s
    )
    connect()
    layout = _layout(name, credential, Permission.CONSUME)
    wanted = _wanted_segments(layout.all_segments.values(), start, end)
    probes = background_loop().run(_probe_all(name, wanted, subscription, timeout_s, credential))
    silent = [w.info.segment_id for w, p in zip(wanted, probes, strict=True) if p is None]
    missing = _still_listed(name, silent, credential)
    if missing and not allow_partial:
        raise UnavailableSegmentsError(
            f"{name}: segments {missing} are listed in the layout (epoch {layout.epoch}) but "
            f"no segment actor served them within {timeout_s:g}s; pass allow_partial=True "
            "to read the others",
            missing,
        )
    ranges = [
        piece
        for w, probe in zip(wanted, probes, strict=True)
        if probe is not None
        for piece in _split(_range_of(name, w, probe, subscription), rows_per_partition)
    ]
    return ReadPlan(str(name), layout.epoch, tuple(ranges), tuple(missing), timeout_s)


def _check_bounds(
    name: TopicName, start: Any, end: Any, subscription: str | None, rows_per_partition: int
) -> None:
    for label, bound, word in (("start", start, "earliest"), ("end", end, "latest")):
        if isinstance(bound, Checkpoint):
            if bound.topic != str(name):
                raise InvalidArgumentError(f"{label} checkpoint is for {bound.topic}, not {name}")
        elif bound != word:
            raise InvalidArgumentError(f"{label} must be {word!r} or a Checkpoint, got {bound!r}")
    if subscription is not None and start != "earliest":
        raise InvalidArgumentError("pass either subscription= or start=, not both")
    if rows_per_partition < 1:
        raise InvalidArgumentError(f"rows_per_partition must be positive: {rows_per_partition}")


def _wanted_segments(segments: Iterable[SegmentInfo], start: Bound, end: Bound) -> list[_Wanted]:
    """Segments with something to read between the bounds, parents before children.

    A start checkpoint's finished segments are done; an end checkpoint reads its
    in-progress segments up to its positions, its finished ones to their end,
    and nothing of segments it had not reached.
    """
    wanted = []
    for info in sorted(segments, key=lambda s: s.segment_id):  # ids grow down the DAG
        sid = info.segment_id
        if isinstance(start, Checkpoint) and sid in start.finished:
            continue
        first = start.positions.get(sid, 0) if isinstance(start, Checkpoint) else 0
        last: int | None = None
        if isinstance(end, Checkpoint):
            if sid in end.positions:
                last = end.positions[sid]
            elif sid not in end.finished:
                continue
        if last is None or last > first:
            wanted.append(_Wanted(info, first, last))
    return wanted


def _layout(name: TopicName, credential: str | None, purpose: Permission) -> SegmentLayout:
    """The topic's layout from the DAG watch (checked there for ``purpose``)."""
    return background_loop().run(fetch_layout(name, credential, purpose))


async def _probe_all(
    name: TopicName,
    wanted: list[_Wanted],
    subscription: str | None,
    timeout_s: float,
    credential: str | None,
) -> list[dict[str, Any] | None]:
    deadline = time.monotonic() + timeout_s
    probes = (
        _probe(_segment_name(name, w.info), subscription, deadline, credential) for w in wanted
    )
    return list(await asyncio.gather(*probes))


async def _probe(
    segment: SegmentName, subscription: str | None, deadline: float, credential: str | None
) -> dict[str, Any] | None:
    """The end offset (and the subscription's cursor) of a running actor; None when it did
    not answer by ``deadline``. Looks the actor up again after each failure, never creates
    it (a hibernating tiered segment's is started by its controller)."""
    while True:
        remaining = deadline - time.monotonic()
        try:
            handle = await find_segment_actor(segment, max(remaining, 0.001), credential=credential)
            status = handle.position.remote(subscription, credential=credential)
            return await asyncio.wait_for(call(status), max(remaining, 0.001))
        except (SegmentNotFoundError, TimeoutError, *_RESTART_ERRORS):
            if time.monotonic() + _RETRY_PAUSE_S >= deadline:
                return None
            await asyncio.sleep(_RETRY_PAUSE_S)


def _still_listed(name: TopicName, missing: list[int], credential: str | None) -> list[int]:
    """Of the segments that did not answer, those the layout still lists: a segment pruned
    by retention while we probed it is no longer part of the topic, hence not required."""
    if not missing:
        return []
    current = _layout(name, credential, Permission.CONSUME).all_segments
    return sorted(sid for sid in missing if sid in current)


def _range_of(
    name: TopicName, wanted: _Wanted, probe: dict[str, Any], subscription: str | None
) -> SegmentRange:
    first = probe["position"] if subscription is not None else wanted.start
    last = probe["endOffset"] if wanted.end is None else wanted.end
    return SegmentRange(str(_segment_name(name, wanted.info)), wanted.info.segment_id, first, last)


def _split(whole: SegmentRange, rows: int) -> list[SegmentRange]:
    return [
        SegmentRange(whole.segment, whole.segment_id, lo, min(lo + rows, whole.end))
        for lo in range(whole.start, whole.end, rows)
    ]


def _segment_name(name: TopicName, info: SegmentInfo) -> SegmentName:
    return name.segment(info.segment_id, info.hash_range.start, info.hash_range.end)


# --- reading one range ---------------------------------------------------------------------


def read_range(
    piece: SegmentRange, timeout_s: float, credential: str | None = None
) -> Iterator[pa.RecordBatch]:
    """The records of ``piece`` as ``OUTPUT_SCHEMA`` batches, one actor read in flight ahead
    (each read presents ``credential``).

    Rides out a restart of the segment actor for up to ``timeout_s`` per outage;
    raises ``UnavailableSegmentsError`` when it does not come back, or when the
    segment has no records where the snapshot saw some (its storage was lost).
    Records below the segment's start offset were dropped by retention on purpose
    and are skipped, as every reader skips them.
    """
    segment = SegmentName.parse(piece.segment)
    reader = _RangeReader(segment, piece, timeout_s, credential)
    offset = piece.start
    pending = reader.request(offset)
    while offset < piece.end:
        batch = reader.receive(pending, offset)
        if batch.num_rows == 0:
            return  # retention dropped the rest of this range
        offset = batch.column("offset")[batch.num_rows - 1].as_py() + 1
        if offset < piece.end:
            pending = reader.request(offset)  # let the actor read on while we convert
        yield _with_derived_columns(batch, piece.segment_id)


class _RangeReader:
    """Actor calls for one range, with bounded waits through actor restarts."""

    def __init__(
        self, segment: SegmentName, piece: SegmentRange, timeout_s: float, credential: str | None
    ) -> None:
        self.segment = segment
        self.piece = piece
        self.timeout_s = timeout_s
        self.credential = credential
        self.handle: Any = None

    def request(self, offset: int) -> ray.ObjectRef | None:
        try:
            self.handle = self.handle or segment_actor(self.segment)
        except ValueError:
            return None  # receive() waits for the actor to come back
        count = min(MAX_READ_RECORDS, self.piece.end - offset)
        return self.handle.read.remote(offset, count, credential=self.credential)

    def receive(self, pending: ray.ObjectRef | None, offset: int) -> pa.RecordBatch:
        """Records from ``offset`` (or from the start offset, if retention passed it) up to
        the range's end; empty only when retention dropped everything up to the end."""
        deadline = time.monotonic() + self.timeout_s
        while True:
            try:
                if pending is None:
                    raise ValueError("no actor")
                batch = ray.get(pending, timeout=max(deadline - time.monotonic(), 0.001))
            except RayTaskError as err:  # the segment's own error (a refusal, say): as itself
                if isinstance(err.cause, ScalableTopicsError):
                    raise err.cause from None
                raise
            except (ValueError, *_RESTART_ERRORS) as err:
                self.handle = None
                if time.monotonic() + _RETRY_PAUSE_S >= deadline:
                    why = f"did not answer within {self.timeout_s:g}s: {err}"
                    raise self._unavailable(why) from None
                time.sleep(_RETRY_PAUSE_S)
                pending = self.request(offset)
                continue
            if batch.num_rows == 0:
                raise self._unavailable(
                    f"returned no records at offset {offset}, but the snapshot saw records "
                    f"up to {self.piece.end}: its storage was lost or replaced"
                )
            return _trim(batch, self.piece.end)

    def _unavailable(self, why: str) -> UnavailableSegmentsError:
        return UnavailableSegmentsError(
            f"segment {self.piece.segment_id} ({self.segment}) {why}", [self.piece.segment_id]
        )


def _trim(batch: pa.RecordBatch, end: int) -> pa.RecordBatch:
    offsets = batch.column("offset").to_numpy()
    keep = int(np.searchsorted(offsets, end))
    return batch if keep == batch.num_rows else batch.slice(0, keep)


def _with_derived_columns(batch: pa.RecordBatch, segment_id: int) -> pa.RecordBatch:
    """Add the routing hash and the segment id; timestamps in microseconds, as Spark's."""
    keys = batch.column("key")
    hashes = key_hashes(keys)
    hash_column = pa.array(hashes, type=pa.int32(), mask=hashes < 0)
    segment_column = pa.array(np.full(batch.num_rows, segment_id, dtype=np.int64))
    publish_time = batch.column("publish_time").cast(OUTPUT_SCHEMA.field("publish_time").type)
    return pa.RecordBatch.from_arrays(
        [
            keys,
            batch.column("value"),
            hash_column,
            segment_column,
            batch.column("offset"),
            publish_time,
            batch.column("properties"),
        ],
        schema=OUTPUT_SCHEMA,
    )


# --- Spark --------------------------------------------------------------------------------


def read_topic(
    spark: SparkSession,
    topic: str,
    *,
    start: Bound = "earliest",
    end: Bound = "latest",
    subscription: str | None = None,
    allow_partial: bool = False,
    unavailable_timeout_s: float | None = None,
    rows_per_partition: int = DEFAULT_ROWS_PER_PARTITION,
    token: str | None = None,
) -> DataFrame:
    """The topic's snapshot as a Spark DataFrame with ``SPARK_SCHEMA``'s columns.

    ``start``/``end``: ``"earliest"``/``"latest"`` or a ``Checkpoint``;
    ``subscription``: start each segment at that subscription's cursor instead.
    The snapshot is planned now (see ``plan_read``); each Spark partition reads
    one offset range straight from its segment actor into Arrow batches
    (``read_range``), run by the executors, which are Ray actors.

    Raises ``UnavailableSegmentsError`` naming every listed segment that cannot
    be served; with ``allow_partial=True`` warns instead and the DataFrame's
    ``missing_segments`` names them (``()`` when complete).

    ``token`` (default ``RAYTOPICS_TOKEN``) needs ``consume`` on the topic's namespace
    when the cluster has an auth policy: a refusal is raised here, and the Spark
    tasks present the same token to the segments.
    """
    credential = client_credential(token)
    plan = plan_read(
        topic,
        start=start,
        end=end,
        subscription=subscription,
        allow_partial=allow_partial,
        unavailable_timeout_s=unavailable_timeout_s,
        rows_per_partition=rows_per_partition,
        token=credential,
    )
    return annotate(_plan_to_spark(spark, plan, credential), plan)


def _plan_to_spark(spark: SparkSession, plan: ReadPlan, credential: str | None) -> DataFrame:
    """One Spark partition per range; each runs ``read_range`` in a Python worker.

    Not ``read_topic_dataset(...).to_spark(spark)``: RayDP converts Ray blocks
    through pandas, which fails on the ``properties`` map column and costs a
    copy per row, and Spark would depend on object-store blocks that must
    outlive every re-evaluation of the DataFrame. Here Spark tasks read the
    segments themselves: any evaluation, or the recomputation of a lost
    partition, re-reads the same immutable offsets, and records cross one
    process boundary less. The ranges (and the credential) travel in the task closure;
    ``spark.range`` just numbers the partitions.
    """
    if not plan.ranges:
        return spark.createDataFrame([], SPARK_SCHEMA)
    count = len(plan.ranges)
    reader = functools.partial(
        _spark_read_partition, _cluster(), plan.unavailable_timeout_s, plan.ranges, credential
    )
    return spark.range(0, count, 1, count).mapInArrow(reader, SPARK_SCHEMA)


def _spark_read_partition(
    cluster: dict[str, str],
    timeout_s: float,
    ranges: tuple[SegmentRange, ...],
    credential: str | None,
    seeds: Iterator[pa.RecordBatch],
) -> Iterator[pa.RecordBatch]:
    _join_ray(cluster)
    for seed in seeds:
        for index in seed.column("id").to_pylist():
            yield from read_range(ranges[index], timeout_s, credential)


def warm_up(spark: SparkSession) -> int:
    """Start a Python worker on every executor core and join it to Ray, now.

    Optional: the first ``read_topic``/``write_topic`` pays this otherwise (a
    worker imports this module and connects to Ray once, then Spark reuses it).
    Worth calling right after ``spark_session()`` in a background thread while
    the driver does other work. Returns the number of tasks run.
    """
    slots = max(1, spark.sparkContext.defaultParallelism)
    task = functools.partial(_warm_partition, _cluster())
    return len(spark.range(0, slots, 1, slots).mapInArrow(task, "ready boolean").collect())


def _warm_partition(
    cluster: dict[str, str], seeds: Iterator[pa.RecordBatch]
) -> Iterator[pa.RecordBatch]:
    _join_ray(cluster)
    for seed in seeds:
        yield pa.RecordBatch.from_pydict({"ready": [True] * seed.num_rows})


def annotate(result: Any, plan: ReadPlan) -> Any:
    """Record what was read on the result itself, and say so loudly when it is partial."""
    result.missing_segments = plan.missing_segments
    result.read_plan = plan
    if plan.missing_segments:
        warnings.warn(
            f"{plan.topic}: partial read, segments {list(plan.missing_segments)} are missing "
            "(allow_partial=True); see .missing_segments",
            PartialReadWarning,
            stacklevel=3,
        )
    return result


# --- writing ------------------------------------------------------------------------------


@dataclass(frozen=True)
class WriteResult:
    """What ``write_topic`` stored. ``retried_partitions`` needed more than one Spark
    attempt; ``at_least_once_partitions`` are those of them retried after a layout
    change, hence written at-least-once rather than exactly once."""

    write_id: str
    rows: int
    partitions: int
    retried_partitions: tuple[int, ...] = ()
    at_least_once_partitions: tuple[int, ...] = ()


@dataclass(frozen=True)
class _WriteJob:
    cluster: dict[str, str]
    topic: str
    write_id: str
    epoch: int
    chunk_rows: int
    producer_config: dict[str, Any] = field(default_factory=dict)
    credential: str | None = field(default=None, repr=False)


def write_topic(
    df: DataFrame,
    topic: str,
    key_col: str | None = "key",
    value_col: str = "value",
    properties_col: str | None = None,
    *,
    chunk_rows: int = DEFAULT_WRITE_CHUNK_ROWS,
    producer_config: dict[str, Any] | None = None,
    token: str | None = None,
) -> WriteResult:
    """Publish every row of ``df`` to ``topic``: one producer per Spark partition, in parallel.

    ``key_col`` (cast to string; ``None`` for unkeyed rows), ``value_col`` (cast
    to binary: strings become their UTF-8 bytes) and ``properties_col`` (a
    ``map<string,string>``) name the columns. Per-key order follows the row
    order within a partition. Returns once every row is stored. Retried Spark
    tasks do not duplicate (see the module docstring), provided a partition's
    rows come out the same on a retry, as for any idempotent Spark sink: persist
    or checkpoint a DataFrame whose lineage shuffles non-deterministically.

    ``token`` (default ``RAYTOPICS_TOKEN``) needs ``produce`` on the topic's namespace
    when the cluster has an auth policy: a refusal is raised here, before any task runs.
    """
    from pyspark.sql import functions as F

    name = TopicName.parse(topic)
    if chunk_rows < 1:
        raise InvalidArgumentError(f"chunk_rows must be positive, got {chunk_rows}")
    credential = client_credential(token)
    connect()
    job = _WriteJob(
        _cluster(),
        str(name),
        uuid.uuid4().hex,
        _layout(name, credential, Permission.PRODUCE).epoch,
        chunk_rows,
        dict(producer_config or {}),
        credential,
    )
    key = F.col(key_col).cast("string") if key_col else F.lit(None).cast("string")
    properties = F.col(properties_col) if properties_col else F.lit(None).cast("map<string,string>")
    rows = df.select(
        key.alias("key"),
        F.col(value_col).cast("binary").alias("value"),
        properties.alias("properties"),
    )
    writer = functools.partial(_spark_write_partition, job)
    try:
        summary = rows.mapInArrow(writer, _WRITE_SUMMARY_SCHEMA).collect()
    finally:
        Catalog().forget_write(job.write_id)
    return _write_result(job, summary)


def _write_result(job: _WriteJob, summary: list[Any]) -> WriteResult:
    retried = tuple(sorted(row.partition for row in summary if row.retry))
    unsafe = tuple(sorted(row.partition for row in summary if not row.exactly_once))
    if unsafe:
        warnings.warn(
            f"{job.topic}: partitions {list(unsafe)} were retried after the topic's layout "
            "changed, so they were written at-least-once (rows may be duplicated)",
            stacklevel=3,
        )
    rows = sum(row.rows for row in summary)
    return WriteResult(job.write_id, rows, len(summary), retried, unsafe)


def _spark_write_partition(
    job: _WriteJob, batches: Iterator[pa.RecordBatch]
) -> Iterator[pa.RecordBatch]:
    from pyspark import TaskContext

    context = TaskContext.get()
    partition = context.partitionId()
    _join_ray(job.cluster)
    retry = not _first_attempt(job, partition)
    exactly_once = not retry or _job_layout(job).epoch == job.epoch
    producer_id = f"spark-write-{job.write_id}-{partition}"
    if not exactly_once:
        producer_id += f"-retry-{uuid.uuid4().hex[:8]}"
    rows = _produce(job, producer_id, batches)
    summary = {"partition": [partition], "retry": [retry], "rows": [rows]}
    yield pa.RecordBatch.from_pydict(
        {**summary, "exactly_once": [exactly_once]}, schema=_WRITE_SUMMARY_ARROW
    )


def _job_layout(job: _WriteJob) -> SegmentLayout:
    return _layout(TopicName.parse(job.topic), job.credential, Permission.PRODUCE)


def _first_attempt(job: _WriteJob, partition: int) -> bool:
    """Claim the partition in metadata: only its first attempt succeeds. Spark's own attempt
    number misses stage retries, and a speculative copy may run alongside the first."""
    return Catalog().claim_write_partition(job.write_id, partition)


def _produce(job: _WriteJob, producer_id: str, batches: Iterator[pa.RecordBatch]) -> int:
    """Send fixed-size chunks in order and wait for all of them; a failure fails the task.

    Results are collected as they complete (a few chunks behind the sender), so the
    task holds per-row results for a bounded number of chunks, and an error surfaces
    early instead of after the whole partition was sent.
    """
    rows, pending = 0, deque()
    token = job.credential or ""  # the writer's, never the executor's environment's
    with Producer(
        job.topic, token=token, producer_id=producer_id, **job.producer_config
    ) as producer:
        for chunk in _rechunk(batches, job.chunk_rows):
            values, keys = chunk.column("value"), chunk.column("key")
            pending.append(producer.send_batch(values, keys, chunk.column("properties")))
            rows += chunk.num_rows
            while len(pending) > _WRITE_CHUNKS_IN_FLIGHT or (pending and pending[0].done()):
                pending.popleft().result()
        while pending:
            pending.popleft().result()
    return rows


def _rechunk(batches: Iterable[pa.RecordBatch], size: int) -> Iterator[pa.RecordBatch]:
    """Exactly ``size`` rows per chunk (the last one shorter), whatever batches came in:
    chunk boundaries, hence sequence numbers, depend only on the rows."""
    held: list[pa.RecordBatch] = []
    count = 0
    for batch in batches:
        held.append(batch)
        count += batch.num_rows
        while count >= size:
            table = pa.Table.from_batches(held).combine_chunks()
            yield table.slice(0, size).to_batches()[0]
            rest = table.slice(size)
            held, count = rest.to_batches(), rest.num_rows
    if count:
        yield pa.Table.from_batches(held).combine_chunks().to_batches()[0]


# --- joining Ray from a Spark Python worker -------------------------------------------------


def _cluster() -> dict[str, str]:
    """How a Spark Python worker (not a Ray worker) reaches this cluster and namespace."""
    context = ray.get_runtime_context()
    return {"address": context.gcs_address, "namespace": context.namespace}


def _join_ray(cluster: dict[str, str]) -> None:
    """Connect this Spark Python worker to Ray once; Spark reuses the worker for later tasks."""
    if not ray.is_initialized():
        connect(
            cluster["address"],
            namespace=cluster["namespace"],
            log_to_driver=False,
            logging_level=logging.WARNING,
        )
