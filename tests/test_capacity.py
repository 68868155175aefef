"""Admission by capacity, the pure part: what fits, and a refusal that says why."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from runtime.capacity import MEMORY_ENV, SegmentFootprint, admit
from runtime.errors import InsufficientCapacityError, InvalidArgumentError

MIB = 1 << 20
SEGMENT = SegmentFootprint(96 * MIB)


def test_a_request_that_fits_is_admitted() -> None:
    admit("creating topic://a/b/c", 10, SEGMENT, [10 * 96 * MIB])
    admit("creating topic://a/b/c", 10, SEGMENT, [5 * 96 * MIB, 5 * 96 * MIB + 1])
    admit("merging 1 and 2 of topic://a/b/c", 0, SEGMENT, [])  # starts nothing new


def test_what_is_left_on_each_node_does_not_add_up() -> None:
    with pytest.raises(InsufficientCapacityError, match="2 nodes"):
        admit("splitting 0 of topic://a/b/c", 2, SEGMENT, [90 * MIB, 90 * MIB])


def test_a_request_that_does_not_fit_says_what_was_asked_needed_and_free() -> None:
    with pytest.raises(InsufficientCapacityError) as refused:
        admit("creating topic://a/b/c", 2566, SEGMENT, [16 * (1 << 30)])
    message = refused.value.message
    assert refused.value.code == "insufficient_capacity" and refused.value.http_status == 409
    for said in ("creating topic://a/b/c", "2566 new segment actors", "96 MiB each", "240.6 GiB",
                 "the 1 node", "16.0 GiB free", "170 more fit", MEMORY_ENV):  # fmt: skip
        assert said in message, message


@given(
    st.integers(1, 10_000),
    st.lists(st.integers(-(1 << 30), 1 << 40), max_size=8),
    st.integers(1, 4096),
)
def test_admitted_exactly_when_it_fits(asked: int, free: list[int], megabytes: int) -> None:
    footprint = SegmentFootprint(megabytes * MIB)
    fits = asked <= sum(max(0, f) // footprint.memory_bytes for f in free)
    try:
        admit("x", asked, footprint, free)
        assert fits
    except InsufficientCapacityError:
        assert not fits


def test_the_footprint_comes_from_the_environment(monkeypatch) -> None:
    monkeypatch.delenv(MEMORY_ENV, raising=False)
    assert SegmentFootprint.from_env().memory_bytes == 96 * MIB
    monkeypatch.setenv(MEMORY_ENV, "64")
    assert SegmentFootprint.from_env().memory_bytes == 64 * MIB
    for bad in ("0", "-3", "lots"):
        monkeypatch.setenv(MEMORY_ENV, bad)
        with pytest.raises(InvalidArgumentError, match=MEMORY_ENV):
            SegmentFootprint.from_env()
