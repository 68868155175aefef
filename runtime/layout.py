"""The segment DAG: ``HashRange``, ``SegmentInfo`` and the immutable ``SegmentLayout``.

A layout is a value: every mutation returns a new layout with ``epoch + 1`` and
the old one stays valid, so readers never lock and the controller can compute
the next layout, persist it with one compare-and-swap, and only then publish it.
The JSON form is the public ``ScalableTopicMetadata`` document, field for field.
"""

from __future__ import annotations

import bisect
import itertools
import json
from collections.abc import Iterable, Iterator, Sequence
from enum import StrEnum
from types import MappingProxyType
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from runtime.errors import (
    InconsistentRequestError,
    InvalidArgumentError,
    InvalidLayoutError,
    SegmentNotActiveError,
    SegmentNotFoundError,
    SegmentsNotAdjacentError,
    SegmentTooNarrowError,
)
from runtime.names import MAX_HASH, SegmentName, TopicName

MAX_SEGMENTS = MAX_HASH + 1


class _Model(BaseModel):
    model_config = ConfigDict(frozen=True, populate_by_name=True, extra="forbid")


class HashRange(_Model):
    start: int = Field(ge=0, le=MAX_HASH)
    end: int = Field(ge=0, le=MAX_HASH)

    def model_post_init(self, _context: Any) -> None:
        if self.start > self.end:
            raise ValueError(f"hash range start {self.start} is after end {self.end}")

    def __contains__(self, hash_value: int) -> bool:
        return self.start <= hash_value <= self.end

    @property
    def width(self) -> int:
        return self.end - self.start + 1

    def midpoint(self) -> int:
        return self.start + (self.end - self.start) // 2

    def __str__(self) -> str:
        return f"[{self.start:04x}, {self.end:04x}]"


class SegmentState(StrEnum):
    ACTIVE = "ACTIVE"
    SEALED = "SEALED"


class SegmentInfo(_Model):
    segment_id: int = Field(alias="segmentId", ge=0)
    hash_range: HashRange = Field(alias="hashRange")
    state: SegmentState
    parent_ids: tuple[int, ...] = Field(default=(), alias="parentIds")
    child_ids: tuple[int, ...] = Field(default=(), alias="childIds")
    created_at_epoch: int = Field(default=0, alias="createdAtEpoch", ge=0)
    sealed_at_epoch: int = Field(default=0, alias="sealedAtEpoch", ge=0)

    @classmethod
    def active(
        cls, segment_id: int, hash_range: HashRange, epoch: int, parents: tuple[int, ...] = ()
    ) -> SegmentInfo:
        return cls(
            segment_id=segment_id,
            hash_range=hash_range,
            state=SegmentState.ACTIVE,
            parent_ids=parents,
            created_at_epoch=epoch,
        )

    def sealed(self, epoch: int, children: tuple[int, ...]) -> SegmentInfo:
        return self.model_copy(
            update={"state": SegmentState.SEALED, "sealed_at_epoch": epoch, "child_ids": children}
        )

    @property
    def is_active(self) -> bool:
        return self.state is SegmentState.ACTIVE

    def name(self, topic: TopicName) -> SegmentName:
        """This segment's ``segment://`` name in ``topic``."""
        return topic.segment(self.segment_id, self.hash_range.start, self.hash_range.end)


class ScalableTopicMetadata(_Model):
    """The persisted document, the public ``ScalableTopicMetadata`` shape."""

    epoch: int = Field(ge=0)
    next_segment_id: int = Field(alias="nextSegmentId", ge=0)
    segments: dict[str, SegmentInfo]
    properties: dict[str, str] = Field(default_factory=dict)

    @field_validator("segments")
    @classmethod
    def _keys_match_ids(cls, segments: dict[str, SegmentInfo]) -> dict[str, SegmentInfo]:
        for key, info in segments.items():
            if key != str(info.segment_id):
                raise ValueError(f"segment key {key!r} does not match segmentId {info.segment_id}")
        return segments

    def to_json(self) -> str:
        return self.model_dump_json(by_alias=True)


