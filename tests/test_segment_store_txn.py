"""Transactions as a segment's readers and subscriptions see them (``SegmentStore``, real
files, no Ray): reads stop at the last stable offset and step over markers and aborted
records, which every subscription counts as acknowledged, so backlogs reach 0 and a
sealed segment drains; that holds for a subscription made later, after a seek, and
after a crash between a marker and the cursors' save."""

from __future__ import annotations

import time
from pathlib import Path

import pyarrow as pa
import pytest
from hypothesis import given
from hypothesis import strategies as st
from pyarrow.fs import LocalFileSystem

from clients._segment_reader import SegmentReader
from runtime.batch import STARTED_KEY, following, make_batch, with_following
from runtime.errors import UnavailableError
from storage.appends import Append, StoredBatch
from storage.cursors import Cursor
from storage.durability import Durability
from storage.log import to_delivery
from storage.segment_store import SegmentStore
from storage.tier import TieredSegment, offload
from tests.test_segment_store import NAME, open_store

FAST = Durability("none")


def put(store: SegmentStore, *values: str, txn: str | None = None) -> int:
    """Append one batch of ``values`` (of transaction ``txn``); its first offset."""
    batch = make_batch([v.encode() for v in values], keys=[v[0] for v in values])
    (outcome,) = store.append_all([Append(batch, None, None, txn_id=txn)])
    assert not isinstance(outcome, Exception), outcome
    return outcome.base_offset


def values(batch: pa.RecordBatch) -> list[str]:
    return [v.decode() for v in batch.column("value").to_pylist()]


def read_all(store: SegmentStore, offset: int = 0, step: int = 2) -> tuple[list[str], int]:
    """Everything a plain reader gets from ``offset``, ``step`` records per read, and
    where it ends up: each read starts where the one before said."""
    got: list[str] = []
    while offset < store.readable_end:
        batch = store.read(offset, step)
        nxt = following(batch, offset)
        assert nxt > offset, "a read that moves nowhere would be repeated forever"
        got, offset = got + values(batch), nxt
    return got, offset


def backlog(store: SegmentStore, subscription: str) -> int:
    return store.stats()["subscriptions"][subscription]["backlog"]


@pytest.fixture
def store(tmp_path: Path):
    opened = open_store(tmp_path)
    yield opened
    opened.close()


def test_readers_stop_at_an_open_transaction_and_get_only_committed_records(
    store: SegmentStore,
) -> None:
    store.create_subscription("s", "earliest", None)
    put(store, "a0")
    put(store, "t0", "t1", txn="keep")
    put(store, "b0")  # after an undecided transaction's first record: waits with it
    put(store, "x0", "x1", txn="drop")
    assert store.readable_end == 1
    assert read_all(store) == (["a0"], 1)
    assert store.mark("drop", committed=False) == 6
    assert store.readable_end == 1  # "keep" still holds everything after it
    assert store.mark("keep", committed=True) == 7
    assert store.readable_end == store.end_offset == 8
    assert read_all(store) == (["a0", "t0", "t1", "b0"], 8)
    assert read_all(store, offset=4) == ([], 8)  # only stepped-over records from there
    batch, nxt = store.read_share("s", 0, 100, (0, 1, 0))
    assert (values(batch), nxt) == (["a0", "t0", "t1", "b0"], 8)


def test_every_subscription_counts_what_no_reader_gets_as_acknowledged(
    store: SegmentStore,
) -> None:
    store.create_subscription("stream", "earliest", None)
    store.create_subscription("queue", "earliest", None)
    put(store, "a0")
    put(store, "x0", "x1", txn="drop")
    put(store, "t0", txn="keep")
    store.mark("drop", committed=False)
    store.mark("keep", committed=True)
    taken = store.queue_receive("queue", "c", 100)
    assert values(taken) == ["a0", "t0"]
    store.ack("queue", taken.column("offset").to_pylist())
    store.ack_cumulative("stream", 3)  # "t0", the last record it was given
    assert (backlog(store, "stream"), backlog(store, "queue")) == (0, 0)
    store.terminate(None)
    assert store.drained("stream") and store.drained("queue")
    store.create_subscription("later", "earliest", None)  # made after the markers
    assert backlog(store, "later") == 2
    store.ack("later", [0, 3])
    assert store.drained("later")
    store.seek("later", "earliest", None)  # a reset forgets acks, not what is hidden
    assert backlog(store, "later") == 2


