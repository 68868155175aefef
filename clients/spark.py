"""The Spark bridge: bounded snapshot reads of a whole topic, and bulk writes (Ray Data's
side, sharing the planning, is ``clients.ray_data``).

Reads
    ``read_topic`` plans a snapshot (``clients.read_plan``) and reads it on the
    executors: each range straight from its segment actor, a tiered segment's
    straight from the tier's Parquet files (a Spark file scan), never through the
    driver.

Writes
    ``write_topic`` runs a ``Producer`` in each Spark partition over Arrow
    batches (``mapInArrow``), so rows never pass through the driver. A retried
    or speculative task must not duplicate rows: every attempt of partition
    *p* uses the producer id ``spark-write-{write id}-{p}`` and re-chunks its
    rows at the same boundaries, so its batches get the same per-segment
    sequence numbers and the segments drop the ones already stored (a task
    knows it is a retry from a claim it makes with the cluster). That holds
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

import functools
import logging
import uuid
import warnings
from collections import deque
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import ray

from actors.admin.caller import AdminServiceCaller
from clients.producer import Producer
from clients.range_reads import OUTPUT_SCHEMA, SegmentRange, TierFile, read_range
from clients.read_plan import (
    DEFAULT_ROWS_PER_PARTITION,
    DEFAULT_UNAVAILABLE_TIMEOUT_S,
    ROW_BYTES_ESTIMATE,
    Bound,
    PartialReadWarning,
    ReadPlan,
    annotate,
    checked_layout,
    plan_read,
)
from runtime.auth import Permission, client_credential
from runtime.connect import connect
from runtime.errors import (
    InvalidArgumentError,
)
from runtime.layout import SegmentLayout
from runtime.names import TopicName

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

__all__ = [
    "DEFAULT_ROWS_PER_PARTITION",
    "DEFAULT_UNAVAILABLE_TIMEOUT_S",
    "OUTPUT_SCHEMA",
    "ROW_BYTES_ESTIMATE",
    "Bound",
    "annotate",
    "read_range",
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

# Rows per producer batch written by one Spark task (fixed, so retries re-chunk alike).
DEFAULT_WRITE_CHUNK_ROWS = 50_000
_WRITE_CHUNKS_IN_FLIGHT = 8

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
    (``read_range``), run by the executors, which are Ray actors, and the files
    of segments in a ``file://`` tier are one Parquet scan (``_scan_tier_files``).

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
    """The ranges of tiered segments in a local tier as one Parquet scan of their files
    (``_scan_tier_files``); every other range as a Spark partition running ``read_range``
    in a Python worker.

    Not ``read_topic_dataset(...).to_spark(spark)``: RayDP converts Ray blocks
    through pandas, which fails on the ``properties`` map column and costs a
    copy per row, and Spark would depend on object-store blocks that must
    outlive every re-evaluation of the DataFrame. Here Spark tasks read the
    segments themselves: any evaluation, or the recomputation of a lost
    partition, re-reads the same immutable offsets, and records cross one
    process boundary less. The ranges (and the credential) travel in the task closure;
    ``spark.range`` just numbers the partitions.
    """
    scanned = [r for r in plan.ranges if _scannable(r)]
    others = tuple(r for r in plan.ranges if not _scannable(r))
    frames = []
    if others:
        reader = functools.partial(
            _spark_read_partition, _cluster(), plan.unavailable_timeout_s, others, credential
        )
        count = len(others)
        frames.append(spark.range(0, count, 1, count).mapInArrow(reader, SPARK_SCHEMA))
    if scanned:
        frames.append(_scan_tier_files(spark, scanned))
    if not frames:
        return spark.createDataFrame([], SPARK_SCHEMA)
    return functools.reduce(lambda a, b: a.unionByName(b), frames)


def _scannable(piece: SegmentRange) -> bool:
    """A range Spark reads as a file scan: of a tiered segment, in a file whose columns are
    what a read returns (format 2), in a tier Spark reaches as files (``file://``, a
    path every executor sees on a multi-node cluster); others go through ``read_range``,
    which reads any ``pyarrow`` tier."""
    tier = piece.tier
    return tier is not None and tier.format >= 2 and tier.uri.startswith("file://")


def _scan_tier_files(spark: SparkSession, pieces: list[SegmentRange]) -> DataFrame:
    """One Parquet scan of the tiered files, keeping each segment's planned offsets (a
    whole file needs no offset filter, so Spark reads it as ``spark.read.parquet`` would)."""
    from pyspark.sql import functions as F  # noqa: N812 - Spark's own idiom

    spans: dict[int, list[tuple[int, int]]] = {}
    files: dict[int, TierFile] = {}
    for piece in sorted(pieces, key=lambda p: (p.segment_id, p.start)):
        assert piece.tier is not None
        files[piece.segment_id] = piece.tier
        runs = spans.setdefault(piece.segment_id, [])
        if runs and runs[-1][1] == piece.start:
            runs[-1] = (runs[-1][0], piece.end)
        else:
            runs.append((piece.start, piece.end))
    whole = [i for i, runs in spans.items() if runs == [(files[i].start, files[i].end)]]
    keep = F.col("segment_id").isin(whole) if whole else F.lit(False)
    for segment_id, runs in spans.items():
        if segment_id not in whole:
            for lo, hi in runs:
                span = (F.col("offset") >= lo) & (F.col("offset") < hi)
                keep = keep | ((F.col("segment_id") == segment_id) & span)
    # The schema given, not inferred: Spark would read a file's footer for it on every
    # read_topic, and a tier file of format 2 has every column of SPARK_SCHEMA.
    paths = sorted(f"file://{t.path}" for t in files.values())
    frame = spark.read.schema(SPARK_SCHEMA).parquet(*paths)
    return frame.where(keep) if len(whole) < len(spans) else frame


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
        checked_layout(name, credential, Permission.PRODUCE).epoch,
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
        AdminServiceCaller().call_blocking(
            "forget_write", job.topic, job.write_id, credential=job.credential
        )
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
    return checked_layout(TopicName.parse(job.topic), job.credential, Permission.PRODUCE)


def _first_attempt(job: _WriteJob, partition: int) -> bool:
    """Claim the partition with the cluster: only its first attempt succeeds. Spark's own
    attempt number misses stage retries, and a speculative copy may run alongside the first."""
    return AdminServiceCaller().call_blocking(
        "claim_write_partition", job.topic, job.write_id, partition, credential=job.credential
    )


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
