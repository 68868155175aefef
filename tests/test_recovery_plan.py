"""``runtime.recovery`` finds the committed layout from segment storage, at any crash point.

The storage is simulated exactly as the controller writes it (children's
``SegmentInfo`` at step 2, each parent's children at step 3, the incarnation's
epoch after the commit, a pruned segment's storage removed before its commit),
over random histories of splits, merges and prunes, with the metadata lost at
a random step of the last operation.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from runtime.errors import UnrecoverableStorageError
from runtime.layout import HashRange, SegmentInfo, SegmentLayout
from runtime.operations import (
    PendingOperation,
    apply_operation,
    plan_merge,
    plan_prune,
    plan_split,
)
from runtime.recovery import StoredSegmentState, plan_recovery


@dataclass
class Storage:
    """What the segments' storage and the incarnation's ``topic.json`` hold."""

    infos: dict[int, SegmentInfo] = field(default_factory=dict)
    epoch: int = 0  # topic.json, rewritten after each commit
    next_segment_id: int = 0

    def states(self) -> list[StoredSegmentState]:
        return [StoredSegmentState(info, ("s",), fence_epoch=3) for info in self.infos.values()]


def create(num_segments: int) -> tuple[SegmentLayout, Storage]:
    layout = SegmentLayout.initial(num_segments)
    storage = Storage(dict(layout.all_segments), 0, layout.next_segment_id)
    return layout, storage


def run(layout: SegmentLayout, storage: Storage, op: PendingOperation, steps: int) -> int:
    """Carry out ``op`` as the controller does, stopping after ``steps`` writes; returns how
    many writes the operation has in all."""
    writes: list = []
    if op.kind == "prune":
        writes += [lambda p=p: storage.infos.pop(p) for p in op.parents]
    else:
        epoch = op.base_epoch + 1
        for child in op.children:
            rng = HashRange(start=child.start, end=child.end)
            info = SegmentInfo.active(child.segment_id, rng, epoch, op.parents)
            writes.append(lambda info=info: storage.infos.__setitem__(info.segment_id, info))
        children = tuple(c.segment_id for c in op.children)
        for parent in op.parents:
            sealed = layout.get(parent).sealed(epoch, children)
            writes.append(lambda s=sealed: storage.infos.__setitem__(s.segment_id, s))
    after = apply_operation(layout, op)
    writes.append(lambda: None)  # the commit: metadata only
    writes.append(lambda: setattr(storage, "epoch", after.epoch))
    for write in writes[:steps]:
        write()
    return len(writes)


def plan_for(layout: SegmentLayout, choice: int) -> PendingOperation | None:
    """A valid operation on ``layout`` chosen by ``choice`` (None when there is none)."""
    candidates: list[PendingOperation] = []
    active = list(layout.active_segments.values())
    for seg in active:
        if seg.hash_range.width >= 2:
            candidates.append(plan_split(layout, seg.segment_id, "r"))
    for left, right in zip(active, active[1:], strict=False):
        candidates.append(plan_merge(layout, left.segment_id, right.segment_id, "r"))
    roots = [
        s.segment_id for s in layout.all_segments.values() if not s.is_active and not s.parent_ids
    ]
    if roots:
        candidates.append(plan_prune(layout, roots[:1], "r"))
    return candidates[choice % len(candidates)] if candidates else None


@settings(max_examples=300, deadline=None)
@given(
    st.integers(1, 5),
    st.lists(st.integers(0, 10_000), min_size=1, max_size=12),
    st.integers(0, 10),
)
def test_recovery_finds_the_committed_layout_at_every_crash_point(initial, choices, crash):
    layout, storage = create(initial)
    for choice in choices[:-1]:
        op = plan_for(layout, choice)
        if op is None:
            break
        run(layout, storage, op, steps=1_000)
        layout = apply_operation(layout, op)
    op = plan_for(layout, choices[-1])
    if op is None:
        return
    total = run(layout, storage, op, steps=crash)
    done = min(crash, total)
    after = apply_operation(layout, op)

    plan = plan_recovery(
        storage.states(), known_epoch=storage.epoch, known_next_segment_id=storage.next_segment_id
    )

    children = len(op.children)
    parents_sealed = 0 if op.kind == "prune" else min(len(op.parents), max(0, done - children))
    if op.kind == "merge" and parents_sealed == 1:
        assert plan.pending is not None and plan.pending.parents == op.parents
        assert plan.pending.children == op.children and plan.pending.base_epoch == layout.epoch
        assert dict(plan.layout.all_segments) == dict(layout.all_segments)
        assert dict(apply_operation(plan.layout, plan.pending).all_segments) == dict(
            after.all_segments
        )
        return
    assert plan.pending is None
    committed = (op.kind == "prune" and done >= len(op.parents)) or (
        op.kind != "prune" and parents_sealed == len(op.parents)
    )
    truth = after if committed else layout
    assert dict(plan.layout.all_segments) == dict(truth.all_segments)
    expected_discarded = [c.segment_id for c in op.children][:done] if not committed else []
    assert list(plan.discarded) == expected_discarded
    assert plan.layout.epoch > max(storage.epoch, 0) and plan.layout.epoch >= truth.epoch
    assert plan.layout.next_segment_id >= truth.next_segment_id
    assert plan.controller_epoch == 4 and plan.subscriptions == ("s",)
    plan.layout.check_invariants()


def test_a_recovered_layout_keeps_properties_and_is_newer_than_any_seen():
    layout = SegmentLayout.initial(2).split_segment(0)
    states = [StoredSegmentState(i, (), 0) for i in layout.all_segments.values()]
    plan = plan_recovery(states, known_epoch=7, properties={"team": "billing"})
    assert plan.layout.epoch == 8 and dict(plan.layout.properties) == {"team": "billing"}
    assert plan.controller_epoch == 1 and plan.subscriptions == ()


@pytest.mark.parametrize(
    "drop, problem",
    [
        ({0}, "do not form a valid layout"),  # a range with no storage at all
        ({2}, "storage of [2] is missing"),  # a sealed parent names a child that is gone
    ],
)
def test_storage_that_proves_no_layout_is_refused(drop, problem):
    layout = SegmentLayout.initial(2).split_segment(1)
    infos = [i for i in layout.all_segments.values() if i.segment_id not in drop]
    with pytest.raises(
        UnrecoverableStorageError, match=problem.replace("[", r"\[").replace("]", r"\]")
    ):
        plan_recovery([StoredSegmentState(i) for i in infos])


def test_no_storage_at_all_is_refused():
    with pytest.raises(UnrecoverableStorageError, match="no segment storage"):
        plan_recovery([])