def test_a_sealed_segment_with_an_open_transaction_drains_once_the_marker_comes(
    store: SegmentStore,
) -> None:
    store.create_subscription("s", "earliest", None)
    put(store, "a0")
    put(store, "x0", txn="late")
    store.terminate(None)  # a split sealed it while "late" was open
    store.ack_cumulative("s", 0)
    assert not store.sealed_for_readers and not store.drained("s")
    assert store.waits_at(1)  # a reader there waits for the marker
    store.mark("late", committed=False)
    assert store.sealed_for_readers and store.drained("s")


def test_latest_is_the_last_stable_offset(store: SegmentStore) -> None:
    put(store, "x0", txn="open")
    put(store, "b0")
    store.create_subscription("s", "latest", None)
    assert store.position("s") == 0  # the open transaction's records may yet commit
    store.create_subscription("reset", "earliest", None)
    assert store.seek("reset", "latest", None)["position"] == 0
    store.mark("open", committed=True)
    assert read_all(store, store.position("s")) == (["x0", "b0"], 3)


def test_a_crash_between_a_marker_and_the_cursors_save_is_made_good_on_opening(
    tmp_path: Path,
) -> None:
    store = open_store(tmp_path)
    store.create_subscription("s", "earliest", None)
    put(store, "a0")
    put(store, "x0", "x1", txn="drop")
    store.log.mark("drop", committed=False)  # the marker, but no cursor saved after it
    store.ack_cumulative("s", 0)
    assert backlog(store, "s") == 3
    store.close()
    reopened = SegmentStore(NAME, tmp_path, FAST, incarnation=store.incarnation)
    assert backlog(reopened, "s") == 0
    reopened.close()


def test_a_tiered_copy_reads_as_its_log_without_what_no_reader_gets(
    store: SegmentStore, tmp_path: Path
) -> None:
    """A sealed log whose transactions are all decided moves to the tier with its
    committed records only, and reads there exactly as it read locally: the same records
    and the same next offsets from every offset, hidden ones included."""
    put(store, "a0", "a1")
    put(store, "x0", "x1", txn="x")
    put(store, "b0")
    put(store, "y0", txn="y")
    put(store, "x2", txn="x")
    store.mark("x", committed=True)
    put(store, "c0")
    undecided = put(store, "z0", txn="z")  # sealed with it undecided: not yet
    store.terminate(None)
    filesystem, directory = LocalFileSystem(), str(tmp_path / "tier" / "0")
    with pytest.raises(UnavailableError, match="not decided yet"):
        offload(store.replica_log, filesystem, directory, segment_id=NAME.segment_id)  # type: ignore[arg-type]
    store.mark("y", committed=False)
    store.mark("z", committed=False)
    local = store.replica_log
    manifest = offload(local, filesystem, directory, segment_id=NAME.segment_id)  # type: ignore[arg-type]
    tiered = TieredSegment(filesystem, directory)
    assert manifest.records == 7  # a0 a1 x0 x1 b0 x2 c0
    assert tiered.hidden_ranges(0) == local.hidden_ranges(0) != []
    assert (tiered.stable_end, tiered.end_offset) == (local.stable_end, local.end_offset)
    for offset in range(local.end_offset + 1):
        for count in (1, 2, 5):
            want, want_next = local.read_committed(offset, count)
            got, got_next = tiered.read_committed(offset, count)
            assert to_delivery(got).equals(to_delivery(want)), (offset, count)
            assert got_next == want_next, (offset, count)
        assert tiered.publish_time_at(offset) == (
            None if any(s <= offset < e for s, e in local.hidden_ranges(0))
            else local.publish_time_at(offset)
        ), offset  # fmt: skip
    assert undecided in {o for s, e in tiered.hidden_ranges(0) for o in range(s, e)}


RANGES = st.lists(st.tuples(st.integers(0, 40), st.integers(0, 8)), max_size=8)