class SegmentLayout:
    """Immutable, versioned snapshot of one topic's segment DAG."""

    __slots__ = ("epoch", "next_segment_id", "properties", "_all", "_active", "_ordered", "_starts")

    def __init__(
        self,
        epoch: int,
        next_segment_id: int,
        segments: dict[int, SegmentInfo],
        properties: dict[str, str] | None = None,
    ) -> None:
        self.epoch = epoch
        self.next_segment_id = next_segment_id
        self.properties = MappingProxyType(dict(properties or {}))
        self._all = MappingProxyType(dict(sorted(segments.items())))
        active = sorted(
            (s for s in segments.values() if s.is_active), key=lambda s: s.hash_range.start
        )
        self._active = MappingProxyType({s.segment_id: s for s in active})
        self._ordered = tuple(active)
        self._starts = [s.hash_range.start for s in active]

    # --- construction --------------------------------------------------------

    @classmethod
    def initial(cls, num_segments: int, properties: dict[str, str] | None = None) -> SegmentLayout:
        """Divide ``[0, 0xFFFF]`` into N near-equal ranges (the first ones one wider)."""
        if not isinstance(num_segments, int) or not 1 <= num_segments <= MAX_SEGMENTS:
            raise InvalidArgumentError(
                f"num_segments must be an integer from 1 to {MAX_SEGMENTS}, got {num_segments!r}"
            )
        width, extra = divmod(MAX_SEGMENTS, num_segments)
        segments, start = {}, 0
        for seg_id in range(num_segments):
            end = start + width + (1 if seg_id < extra else 0) - 1
            segments[seg_id] = SegmentInfo.active(seg_id, HashRange(start=start, end=end), 0)
            start = end + 1
        return cls(0, num_segments, segments, properties)

    # --- views ---------------------------------------------------------------

    @property
    def all_segments(self) -> MappingProxyType[int, SegmentInfo]:
        return self._all

    @property
    def active_segments(self) -> MappingProxyType[int, SegmentInfo]:
        """Active segments keyed by id, in hash-range order."""
        return self._active

    def readable(self, finished: Iterable[int]) -> list[SegmentInfo]:
        """The segments a reader may read now, given those it ``finished`` (sealed and read
        to their end): the unfinished ones whose parents all are. A parent no longer in
        the layout was pruned by retention: nothing of it is left to read first. The one
        rule of DAG order that every reader follows (consumers' assignment, streaming
        micro-batches), so no child is read before its parents are."""
        done = set(finished)
        return [
            info
            for info in self._all.values()
            if info.segment_id not in done
            and all(p in done or p not in self._all for p in info.parent_ids)
        ]

    def get(self, segment_id: int) -> SegmentInfo:
        try:
            return self._all[segment_id]
        except KeyError:
            raise SegmentNotFoundError(
                f"segment {segment_id} does not exist in this topic (known ids: "
                f"{_id_summary(self._all)})"
            ) from None

    def find_active_segment(self, hash_value: int) -> SegmentInfo:
        if not 0 <= hash_value <= MAX_HASH:
            raise InvalidArgumentError(f"hash {hash_value} is outside [0, {MAX_HASH}]")
        index = bisect.bisect_right(self._starts, hash_value) - 1
        segment = self._ordered[index] if index >= 0 else None
        if segment is None or hash_value not in segment.hash_range:
            raise SegmentNotFoundError(f"no active segment covers hash {hash_value}")
        return segment

    def get_lineage(self, segment_id: int) -> list[SegmentInfo]:
        """Every ancestor and descendant of a segment, plus itself, ordered by id."""
        seen = {segment_id}
        for direction in ("parent_ids", "child_ids"):
            frontier = [segment_id]
            while frontier:
                for nxt in getattr(self.get(frontier.pop()), direction):
                    if nxt not in seen and nxt in self._all:
                        seen.add(nxt)
                        frontier.append(nxt)
        return [self._all[i] for i in sorted(seen)]

    def check_invariants(self) -> None:
        """Raise ``InvalidLayoutError`` naming the first broken DAG invariant.

        Active segments tile ``[0, 0xFFFF]`` with no gap or overlap, ids are
        unique and below ``nextSegmentId``, sealed segments have children (and
        only they do), and every parent/child link is mirrored.
        """
        for problem in self._problems():
            raise InvalidLayoutError(f"invalid layout at epoch {self.epoch}: {problem}")

    def _problems(self) -> Iterator[str]:
        active = self._ordered
        if not active:
            yield "no active segments"
            return
        if active[0].hash_range.start != 0 or active[-1].hash_range.end != MAX_HASH:
            first, last = active[0].hash_range.start, active[-1].hash_range.end
            yield f"active segments cover [{first}, {last}], not [0, {MAX_HASH}]"
        for left, right in zip(active, active[1:], strict=False):
            if left.hash_range.end + 1 != right.hash_range.start:
                yield f"gap or overlap between {left.segment_id} and {right.segment_id}"
        for seg in self._all.values():
            if seg.segment_id >= self.next_segment_id:
                yield f"segment {seg.segment_id} >= nextSegmentId {self.next_segment_id}"
            if seg.is_active == bool(seg.child_ids) or seg.is_active != (seg.sealed_at_epoch == 0):
                yield f"segment {seg.segment_id} is {seg.state.value} with children {seg.child_ids}"
            for child in seg.child_ids:
                if child in self._all and seg.segment_id not in self._all[child].parent_ids:
                    yield f"child {child} does not list parent {seg.segment_id}"
            for parent in seg.parent_ids:
                if parent in self._all and seg.segment_id not in self._all[parent].child_ids:
                    yield f"parent {parent} does not list child {seg.segment_id}"

    # --- mutations (each returns a new layout) -------------------------------

    def split_segment(
        self, segment_id: int, at: int | Sequence[int] | None = None, parts: int | None = None
    ) -> SegmentLayout:
        """Children that partition the segment's range: by default two halves; with
        ``at`` (as Kinesis's ``NewStartingHashKey``) the upper child starts there;
        with several ascending hashes (as Pravega scales one segment into several), each
        starts a child, so one split can give a hot key range, or a single hot key
        (``[h, h + 1]``), a segment of its own; with ``parts``, that many near-equal
        children."""
        parent = self._require_active(segment_id)
        rng = parent.hash_range
        if rng.width < 2:
            raise SegmentTooNarrowError(
                f"segment {segment_id} covers the single hash {rng.start}: "
                "a one-wide range cannot be split"
            )
        starts = _child_starts(segment_id, rng, at, parts)
        ends = [s - 1 for s in starts[1:]] + [rng.end]
        epoch, first = self.epoch + 1, self.next_segment_id
        children = tuple(
            SegmentInfo.active(first + i, HashRange(start=s, end=e), epoch, (segment_id,))
            for i, (s, e) in enumerate(zip(starts, ends, strict=True))
        )
        return self._replace((parent,), children)

    def merge_segments(self, segment_id1: int, segment_id2: int, *more: int) -> SegmentLayout:
        """One child covering neighbouring active ranges: two, or (``more``, as Pravega
        merges several at once) a whole run of them, given in any order."""
        ids = (segment_id1, segment_id2, *more)
        if len(set(ids)) != len(ids):
            raise SegmentsNotAdjacentError(
                f"cannot merge segments {list(ids)}: a segment appears twice (with itself); "
                "only distinct neighbouring active ranges can merge"
            )
        if len(ids) > MAX_SPLIT_CHILDREN:
            raise InvalidArgumentError(
                f"a merge takes at most {MAX_SPLIT_CHILDREN} segments, asked for {len(ids)}"
            )
        run = sorted((self._require_active(i) for i in ids), key=lambda s: s.hash_range.start)
        for a, b in itertools.pairwise(run):
            if a.hash_range.end + 1 != b.hash_range.start:
                raise SegmentsNotAdjacentError(
                    f"segments {a.segment_id} {a.hash_range} and {b.segment_id} {b.hash_range} "
                    "are not adjacent: only neighbouring active ranges can merge"
                )
        rng = HashRange(start=run[0].hash_range.start, end=run[-1].hash_range.end)
        child = SegmentInfo.active(
            self.next_segment_id, rng, self.epoch + 1, tuple(s.segment_id for s in run)
        )
        return self._replace(tuple(run), (child,))

    def prune_segment(self, segment_id: int) -> SegmentLayout:
        """Drop a sealed root segment from the DAG (retention); its children become roots.

        Only roots can go: readers drain parents before children, so retention
        always reaches a segment after its ancestors, and pruning from the top
        keeps every remaining parent/child link meaningful.
        """
        segment = self.get(segment_id)
        if segment.is_active:
            raise SegmentNotActiveError(
                f"segment {segment_id} is ACTIVE: only sealed segments can be pruned"
            )
        if segment.parent_ids:
            raise SegmentNotActiveError(
                f"segment {segment_id} still has parents {list(segment.parent_ids)}: "
                "prune them first (only root segments can be pruned)"
            )
        updated = dict(self._all)
        del updated[segment_id]
        for child_id in segment.child_ids:
            child = updated[child_id]
            parents = tuple(p for p in child.parent_ids if p != segment_id)
            updated[child_id] = child.model_copy(update={"parent_ids": parents})
        return SegmentLayout(self.epoch + 1, self.next_segment_id, updated, dict(self.properties))

    def with_properties(self, properties: dict[str, str]) -> SegmentLayout:
        return SegmentLayout(self.epoch + 1, self.next_segment_id, dict(self._all), properties)

    def _require_active(self, segment_id: int) -> SegmentInfo:
        segment = self.get(segment_id)
        if not segment.is_active:
            raise SegmentNotActiveError(
                f"segment {segment_id} is SEALED (since epoch {segment.sealed_at_epoch}, "
                f"children {list(segment.child_ids)}): only ACTIVE segments can be split or merged"
            )
        return segment

    def _replace(
        self, parents: tuple[SegmentInfo, ...], children: tuple[SegmentInfo, ...]
    ) -> SegmentLayout:
        epoch, child_ids = self.epoch + 1, tuple(c.segment_id for c in children)
        updated = dict(self._all)
        for parent in parents:
            updated[parent.segment_id] = parent.sealed(epoch, child_ids)
        for child in children:
            updated[child.segment_id] = child
        next_id = self.next_segment_id + len(children)
        return SegmentLayout(epoch, next_id, updated, dict(self.properties))

    # --- persistence -----------------------------------------------------------

    def to_metadata(self) -> ScalableTopicMetadata:
        return ScalableTopicMetadata(
            epoch=self.epoch,
            next_segment_id=self.next_segment_id,
            segments={str(i): s for i, s in self._all.items()},
            properties=dict(self.properties),
        )

    @classmethod
    def from_metadata(cls, metadata: ScalableTopicMetadata) -> SegmentLayout:
        segments = {info.segment_id: info for info in metadata.segments.values()}
        return cls(metadata.epoch, metadata.next_segment_id, segments, metadata.properties)

    def to_json(self) -> str:
        return self.to_metadata().to_json()

    def to_dict(self) -> dict[str, Any]:
        return self.to_metadata().model_dump(by_alias=True, mode="json")

    @classmethod
    def from_json(cls, text: str | bytes) -> SegmentLayout:
        try:
            return cls.from_metadata(ScalableTopicMetadata.model_validate_json(text))
        except ValidationError as err:
            raise InvalidArgumentError(f"invalid ScalableTopicMetadata JSON: {err}") from None

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> SegmentLayout:
        return cls.from_json(json.dumps(data))

    def __eq__(self, other: object) -> bool:
        return isinstance(other, SegmentLayout) and self.to_metadata() == other.to_metadata()

    def __hash__(self) -> int:
        return hash((self.epoch, self.next_segment_id))

    def __repr__(self) -> str:
        return (
            f"SegmentLayout(epoch={self.epoch}, next_segment_id={self.next_segment_id}, "
            f"active={list(self._active)}, all={len(self._all)})"
        )


