"""Transactions in a segment's log (``storage.segment_log``, ``storage.frames``): their
batches and markers on real files, what a reader of committed data gets, and that a
restart and a replica's copy keep both."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from runtime.batch import make_batch
from runtime.errors import InvalidArgumentError, SegmentTerminated, TransactionNotOpenError
from storage import frames
from storage.appends import Append, AppendResult
from storage.durability import Durability
from storage.segment_log import SegmentLog

FAST = Durability("none")


def put(log: SegmentLog, *values: str, txn: str | None = None, seq: int | None = None):  # noqa: ANN201
    """Append one batch of ``values``; its outcome (offsets, or the error refusing it)."""
    batch = make_batch([v.encode() for v in values])
    producer = "p" if seq is not None else None
    (outcome,) = log.append_all([Append(batch, producer, seq, txn_id=txn)])
    return outcome


def committed(log: SegmentLog, offset: int = 0, max_records: int = 1000) -> tuple[list[str], int]:
    batches, next_offset = log.read_committed(offset, max_records)
    values = [v.decode() for b in batches for v in b.records.column("value").to_pylist()]
    return values, next_offset


def test_a_transactions_batches_are_read_once_it_commits_and_skipped_once_it_aborts(
    tmp_path: Path,
) -> None:
    log = SegmentLog(tmp_path, durability=FAST)
    put(log, "a0")
    put(log, "t1-0", "t1-1", txn="txn-1")
    put(log, "b0")  # after an undecided transaction's first batch: waits with it
    put(log, "t2-0", txn="txn-2")
    assert (log.stable_end, committed(log)) == (1, (["a0"], 1))
    assert log.mark("txn-2", committed=False) == 5  # a marker takes an offset
    assert committed(log) == (["a0"], 1)  # txn-1 still holds everything after it
    assert log.mark("txn-1", committed=True) == 6
    assert log.stable_end == log.end_offset == 7
    assert committed(log) == (["a0", "t1-0", "t1-1", "b0"], 7)  # past the abort and markers
    assert committed(log, 4, 10) == ([], 7)  # only skipped things from there
    assert committed(log, 1, 2) == (["t1-0", "t1-1"], 3)
    assert [len(b.records) for b in log.read(0, 100)] == [1, 2, 1, 1]  # markers hold none


def test_a_decided_transaction_takes_no_more_batches_but_a_retry_is_answered(
    tmp_path: Path,
) -> None:
    log = SegmentLog(tmp_path, durability=FAST)
    assert put(log, "x", txn="txn-1", seq=0) == AppendResult(0, 1)
    log.mark("txn-1", committed=False)
    late = put(log, "y", txn="txn-1", seq=1)
    assert isinstance(late, TransactionNotOpenError) and "aborted" in str(late)
    assert put(log, "x", txn="txn-1", seq=0) == AppendResult(0, 1, duplicate=True)
    assert log.end_offset == 2


def test_markers_asked_again_are_answered_and_a_contradiction_refused(tmp_path: Path) -> None:
    log = SegmentLog(tmp_path, durability=FAST)
    put(log, "x", txn="txn-1")
    assert log.mark("txn-1", committed=True) == log.mark("txn-1", committed=True) == 1
    with pytest.raises(TransactionNotOpenError, match="already committed"):
        log.mark("txn-1", committed=False)
    assert log.mark("txn-9", committed=False) == 2  # joined, no message came: a marker still
    assert log.end_offset == 3


def test_a_restart_recovers_transactions_from_the_frames(tmp_path: Path) -> None:
    log = SegmentLog(tmp_path, durability=FAST)
    put(log, "t1", txn="txn-1")
    put(log, "t2", txn="txn-2")
    put(log, "plain")
    log.mark("txn-1", committed=True)
    log.close()
    again = SegmentLog(tmp_path, durability=FAST)
    assert again.stable_end == 1 and again.txn_fate("txn-1").committed
    assert committed(again) == (["t1"], 1)
    again.mark("txn-2", committed=False)
    assert committed(again) == (["t1", "plain"], 5)
    assert isinstance(put(again, "late", txn="txn-1"), TransactionNotOpenError)


def test_a_sealed_log_takes_markers_only(tmp_path: Path) -> None:
    log = SegmentLog(tmp_path, durability=FAST)
    put(log, "t1", txn="txn-1")
    log.terminate()
    assert isinstance(put(log, "more", txn="txn-1"), SegmentTerminated)
    assert log.mark("txn-1", committed=True) == 1
    log.close()
    again = SegmentLog(tmp_path, durability=FAST)
    assert again.terminated and committed(again) == (["t1"], 2)


def test_a_replica_copies_batches_and_markers_alike(tmp_path: Path) -> None:
    leader = SegmentLog(tmp_path / "leader", durability=FAST)
    follower = SegmentLog(tmp_path / "follower", durability=FAST)
    put(leader, "t1", txn="txn-1", seq=0)
    put(leader, "t2", txn="txn-2")
    leader.mark("txn-1", committed=True)
    follower.append_frames(leader.frames_from(0, 1 << 20))
    assert (follower.stable_end, committed(follower)) == (1, (["t1"], 1))
    leader.terminate()
    follower.terminate()
    end = follower.end_offset
    leader.mark("txn-2", committed=False)  # after the seal: its copy follows
    follower.append_frames(leader.frames_from(end, 1 << 20))
    assert committed(follower) == committed(leader) == (["t1"], 4)
    assert follower.last_sequence("p") == 0  # the producer's sequence came along


def test_transaction_ids_are_checked(tmp_path: Path) -> None:
    log = SegmentLog(tmp_path, durability=FAST)
    for bad in ("a/b", "", "x" * 200):
        assert isinstance(put(log, "v", txn=bad), InvalidArgumentError)
    assert log.end_offset == 0


@settings(max_examples=150, deadline=None)
@given(
    st.lists(st.tuples(st.sampled_from([None, "txn-a", "txn-b"]), st.booleans()), max_size=12),
    st.booleans(),
)
def test_frames_read_back_as_written(steps: list, committed_first: bool) -> None:
    """Every kind of frame decodes to the fields it was written with."""
    for txn, commit in steps:
        kind = frames.FRAME_BATCH if txn is None else frames.FRAME_TXN_BATCH
        frame = frames.Frame(kind, 7, 2, 99, "prod" if commit else None, 3 if commit else None, txn)
        header, payload, _ = frames.encode_frame(frame, b"payload")
        (decoded,) = frames.split_frames(header + payload, 7)
        assert decoded[2] == frame
    marker = frames.Frame(frames.FRAME_TXN_MARKER, 4, 1, 5, None, int(committed_first), "txn-a")
    header, payload, _ = frames.encode_frame(marker, b"")
    (decoded,) = frames.split_frames(header + payload, 4)
    assert decoded[2] == marker and decoded[2].committed is committed_first
