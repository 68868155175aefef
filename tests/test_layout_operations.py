"""A topic's layout operations as state logic, without Ray: the catalog on the in-memory
KV, and a fleet that records the calls the controller's fleet would make to segments.

The catalog, the fleet and the coordinators are ``tests/controller_parts.py``'s.

A split or merge that dies after any of its five steps is pending in the record, and
carrying it out again finishes it with the same layout a run without a crash commits;
every step the second run repeats is one the fleet takes twice without harm (creating a
child that exists, sealing a sealed parent). Crash tests on real Ray (test_controller)
and the chaos seeds check the same protocol end to end.
"""

from __future__ import annotations

import asyncio

import pytest
from controller_parts import EPOCH, TOPIC, Fleet, setup  # tests/ is on sys.path under pytest

from actors.control.layout_operations import LayoutOperations, Step
from actors.control.topic_parts import TopicParts
from actors.control.topic_subscriptions import TopicSubscriptions
from runtime.errors import ConflictError, OperationInProgressError
from runtime.layout import SegmentLayout
from runtime.operations import OperationKind, PendingOperation, plan_merge, plan_split
from runtime.policy import TopicPolicy
from runtime.replication import Replication
from storage.catalog import fenced
from storage.records import TopicRecord


class Crash(Exception):
    """The controller's process ending after a step (``inject_fault_after_step``)."""


def operations(parts: TopicParts, crash_after: Step | None) -> LayoutOperations:
    def update(change):  # noqa: ANN001, ANN202 - the controller's fenced CAS
        return parts.catalog.update_topic(TOPIC, fenced(EPOCH, TOPIC, change))

    def step_done(step: Step) -> None:
        if step == crash_after:
            raise Crash(step)

    subscriptions = TopicSubscriptions(parts, lambda: None)
    return LayoutOperations(parts, subscriptions, update, lambda record: None, step_done)


SPLIT_AT = 0x0100  # "split_at": segment 0 [0000-7fff] split with its upper child from here


def plan(kind: str, layout: SegmentLayout, request_id: str) -> PendingOperation:
    if kind.startswith("merge"):
        return plan_merge(layout, 0, 1, request_id, [2] if kind == "merge_three" else [])
    at = {"split_at": SPLIT_AT, "split_in_three": [SPLIT_AT, SPLIT_AT + 1]}.get(kind)
    return plan_split(layout, 0, request_id, at, 4 if kind == "split_in_parts" else None)


def run_through(kind: str, crash_after: Step | None) -> tuple[TopicRecord, Fleet]:
    catalog, fleet, parts = setup({"a": {0, 1}, "b": {1}}, 3 if kind == "merge_three" else 2)
    op = plan(kind, catalog.require_topic(TOPIC).layout, "req-1")
    ops = operations(parts, crash_after)
    if crash_after is None:
        asyncio.run(ops.run(op))
    else:
        with pytest.raises(Crash):
            asyncio.run(ops.run(op))
        pending = catalog.require_topic(TOPIC).pending_operation
        # Once committed, nothing is pending: the next incarnation has nothing to finish.
        assert (pending is None) == (crash_after >= Step.COMMITTED)
        if pending is not None:
            assert pending == op
            asyncio.run(operations(parts, None).carry_out(pending))
    return catalog.require_topic(TOPIC), fleet


