"""A segment log copied between replicas (``SegmentLog.frames_from``, ``append_frames``,
``truncate_tail``): a follower stores its leader's frames as they are, refuses a copy
that is not whole and in sequence, and cuts a tail its new leader never had."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from runtime.batch import make_batch
from runtime.errors import InvalidArgumentError, SegmentTerminated
from storage.durability import Durability
from storage.frames import FRAME_TERMINATION, Frame, encode_frame
from storage.segment_log import SegmentLog

FAST = Durability("none")


def log_at(directory: Path, chunk_bytes: int = 1500) -> SegmentLog:
    return SegmentLog(directory, durability=FAST, max_chunk_bytes=chunk_bytes)


def fill(log: SegmentLog, sizes: list[int], producer: str | None = "p1") -> None:
    for sequence, size in enumerate(sizes):
        values = [f"{log.end_offset + i:06d}".encode() * 4 for i in range(size)]
        batch = make_batch(values, keys=[f"k{i % 3}" for i in range(size)])
        log.append(batch, producer_id=producer, sequence=None if producer is None else sequence)


def copy(leader: SegmentLog, follower: SegmentLog, max_bytes: int = 700) -> None:
    while follower.end_offset < leader.end_offset:
        follower.append_frames(leader.frames_from(follower.end_offset, max_bytes))


def stored(log: SegmentLog) -> list[tuple]:
    return [
        (b.base_offset, b.publish_time_ms, b.producer_id, b.sequence, b.records.to_pylist())
        for b in log.read(log.start_offset, 1_000_000)
    ]


def test_a_follower_stores_its_leaders_batches_as_they_are(tmp_path: Path) -> None:
    leader, follower = log_at(tmp_path / "leader"), log_at(tmp_path / "follower", 4000)
    fill(leader, [3, 1, 5, 2, 4])
    fill(leader, [2, 2], producer=None)
    copy(leader, follower)
    assert follower.end_offset == leader.end_offset == 19
    assert stored(follower) == stored(leader)  # publish times and producers' sequences too
    # A producer's retry that reaches the follower after a failover is a duplicate there
    retry = follower.append(make_batch([b"again"]), producer_id="p1", sequence=2)
    assert retry.duplicate and (retry.base_offset, retry.count) == (4, 5)
    follower.close()
    assert stored(log_at(tmp_path / "follower", 4000)) == stored(leader)


def test_frames_are_sent_from_where_a_batch_begins_one_at_least(tmp_path: Path) -> None:
    leader = log_at(tmp_path / "leader", 1 << 20)
    fill(leader, [3, 3])
    assert len(leader.frames_from(0, 1)) < len(leader.frames_from(0, 1 << 20))  # one frame
    assert leader.frames_from(6, 1 << 20) == b""
    with pytest.raises(InvalidArgumentError, match="offset 1 does not begin a batch"):
        leader.frames_from(1, 1 << 20)


def test_a_copy_that_is_torn_corrupt_or_out_of_sequence_stores_nothing(tmp_path: Path) -> None:
    leader, follower = log_at(tmp_path / "leader", 1 << 20), log_at(tmp_path / "follower")
    fill(leader, [2, 2, 2])
    data = leader.frames_from(0, 1 << 20)
    flipped = bytearray(data)
    flipped[len(data) - 3] ^= 0x01
    for bad, why in [
        (bytes(flipped), "corrupt"),
        (data[:-5], "torn"),
        (leader.frames_from(2, 1 << 20), "out of sequence"),
    ]:
        with pytest.raises(InvalidArgumentError, match="torn, corrupt or out of sequence"):
            follower.append_frames(bad)
        assert follower.end_offset == 0, why
    seal = encode_frame(Frame(FRAME_TERMINATION, 0, 0, 1, None, None), b"")
    with pytest.raises(InvalidArgumentError, match="sealed with terminate"):
        follower.append_frames(seal[0] + bytes(seal[1]))
    follower.close()
    assert log_at(tmp_path / "follower").end_offset == 0
    sealed = log_at(tmp_path / "sealed")
    sealed.terminate()
    with pytest.raises(SegmentTerminated):
        sealed.append_frames(data)


def test_a_tail_is_cut_where_a_batch_begins_and_its_sequences_are_forgotten(
    tmp_path: Path,
) -> None:
    log = log_at(tmp_path / "log")
    fill(log, [4, 4, 4, 4, 4, 4])  # several chunks of 1,500 bytes
    before = stored(log)
    chunks = sorted(p.name for p in (tmp_path / "log").glob("*.log"))
    assert len(chunks) > 2
    with pytest.raises(InvalidArgumentError, match="offset 5 does not begin a batch"):
        log.truncate_tail(5)
    assert log.truncate_tail(99) == 0 and log.end_offset == 24
    assert chunks[:2] == ["00000000000000000000.log", "00000000000000000008.log"]
    assert log.truncate_tail(12) == 12  # inside the second chunk: the later ones go
    assert log.end_offset == 12 and stored(log) == before[:3]
    assert sorted(p.name for p in (tmp_path / "log").glob("*.log")) == chunks[:2]
    assert log.truncate_tail(8) == 4  # where a chunk begins: it stays, empty
    assert log.end_offset == 8 and stored(log) == before[:2]
    # The producer's third batch is gone, so its resend is stored, not a duplicate
    resent = log.append(make_batch([b"third again"]), producer_id="p1", sequence=2)
    assert not resent.duplicate and resent.base_offset == 8
    log.close()
    reopened = log_at(tmp_path / "log")
    assert reopened.end_offset == 9 and stored(reopened)[:2] == before[:2]
    reopened.terminate()
    with pytest.raises(SegmentTerminated):
        reopened.truncate_tail(4)


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    sizes=st.lists(st.integers(1, 6), min_size=1, max_size=12),
    copied=st.integers(0, 12),
    rewritten=st.lists(st.integers(1, 6), max_size=6),
    max_bytes=st.integers(1, 3000),
)
def test_a_follower_that_diverged_matches_its_leader_after_cutting_and_copying(
    tmp_path_factory: pytest.TempPathFactory,
    sizes: list[int],
    copied: int,
    rewritten: list[int],
    max_bytes: int,
) -> None:
    """The follower copies part of the old leader's log; the new leader (a copy of a
    prefix of it) writes batches of its own; the follower cuts back to what they share
    and copies the rest: both then hold the same batches."""
    where = tmp_path_factory.mktemp("replicas")
    old, new, follower = log_at(where / "old"), log_at(where / "new"), log_at(where / "follower")
    fill(old, sizes)
    shared = sum(sizes[: copied // 2])
    new.append_frames(old.frames_from(0, 1 << 30))
    new.truncate_tail(shared)
    fill(new, rewritten, producer="p2")
    kept = sum(sizes[:copied])
    if kept:
        while follower.end_offset < kept:
            follower.append_frames(old.frames_from(follower.end_offset, max_bytes))
    follower.truncate_tail(min(shared, follower.end_offset))
    copy(new, follower, max_bytes)
    assert stored(follower) == stored(new)
