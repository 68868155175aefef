"""Rebuilding a topic's layout from what its segments keep in their own storage.

Metadata can be lost while the segments' storage is intact (an in-memory GCS
restarted, a key-value store wiped). Every segment records its ``SegmentInfo``
when its storage is laid out, and a split's or merge's parents record their
children when they are terminated (protocol step 3, before the layout commit).
That is enough to find the last committed layout, and to tell how far an
operation that was interrupted by the loss had come:

* children whose parents never recorded them were created (step 2) but never
  committed: nobody wrote to them, so they are discarded;
* a merge whose first parent recorded its child but whose second did not was
  stopped inside step 3: the layout it was planned on comes back with the merge
  pending, and the controller rolls it forward as it does after a crash;
* children that every stored parent records are committed, whether or not the
  commit itself reached the metadata store.

Segments pruned by retention have no storage left; their children simply
stop naming them as parents, exactly as a pruned layout does.

Pure: the storage scan and the writes are the callers' (``actors.control.controller``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from runtime.errors import InvalidLayoutError, UnrecoverableStorageError
from runtime.layout import SegmentInfo, SegmentLayout, SegmentState
from runtime.operations import OperationKind, PendingOperation, PlannedSegment, apply_operation


@dataclass(frozen=True)
class StoredSegmentState:
    """What one segment's storage says about it."""

    info: SegmentInfo
    subscriptions: tuple[str, ...] = ()
    fence_epoch: int = 0


@dataclass(frozen=True)
class RecoveryPlan:
    """The metadata to write back.

    ``layout`` is the last committed layout, or, with ``pending``, the layout the
    interrupted operation was planned on. ``discarded``: segments no committed
    layout names (their storage can go). ``controller_epoch`` is above every
    fencing epoch the segments have seen, so they accept the recovering controller.
    """

    layout: SegmentLayout
    pending: PendingOperation | None
    subscriptions: tuple[str, ...]
    discarded: tuple[int, ...]
    controller_epoch: int


def plan_recovery(
    segments: Sequence[StoredSegmentState],
    *,
    known_epoch: int = 0,
    known_next_segment_id: int = 0,
    properties: dict[str, str] | None = None,
) -> RecoveryPlan:
    """The layout (and pending operation) that ``segments`` prove.

    ``known_epoch`` / ``known_next_segment_id``: what the incarnation's own
    record last said (it may lag one operation behind, never run ahead). A
    complete recovery is itself a layout change: its epoch is above every epoch
    seen, so a client that watched the old layout takes the new one.
    """
    stored = {s.info.segment_id: s for s in segments}
    if not stored:
        raise UnrecoverableStorageError("no segment storage to recover from")
    infos = {i: s.info for i, s in stored.items()}
    discarded = sorted(i for i in infos if _never_committed(infos, i))
    kept = {i: info for i, info in infos.items() if i not in discarded}
    _check_children_present(kept)
    subscriptions = tuple(sorted({n for i in kept for n in stored[i].subscriptions}))
    fence = max(s.fence_epoch for s in stored.values()) + 1
    next_id = max(known_next_segment_id, max(infos) + 1)
    pending = _interrupted_merge(kept)
    if pending is not None:
        layout = _before(kept, pending, properties)
        _check(layout)
        _check(apply_operation(layout, pending))
    else:
        seen = (max(i.created_at_epoch, i.sealed_at_epoch) for i in kept.values())
        epoch = max(known_epoch, *seen) + 1
        layout = SegmentLayout(epoch, next_id, _without_pruned(kept), properties)
        _check(layout)
    return RecoveryPlan(layout, pending, subscriptions, tuple(discarded), fence)


def _present_parents(infos: dict[int, SegmentInfo], segment_id: int) -> list[int]:
    return [p for p in infos[segment_id].parent_ids if p in infos]


def _never_committed(infos: dict[int, SegmentInfo], segment_id: int) -> bool:
    """Created in step 2 of an operation whose step 3 never recorded it anywhere."""
    parents = _present_parents(infos, segment_id)
    return bool(parents) and all(segment_id not in infos[p].child_ids for p in parents)


def _check_children_present(infos: dict[int, SegmentInfo]) -> None:
    for info in infos.values():
        missing = [c for c in info.child_ids if c not in infos]
        if missing:
            raise UnrecoverableStorageError(
                f"segment {info.segment_id} was sealed in favour of {list(info.child_ids)}, "
                f"but the storage of {missing} is missing"
            )


def _interrupted_merge(infos: dict[int, SegmentInfo]) -> PendingOperation | None:
    """The merge stopped between terminating its first and its second parent, if any."""
    found = []
    for child in infos.values():
        parents = _present_parents(infos, child.segment_id)
        waiting = [p for p in parents if child.segment_id not in infos[p].child_ids]
        if waiting:
            found.append((child, parents))
    if not found:
        return None
    if len(found) > 1:
        raise UnrecoverableStorageError(
            f"segments {[c.segment_id for c, _ in found]} each wait for a parent to seal: "
            "more than one operation was in progress"
        )
    child, parents = found[0]
    if child.state is not SegmentState.ACTIVE or len(parents) != 2:
        raise UnrecoverableStorageError(
            f"segment {child.segment_id} waits for parents {parents} to seal, which no "
            "split or merge leaves behind"
        )
    ordered = tuple(sorted(parents, key=lambda p: infos[p].hash_range.start))
    rng = child.hash_range
    return PendingOperation(
        kind=OperationKind.MERGE,
        request_id=f"recovery-{child.segment_id}",
        parents=ordered,
        children=(PlannedSegment(segment_id=child.segment_id, start=rng.start, end=rng.end),),
        base_epoch=child.created_at_epoch - 1,
    )


def _before(
    infos: dict[int, SegmentInfo], op: PendingOperation, properties: dict[str, str] | None
) -> SegmentLayout:
    """The layout ``op`` was planned on: its child not there yet, its parents active."""
    (child,) = op.children
    segments = {i: info for i, info in _without_pruned(infos).items() if i != child.segment_id}
    for parent in op.parents:
        segments[parent] = segments[parent].model_copy(
            update={"state": SegmentState.ACTIVE, "child_ids": (), "sealed_at_epoch": 0}
        )
    return SegmentLayout(op.base_epoch, child.segment_id, segments, properties)


def _without_pruned(infos: dict[int, SegmentInfo]) -> dict[int, SegmentInfo]:
    """Parents whose storage retention removed are no parents any more (as in a pruned
    layout: their children became roots)."""
    return {
        i: info.model_copy(update={"parent_ids": tuple(p for p in info.parent_ids if p in infos)})
        for i, info in infos.items()
    }


def _check(layout: SegmentLayout) -> None:
    try:
        layout.check_invariants()
    except InvalidLayoutError as err:
        raise UnrecoverableStorageError(
            f"the stored segments do not form a valid layout: {err.message}"
        ) from None