@pytest.mark.parametrize(
    "kind", ["split", "split_at", "split_in_three", "split_in_parts", "merge", "merge_three"]
)
@pytest.mark.parametrize("crash_after", [None, *(s for s in Step if s <= Step.ANNOUNCED)])
def test_an_operation_cut_after_any_step_finishes_as_if_it_never_was(
    kind: str, crash_after: Step | None
) -> None:
    record, fleet = run_through(kind, crash_after)
    clean, clean_fleet = run_through(kind, None)
    assert record.pending_operation is None
    assert record.layout.to_dict() == clean.layout.to_dict()
    assert record.last_operation.kind == OperationKind(kind.split("_")[0])
    # the planned ranges, also when a later incarnation finishes the operation
    ranges = [record.layout.get(c).hash_range for c in record.layout.get(0).child_ids]
    expected = {
        "split": [(0x0000, 0x3FFF), (0x4000, 0x7FFF)],
        "split_at": [(0x0000, SPLIT_AT - 1), (SPLIT_AT, 0x7FFF)],
        "split_in_three": [(0, SPLIT_AT - 1), (SPLIT_AT, SPLIT_AT), (SPLIT_AT + 1, 0x7FFF)],
        "split_in_parts": [(i * 0x2000, i * 0x2000 + 0x1FFF) for i in range(4)],
        "merge": [(0x0000, 0xFFFF)],
        "merge_three": [(0x0000, 0xFFFF)],
    }[kind]
    assert [(r.start, r.end) for r in ranges] == expected
    if kind == "merge_three":
        (child,) = record.layout.get(0).child_ids
        assert record.layout.get(child).parent_ids == (0, 1, 2)
    assert record.completed_operation("req-1") is not None  # a retry gets this answer
    children = [c.segment_id for c in clean.layout.active_segments.values() if c.parent_ids]
    assert sorted(fleet.created) == sorted(children) == sorted(clean_fleet.created)
    # every child gets every subscription a parent had a cursor of, and the live ones
    assert all(subs == ["a", "b"] for subs in fleet.created.values())
    assert fleet.sealed == clean_fleet.sealed and set(fleet.sealed) == set(
        record.layout.get(children[0]).parent_ids
    )
    assert all(s.epoch == clean.layout.epoch for s in fleet.sealed.values())
    if crash_after in (Step.CHILDREN_CREATED, Step.PARENTS_SEALED):
        assert len(fleet.calls) > len(clean_fleet.calls)  # the second run redid steps, harmlessly
    # Cut right after the commit, nothing is pending: the watch learns the layout by its
    # own polling, and the next incarnation's recovery starts the children's actors.
    assert fleet.calls.count("announce") == (0 if crash_after == Step.COMMITTED else 1)


def test_a_second_operation_is_refused_while_one_is_pending_and_a_moved_layout_too() -> None:
    catalog, _, parts = setup({"a": {0, 1}})
    layout = catalog.require_topic(TOPIC).layout
    first = plan("split", layout, "req-1")
    with pytest.raises(Crash):
        asyncio.run(operations(parts, Step.CHILDREN_CREATED).run(first))
    second = plan("merge", layout, "req-2")
    with pytest.raises(OperationInProgressError, match="in progress"):
        asyncio.run(operations(parts, None).run(second))
    asyncio.run(operations(parts, None).carry_out(first))
    stale = plan("merge", layout, "req-3")  # planned on the layout before the split
    with pytest.raises(ConflictError, match="layout changed"):
        asyncio.run(operations(parts, None).run(stale))
    assert catalog.require_topic(TOPIC).pending_operation is None


def test_a_delete_cut_after_its_storage_went_is_finished_by_the_next_incarnation() -> None:
    """The controller dies with every segment and file of the topic gone and its record
    not yet: the record still says the delete is pending, and carrying it out again
    (destroying what is already gone is safe) removes the record."""
    catalog, fleet, parts = setup({"a": {0, 1}})
    op = PendingOperation(kind=OperationKind.DELETE, request_id="del-1", base_epoch=0)
    with pytest.raises(Crash):
        asyncio.run(operations(parts, Step.STORAGE_DELETED).run(op))
    assert catalog.require_topic(TOPIC).pending_operation == op
    asyncio.run(operations(parts, None).carry_out(op))
    assert catalog.topic(TOPIC) is None
    assert fleet.calls.count("delete incarnation") == 2 and fleet.calls[-1] == "announce"


def test_new_segments_get_the_replication_in_force_and_their_replicas_a_round_at_once() -> None:
    catalog, fleet, parts = setup({"a": {0, 1}}, 2)
    namespace = TOPIC.namespace_path
    catalog.set_namespace_policy(namespace, TopicPolicy.parse({"replication": {"factor": 3}}))
    asyncio.run(
        operations(parts, None).run(plan("split", catalog.require_topic(TOPIC).layout, "r"))
    )
    assert {fleet.copies[i] for i in (2, 3)} == {Replication(3, 2)}  # the namespace's default
    assert fleet.replicas.due.is_set()  # the keeper starts their replicas without a pause
    own = {"replication": {"factor": 5, "ackQuorum": 5}}
    catalog.update_topic(TOPIC, lambda r: r.model_copy(update={"policy": TopicPolicy.parse(own)}))
    merge = plan_merge(catalog.require_topic(TOPIC).layout, 2, 3, "m")
    asyncio.run(operations(parts, None).run(merge))
    assert fleet.copies[4] == Replication(5, 5)  # the topic's own part wins as a whole