def _id_summary(segments: MappingProxyType[int, SegmentInfo]) -> str:
    ids = list(segments)
    return ", ".join(map(str, ids)) if len(ids) <= 16 else f"{ids[0]}..{ids[-1]}"


MAX_SPLIT_CHILDREN = 64  # children of one split: more is many splits' worth of processes


def _child_starts(
    segment_id: int, rng: HashRange, at: int | Sequence[int] | None, parts: int | None
) -> list[int]:
    """Where each child of a split of ``rng`` starts: ``rng.start``, then ``at`` (one
    hash or ascending hashes, each strictly inside the range), or ``parts`` near-equal
    ranges' starts; by default the midpoint.

    The types are ``InvalidArgumentError``s; what only the segment's range, or the two
    arguments together, rule out (what no request schema can state) is an
    ``InconsistentRequestError``."""
    if parts is not None:
        if isinstance(parts, bool) or not isinstance(parts, int) or parts < 2:
            raise InvalidArgumentError(f"parts must be an integer of 2 or more, not {parts!r}")
        if at is not None:
            raise InconsistentRequestError("a split takes at or parts, not both")
        most = min(MAX_SPLIT_CHILDREN, rng.width)
        if parts > most:
            raise InconsistentRequestError(
                f"cannot split segment {segment_id} {rng} into {parts} parts: "
                f"2 to {most} (at most {MAX_SPLIT_CHILDREN}, and one hash each)"
            )
        return [rng.start + i * rng.width // parts for i in range(parts)]
    if at is None:
        return [rng.start, rng.midpoint() + 1]
    hashes = list(at) if isinstance(at, list | tuple) else [at]
    if not hashes or not all(isinstance(h, int) and not isinstance(h, bool) for h in hashes):
        raise InvalidArgumentError(f"at must be a hash or a non-empty list of hashes, not {at!r}")
    if len(hashes) >= MAX_SPLIT_CHILDREN:
        raise InvalidArgumentError(
            f"a split makes at most {MAX_SPLIT_CHILDREN} children, asked for {len(hashes) + 1}"
        )
    ascending = all(a < b for a, b in itertools.pairwise(hashes))
    if not ascending or not rng.start < hashes[0] <= hashes[-1] <= rng.end:
        raise InconsistentRequestError(
            f"cannot split segment {segment_id} {rng} at hash {at!r}: each child after "
            f"the first starts at a hash in [{rng.start + 1:#06x}, {rng.end:#06x}] "
            f"({rng.start + 1}-{rng.end}), in ascending order, so that every child covers one"
        )
    return [rng.start, *hashes]
