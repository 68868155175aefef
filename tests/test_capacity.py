"""Admission by capacity, the pure part: what fits by memory and by CPU, and a refusal
that says why."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from runtime.capacity import (
    DEFAULT_SEGMENTS_PER_CPU,
    MEMORY_ENV,
    PER_CPU_ENV,
    NodeRoom,
    SegmentFootprint,
    admit,
)
from runtime.errors import InsufficientCapacityError, InvalidArgumentError

MIB = 1 << 20
SEGMENT = SegmentFootprint(96 * MIB)  # 16 segments per CPU


def by_memory(*free: float) -> list[NodeRoom]:
    """Nodes with ``free`` bytes each and CPUs to spare: memory is what binds."""
    return [NodeRoom(free_memory=f, cpus=1024, segments=0) for f in free]


def test_a_request_that_fits_is_admitted() -> None:
    admit("creating topic://a/b/c", 10, SEGMENT, by_memory(10 * 96 * MIB))
    admit("creating topic://a/b/c", 10, SEGMENT, by_memory(5 * 96 * MIB, 5 * 96 * MIB + 1))
    admit("merging 1 and 2 of topic://a/b/c", 0, SEGMENT, [])  # starts nothing new


def test_what_is_left_on_each_node_does_not_add_up() -> None:
    with pytest.raises(InsufficientCapacityError, match="2 nodes"):
        admit("splitting 0 of topic://a/b/c", 2, SEGMENT, by_memory(90 * MIB, 90 * MIB))


def test_a_node_holds_so_many_segments_per_cpu_whatever_its_memory() -> None:
    roomy = 1 << 40
    two_cores = NodeRoom(free_memory=roomy, cpus=2, segments=30)
    admit("creating topic://a/b/c", 2, SEGMENT, [two_cores])
    with pytest.raises(InsufficientCapacityError, match="2 more fit"):
        admit("creating topic://a/b/c", 3, SEGMENT, [two_cores])
    # segments being started with no node chosen yet take their room too
    with pytest.raises(InsufficientCapacityError, match="1 more fit"):
        admit("creating topic://a/b/c", 2, SEGMENT, [two_cores], starting=1)
    # a head that declares no CPUs to Ray still runs processes: counted as one CPU
    head = NodeRoom(free_memory=roomy, cpus=0, segments=0)
    assert SEGMENT.fitting([head]) == DEFAULT_SEGMENTS_PER_CPU


def test_a_request_that_does_not_fit_says_what_was_asked_needed_and_free() -> None:
    with pytest.raises(InsufficientCapacityError) as refused:
        admit("creating topic://a/b/c", 2566, SEGMENT, by_memory(16 * (1 << 30)))
    message = refused.value.message
    assert refused.value.code == "insufficient_capacity" and refused.value.http_status == 409
    for said in ("creating topic://a/b/c", "2566 new segment actors", "96 MiB each", "240.6 GiB",
                 "the 1 node", "16.0 GiB free", "170 more fit", MEMORY_ENV):  # fmt: skip
        assert said in message, message
    assert PER_CPU_ENV in message, message
    full = NodeRoom(free_memory=1 << 40, cpus=2, segments=32)
    with pytest.raises(InsufficientCapacityError) as refused:
        admit("splitting segment 3 of topic://a/b/c", 2, SEGMENT, [full, full])
    for said in ("the 2 nodes", "run 64 of the 64 segments their CPUs carry", "16 per CPU",
                 "0 more fit"):  # fmt: skip
        assert said in refused.value.message, refused.value.message


nodes = st.lists(
    st.builds(
        NodeRoom,
        free_memory=st.integers(-(1 << 30), 1 << 40),
        cpus=st.sampled_from([0, 0.5, 1, 2, 4, 64]),
        segments=st.integers(0, 200),
    ),
    max_size=8,
)


@given(st.integers(1, 10_000), nodes, st.integers(1, 4096), st.integers(1, 64), st.integers(0, 50))
def test_admitted_exactly_when_it_fits(
    asked: int, rooms: list[NodeRoom], megabytes: int, per_cpu: int, starting: int
) -> None:
    footprint = SegmentFootprint(megabytes * MIB, per_cpu)
    each = [
        min(
            max(0, int(r.free_memory) // footprint.memory_bytes),
            max(0, int(max(r.cpus, 1) * per_cpu) - r.segments),
        )
        for r in rooms
    ]
    fits = asked <= sum(each) - starting
    try:
        admit("x", asked, footprint, rooms, starting)
        assert fits
    except InsufficientCapacityError:
        assert not fits


def test_the_footprint_comes_from_the_environment(monkeypatch) -> None:
    monkeypatch.delenv(MEMORY_ENV, raising=False)
    monkeypatch.delenv(PER_CPU_ENV, raising=False)
    assert SegmentFootprint.from_env() == SegmentFootprint(96 * MIB, DEFAULT_SEGMENTS_PER_CPU)
    monkeypatch.setenv(MEMORY_ENV, "64")
    monkeypatch.setenv(PER_CPU_ENV, "4")
    assert SegmentFootprint.from_env() == SegmentFootprint(64 * MIB, 4)
    for env in (MEMORY_ENV, PER_CPU_ENV):
        for bad in ("0", "-3", "lots"):
            monkeypatch.setenv(env, bad)
            with pytest.raises(InvalidArgumentError, match=env):
                SegmentFootprint.from_env()
        monkeypatch.setenv(env, "8")
