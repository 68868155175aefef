"""A topic remembers its latest splits and merges by request id, so a caller's retry is
answered with what happened, even after other operations committed."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from runtime.errors import InvalidArgumentError
from runtime.layout import SegmentLayout
from runtime.operations import (
    REMEMBERED_OPERATIONS,
    CompletedOperation,
    checked_request_id,
    completed,
    find_completed,
    new_request_id,
    plan_split,
    remembered,
)
from storage.records import TopicRecord


def done(request_id: str, epoch: int = 1) -> CompletedOperation:
    return CompletedOperation(kind="split", request_id=request_id, parents=(0,), epoch=epoch)


@given(st.lists(st.sampled_from("abcdefgh"), max_size=3 * REMEMBERED_OPERATIONS))
def test_the_latest_operations_are_remembered_newest_first(ids: list[str]) -> None:
    memory: tuple[CompletedOperation, ...] = ()
    for epoch, request_id in enumerate(ids, 1):
        memory = remembered(memory, done(request_id, epoch))
    assert len(memory) == min(len(ids), REMEMBERED_OPERATIONS)
    kept = ids[-REMEMBERED_OPERATIONS:]
    for request_id in set(ids):
        found = find_completed(memory, request_id)
        if request_id in kept:
            last = len(ids) - ids[::-1].index(request_id)  # the epoch of its latest run
            assert found is not None and found.epoch == last
        else:
            assert found is None


def test_a_record_finds_a_retry_among_its_recent_operations_and_its_last_one() -> None:
    layout = SegmentLayout.initial(2)
    first = completed(plan_split(layout, 0, "first"), 1)
    second = done("second", 2)
    record = TopicRecord(
        **layout.to_metadata().model_dump(),
        incarnation="i",
        recent_operations=(first, second),
        last_operation=second,
    )
    assert record.completed_operation("first") == first
    assert record.completed_operation("second") == second
    assert record.completed_operation("third") is None
    older = TopicRecord(**layout.to_metadata().model_dump(), incarnation="i", last_operation=first)
    assert older.completed_operation("first") == first  # stored before recent_operations


def test_a_request_id_is_the_callers_or_a_fresh_one_and_a_bad_one_is_refused() -> None:
    assert checked_request_id("mine") == "mine"
    fresh = {checked_request_id(None) for _ in range(3)} | {new_request_id()}
    assert len(fresh) == 4 and all(len(rid) == 32 for rid in fresh)
    for bad in ("", "x" * 65, 7, b"id"):
        with pytest.raises(InvalidArgumentError):
            checked_request_id(bad)