@given(mark=st.integers(0, 10), before=RANGES, ranges=RANGES)
def test_acknowledging_ranges_is_acknowledging_each_offset_in_them(
    mark: int, before: list[tuple[int, int]], ranges: list[tuple[int, int]]
) -> None:
    ranged, single = Cursor("s", mark), Cursor("s", mark)
    for cursor in (ranged, single):
        cursor.ack(o for start, length in before for o in range(start, start + length))
    offsets = [o for start, length in ranges for o in range(start, start + length)]
    changed = ranged.ack_ranges([(start, start + length) for start, length in ranges])
    assert changed == single.ack(offsets)
    assert ranged == single


def test_a_read_says_where_the_next_starts_only_when_it_stepped_over_records() -> None:
    batch = make_batch([b"a", b"b"])
    delivery = to_delivery([StoredBatch(3, 0, None, None, batch)])
    assert following(with_following(delivery, 3, 5), 3) == 5  # nothing stepped over
    assert with_following(delivery, 3, 5).schema.metadata is None
    stepped = with_following(delivery, 3, 9)
    assert following(stepped, 3) == 9
    assert following(stepped.slice(0, 1), 3) == 4  # a slice ends before the step
    empty = with_following(to_delivery([]), 6, 9)
    assert (empty.num_rows, following(empty, 6), following(to_delivery([]), 6)) == (0, 9, 6)


def test_a_read_says_where_it_started_only_when_retention_dropped_the_offset_asked(
    store: SegmentStore,
) -> None:
    """What tells Spark's source a record lost from one it was never to get: stepping
    over an aborted transaction is no loss, starting past what retention dropped is."""
    put(store, "a0", "a1", txn="t1")
    store.mark("t1", committed=False)  # offsets 0-1 aborted, 2 its marker
    put(store, "b3", "b4")
    stepped = store.read(0, 10)
    assert values(stepped) == ["b3", "b4"]
    assert STARTED_KEY.encode() not in (stepped.schema.metadata or {})
    put(store, "c5")
    assert store.retain(None, 1) > 0  # the head dropped: whole batches over 1 byte
    start = store.start_offset
    lost = store.read(0, 10)
    assert lost.schema.metadata[STARTED_KEY.encode()] == str(start).encode()
    assert STARTED_KEY.encode() not in (store.read(start, 10).schema.metadata or {})


def test_a_consumer_s_reader_carries_delivered_and_acknowledged_over_a_step() -> None:
    reader = SegmentReader(NAME, None, 0, None)
    reader.read_up_to(4, 4)  # records 0-3, nothing stepped over
    reader.read_up_to(4, 9)  # then only markers or aborted records up to 9
    assert (reader.position, reader.delivered, reader.acked) == (9, 0, 0)
    reader.delivered = 4  # the application took records 0-3
    reader.step_over()
    assert reader.delivered == 9
    reader.acked = 4
    reader.step_over()
    assert reader.acked == 9
    reader.read_up_to(9, 12)  # everything before it delivered and acknowledged already
    assert (reader.delivered, reader.acked) == (12, 12)


def test_a_message_acknowledged_in_a_transaction_outlasts_the_ack_timeout(
    tmp_path: Path,
) -> None:
    """Held for the transaction (Pulsar's pending ack): no ack time-out hands it to
    another consumer; its abort does, at once; its commit's acknowledgement ends it."""
    store = open_store(tmp_path / "held", ack_timeout_s=0.05)
    put(store, "a0", "a1")
    store.create_subscription("q", "earliest", None)
    assert store.queue_receive("q", "c1", 10).column("offset").to_pylist() == [0, 1]
    store.hold("q", [0], "t1", hold_s=30)
    store.hold("q", [1], "t2", hold_s=30)
    time.sleep(0.1)  # twice the ack time-out
    assert store.queue_receive("q", "c2", 10).num_rows == 0
    store.ack("q", [1])  # t2 committed
    assert store.release("q", "t2") == []
    assert store.release("q", "t1") == [0]  # t1 aborted: delivered again
    assert store.queue_receive("q", "c2", 10).column("offset").to_pylist() == [0]
    store.close()
