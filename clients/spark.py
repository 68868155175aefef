"""The Spark bridge: bounded snapshot reads of a whole topic, and bulk writes (Ray Data's
side, sharing the planning, is ``clients.ray_data``).

Reads
    ``read_topic`` plans a snapshot (``clients.read_plan``) and reads it on the
    executors: each range straight from its segment actor, a tiered segment's
    straight from the tier's Parquet files (a Spark file scan), never through the
    driver.

Writes
    ``write_topic`` writes each Spark partition in fixed-size chunks over Arrow
    batches (``mapInArrow``), so rows never pass through the driver. Each chunk is
    stored once however often Spark runs its task (a retry, a speculative copy)
    and whatever splits and merges happened in between: the cluster records
    where each part of the chunk goes before the task appends it, and a task that
    finds the record appends only what is missing (``runtime.sink_writes``, the
    mechanism the streaming sink uses too). The task appends the parts to their
    segments itself; only the record goes through the admin service.

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
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import ray

from actors.admin.caller import AdminServiceCaller
from actors.control.dag_watch import fetch_layout
from clients._loop import background_loop
from clients._sink import write_chunks
from clients.range_reads import OUTPUT_SCHEMA, SegmentRange, TierFile, read_range
from clients.read_plan import (
    DEFAULT_ROWS_PER_PARTITION,
    DEFAULT_UNAVAILABLE_TIMEOUT_S,
    ROW_BYTES_ESTIMATE,
    Bound,
    PartialReadWarning,
    ReadPlan,
    annotate,
    plan_read,
)
from runtime.auth import Permission, client_credential
from runtime.batch import batch_slices, message_sizes
from runtime.connect import connect
from runtime.errors import (
    InvalidArgumentError,
)
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

# Rows per chunk written by one Spark task (fixed, so retries re-chunk alike).
DEFAULT_WRITE_CHUNK_ROWS = 100_000

SPARK_SCHEMA = (
    "key string, value binary, hash int, segment_id long, offset long, "
    "publish_time timestamp, properties map<string,string>"
)
_WRITE_SUMMARY_SCHEMA = "partition int, retry boolean, rows long"
_WRITE_SUMMARY_ARROW = pa.schema(
    [
        ("partition", pa.int32()),
        ("retry", pa.bool_()),
        ("rows", pa.int64()),
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
    """What ``write_topic`` stored. ``retried_partitions`` ran more than once (a Spark
    task retried, or a copy that found some of its chunks stored already); each row was
    still stored exactly once. ``at_least_once_partitions`` is always empty: no retry, layout
    change or not, writes a row twice (kept for programs that read it)."""

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
    chunk_rows: int
    max_batch_messages: int
    max_batch_bytes: int
    credential: str | None = field(default=None, repr=False)


def write_topic(
    df: DataFrame,
    topic: str,
    key_col: str | None = "key",
    value_col: str = "value",
    properties_col: str | None = None,
    *,
    chunk_rows: int = DEFAULT_WRITE_CHUNK_ROWS,
    token: str | None = None,
) -> WriteResult:
    """Publish every row of ``df`` to ``topic``: the Spark partitions in parallel, each in
    chunks of ``chunk_rows`` rows (fewer where the namespace's batch limits say so).

    ``key_col`` (cast to string; ``None`` for unkeyed rows), ``value_col`` (cast
    to binary: strings become their UTF-8 bytes) and ``properties_col`` (a
    ``map<string,string>``) name the columns. Per-key order follows the row
    order within a partition. Returns once every row is stored. Retried Spark
    tasks do not duplicate, whatever the topic's layout did meanwhile (see the module
    docstring), provided a partition's rows come out the same on a retry, as for any
    idempotent Spark sink: persist or checkpoint a DataFrame whose lineage shuffles
    non-deterministically.

    ``token`` (default ``RAYTOPICS_TOKEN``) needs ``produce`` on the topic's namespace
    when the cluster has an auth policy: a refusal is raised here, before any task runs.
    """
    from pyspark.sql import functions as F

    name = TopicName.parse(topic)
    if chunk_rows < 1:
        raise InvalidArgumentError(f"chunk_rows must be positive, got {chunk_rows}")
    credential = client_credential(token)
    connect()
    # A refusal comes before any task: the layout is read as the writer.
    background_loop().run(fetch_layout(name, credential, Permission.PRODUCE))
    limits = AdminServiceCaller().call_blocking(
        "get_namespace_limits", name.namespace_path, credential=credential
    )
    job = _WriteJob(
        _cluster(),
        str(name),
        uuid.uuid4().hex,
        chunk_rows,
        limits["max_batch_messages"],
        limits["max_batch_bytes"],
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
    rows = sum(row.rows for row in summary)
    return WriteResult(job.write_id, rows, len(summary), retried)


def _spark_write_partition(
    job: _WriteJob, batches: Iterator[pa.RecordBatch]
) -> Iterator[pa.RecordBatch]:
    """Store the partition's chunks in order, each once (``runtime.sink_writes``); a
    failure fails the task, whose retry stores what is still missing."""
    from pyspark import TaskContext

    context = TaskContext.get()
    partition = context.partitionId()
    _join_ray(job.cluster)
    chunks = _chunks(batches, job)
    write = write_chunks(
        AdminServiceCaller(), job.topic, job.write_id, partition, job.credential, chunks
    )
    rows, stored_before = background_loop().run(write)
    # Spark's attempt number misses a stage's retry and a speculative copy; chunks found
    # stored by another attempt catch those (an attempt that died before storing any
    # shows only in the number)
    retry = stored_before or context.attemptNumber() > 0
    summary = {"partition": [partition], "retry": [retry], "rows": [rows]}
    yield pa.RecordBatch.from_pydict(summary, schema=_WRITE_SUMMARY_ARROW)


def _chunks(batches: Iterable[pa.RecordBatch], job: _WriteJob) -> Iterator[pa.RecordBatch]:
    """The partition's rows in chunks that depend only on the rows and the job (so every
    attempt cuts them alike): ``chunk_rows`` each, cut further where the namespace's
    batch limits, read once when the write started, need it."""
    for chunk in _rechunk(batches, job.chunk_rows):
        sizes = message_sizes(chunk)
        for start, stop in batch_slices(sizes, job.max_batch_messages, job.max_batch_bytes):
            yield chunk.slice(start, stop - start)


def _rechunk(batches: Iterable[pa.RecordBatch], size: int) -> Iterator[pa.RecordBatch]:
    """Exactly ``size`` rows per chunk (the last one shorter), whatever batches came in:
    chunk boundaries depend only on the rows."""
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
