"""Snapshot reads of a whole topic, planned once and read range by range: what Spark's
``read_topic`` (``clients.spark``) and Ray Data's ``read_topic_dataset``
(``clients.ray_data``) share.

The plan
    ``read_topic`` / ``read_topic_dataset`` plan a *snapshot*: the cluster's admin
    service reads the layout and asks every segment it lists for its end offset
    once (``actors.admin.snapshot_reads``, decided by ``runtime.stream_plan`` as a
    streaming query's batches are), so the result is fixed when the call returns
    however long Spark takes to run it (re-evaluating the DataFrame re-reads the
    same immutable offset ranges). A segment created by a split after that layout
    read is not part of the snapshot, and its sealed parent is read to its final
    end, so every record is read exactly once and every key's records form a
    prefix of its history. Each offset range is read straight from its segment
    actor as Arrow batches, by Ray Data read tasks or by Spark tasks on the
    executors (Ray actors themselves), never through the driver.

Completeness (no silent partial results)
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

Tiered segments
    A segment moved to the tier is planned from its record in the metadata store,
    not by asking its actor, so a hibernating segment is not woken: its range
    names the tier's Parquet file, and is read from there, by a Parquet scan in
    Spark or with ``pyarrow`` elsewhere, with no segment actor involved. The
    cluster authorizes the plan (``consume``); the files are then read with the
    reader's own access to the tier.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal

from actors.admin.caller import AdminServiceCaller
from clients.checkpoint_consumer import Checkpoint
from clients.range_reads import SegmentRange, TierFile
from runtime.auth import client_credential
from runtime.config import env_float
from runtime.connect import connect
from runtime.errors import InvalidArgumentError
from runtime.names import TopicName

# How long a listed segment may stay unreachable (restarting) before a read gives up on it.
DEFAULT_UNAVAILABLE_TIMEOUT_S = env_float("RAYTOPICS_UNAVAILABLE_TIMEOUT_S", 20.0)
# Rows per read task / Spark partition: big enough to amortize a task, small enough
# that a large segment is read by several executors at once.
DEFAULT_ROWS_PER_PARTITION = 1_000_000
ROW_BYTES_ESTIMATE = 160  # ~100 B value plus key, offset, time, hash

Bound = Literal["earliest", "latest"] | Checkpoint | datetime | int


class PartialReadWarning(UserWarning):
    """A read asked for ``allow_partial=True`` and some listed segments were not served."""


# --- the plan -----------------------------------------------------------------------------


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
    """Fix the snapshot: the cluster reads the layout and asks every needed segment for
    its offsets (``actors.admin.snapshot_reads``); the ranges are cut here into
    partitions of at most ``rows_per_partition`` records.

    Raises ``UnavailableSegmentsError`` naming every listed segment that did not
    answer, unless ``allow_partial``; then they are in ``missing_segments``. The
    ``token`` (default ``RAYTOPICS_TOKEN``) needs ``consume``.
    """
    credential = client_credential(token)
    name = TopicName.parse(topic)
    start, end = (_at_time(name, bound, token) for bound in (start, end))
    _check_bounds(name, start, end, rows_per_partition)
    timeout_s = float(
        DEFAULT_UNAVAILABLE_TIMEOUT_S if unavailable_timeout_s is None else unavailable_timeout_s
    )
    connect()
    planned = AdminServiceCaller().call_blocking(
        "plan_snapshot",
        str(name),
        _position(start),
        _position(end),
        subscription,
        timeout_s,
        allow_partial,
        credential=credential,
    )
    ranges = [piece for r in planned["ranges"] for piece in _split(_range(r), rows_per_partition)]
    missing = tuple(planned["missing"])
    return ReadPlan(str(name), planned["epoch"], tuple(ranges), missing, timeout_s)


def _at_time(name: TopicName, bound: Any, token: str | None) -> Any:
    """A time bound (an aware ``datetime``, epoch milliseconds) as the checkpoint of the
    first message published at or after it; any other bound as it is."""
    if isinstance(bound, datetime) or (isinstance(bound, int) and not isinstance(bound, bool)):
        return Checkpoint.at_timestamp(str(name), bound, token=token)
    return bound


def _check_bounds(name: TopicName, start: Any, end: Any, rows_per_partition: int) -> None:
    for label, bound, word in (("start", start, "earliest"), ("end", end, "latest")):
        if isinstance(bound, Checkpoint):
            if bound.topic != str(name):
                raise InvalidArgumentError(f"{label} checkpoint is for {bound.topic}, not {name}")
        elif bound != word:
            raise InvalidArgumentError(
                f"{label} must be {word!r}, a Checkpoint or a time (an aware datetime, epoch "
                f"milliseconds), got {bound!r}"
            )
    if rows_per_partition < 1:
        raise InvalidArgumentError(f"rows_per_partition must be positive: {rows_per_partition}")


def _position(bound: Any) -> Any:
    """A checkpoint as the position the cluster plans from; ``earliest``/``latest`` as is."""
    if isinstance(bound, Checkpoint):
        positions = {str(k): v for k, v in bound.positions.items()}
        return {"next": positions, "finished": list(bound.finished)}
    return bound


def _range(planned: dict[str, Any]) -> SegmentRange:
    tier = planned["tier"]
    if tier is not None:
        tier = TierFile(tier["uri"], tier["path"], tier["start"], tier["end"], tier["format"])
    return SegmentRange(
        planned["segment"], planned["segmentId"], planned["from"], planned["to"], tier
    )


def _split(whole: SegmentRange, rows: int) -> list[SegmentRange]:
    return [
        SegmentRange(whole.segment, whole.segment_id, lo, min(lo + rows, whole.end), whole.tier)
        for lo in range(whole.start, whole.end, rows)
    ]


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
