"""SegmentStore without Ray: fencing, termination, subscriptions, queue dispatch, stats."""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

import pyarrow as pa
import pytest
from object_store import s3_server, s3_uri

from runtime.batch import DELIVERY_SCHEMA, make_batch
from runtime.errors import (
    InvalidArgumentError,
    SegmentNotFoundError,
    SegmentTerminated,
    StaleEpochError,
    SubscriptionNotFoundError,
)
from runtime.hashing import key_bucket
from runtime.names import SegmentName, TopicName
from storage.durability import Durability
from storage.metadata import MetadataStore
from storage.segment_stats import hibernated_stats
from storage.segment_store import SegmentStore
from storage.tier import TIERED_RECORD
from storage.tier_records import TierRecords
from storage.topic_storage import segment_directory

NAME: SegmentName = TopicName("acme", "prod", "orders").segment(7, 0x0000, 0x7FFF)
FAST = Durability("none")
INCARNATION = "20261125T000000Z-0123abcd"


def open_store(root: Path, **kwargs: object) -> SegmentStore:
    options = {"create": True, "incarnation": INCARNATION, **kwargs}
    return SegmentStore(NAME, root, FAST, **options)  # type: ignore[arg-type]


def batch_of(start: int, count: int) -> pa.RecordBatch:
    return make_batch(
        [f"v{i}".encode() for i in range(start, start + count)],
        keys=[f"k{i}" for i in range(start, start + count)],
    )


def values(batch: pa.RecordBatch) -> list[bytes]:
    return batch.column("value").to_pylist()


def offsets(batch: pa.RecordBatch) -> list[int]:
    return batch.column("offset").to_pylist()


@pytest.fixture
def store(tmp_path: Path):
    opened = open_store(tmp_path)
    yield opened
    opened.close()


# --- fencing ----------------------------------------------------------------------


def test_stale_epoch_is_refused_for_every_fenced_operation(tmp_path: Path) -> None:
    store = open_store(tmp_path)
    store.append(batch_of(0, 3), None, None)
    store.check_epoch(3)
    assert store.fence_epoch == 3
    with pytest.raises(StaleEpochError):
        store.terminate(2)
    with pytest.raises(StaleEpochError):
        store.create_subscription("s", "earliest", 2)
    with pytest.raises(StaleEpochError):
        store.delete_subscription("s", 2)
    with pytest.raises(StaleEpochError):
        store.delete(2)
    # Refused requests changed nothing.
    assert store.subscriptions() == []
    assert not store.log.terminated
    assert store.directory.exists()
    # The current epoch, a newer one, and unfenced (None) requests pass.
    assert store.create_subscription("s", "earliest", 3) == 0
    assert store.create_subscription("t", "latest", None) == 3
    store.check_epoch(4)
    assert store.fence_epoch == 4
    with pytest.raises(StaleEpochError) as caught:
        store.check_epoch(3)
    assert caught.value.code == "stale_epoch"
    store.close()


def test_fence_survives_reopen(tmp_path: Path) -> None:
    store = open_store(tmp_path)
    store.terminate(3)
    store.close()
    reopened = open_store(tmp_path)
    assert reopened.fence_epoch == 3
    assert reopened.stats()["fenceEpoch"] == 3
    for refused in (
        lambda: reopened.terminate(2),
        lambda: reopened.create_subscription("s", "earliest", 2),
        lambda: reopened.delete(2),
    ):
        with pytest.raises(StaleEpochError):
            refused()
    reopened.close()


# --- termination --------------------------------------------------------------------


def test_terminated_segment_refuses_appends_also_after_reopen(tmp_path: Path) -> None:
    store = open_store(tmp_path)
    store.append(batch_of(0, 4), "p", 0)
    assert store.terminate(1) == 4
    assert store.terminate(1) == 4  # idempotent
    with pytest.raises(SegmentTerminated) as caught:
        store.append(batch_of(4, 1), "p", 1)
    assert caught.value.segment_id == NAME.segment_id
    store.close()

    reopened = open_store(tmp_path)
    assert reopened.log.terminated
    for producer, sequence in (("p", 1), ("q", 0), (None, None)):
        with pytest.raises(SegmentTerminated) as caught:
            reopened.append(batch_of(4, 1), producer, sequence)
        assert caught.value.segment_id == NAME.segment_id
    # Still readable: termination seals, it does not delete.
    assert values(reopened.read(0, 100)) == [b"v0", b"v1", b"v2", b"v3"]
    assert reopened.stats()["terminated"] is True
    reopened.close()


# --- reads and subscriptions --------------------------------------------------------------


def test_read_returns_delivery_schema_with_offsets(store: SegmentStore) -> None:
    assert store.read(0, 10).schema.equals(DELIVERY_SCHEMA)
    assert store.read(0, 10).num_rows == 0
    store.append(batch_of(0, 3), None, None)
    store.append(batch_of(3, 4), None, None)
    got = store.read(2, 3)
    assert got.schema.equals(DELIVERY_SCHEMA)
    assert offsets(got) == [2, 3, 4]
    assert values(got) == [b"v2", b"v3", b"v4"]
    assert got.column("key").to_pylist() == ["k2", "k3", "k4"]
    assert got.column("publish_time").null_count == 0
    assert store.read(7, 10).num_rows == 0


def test_shares_read_their_buckets_skip_what_was_acknowledged_and_say_where_to_go_on(
    store: SegmentStore,
) -> None:
    """Two parts of a segment together read each record once; a reader resuming (a
    bucket's next owner) skips what the subscription acknowledged; records none of
    which were the part's still move its next read on."""
    store.create_subscription("s", "earliest", None)
    store.append(batch_of(0, 40), None, None)
    store.append(make_batch([b"no key"] * 4), None, None)  # offsets 40-43, keyless
    halves = [(0, 2, 4), (2, 4, 4)]
    read = [store.read_share("s", 0, 100, half) for half in halves]
    assert [following for _, following in read] == [44, 44]
    got = [offsets(batch) for batch, _ in read]
    assert sorted(got[0] + got[1]) == list(range(44)) and got[0] and got[1]
    assert [key_bucket(f"k{o}", 4, o) < 2 for o in got[0] if o < 40] == [True] * (
        len([o for o in got[0] if o < 40])
    )
    assert [o for o in got[0] if o >= 40] == [40, 41]  # keyless: by offset, one part each
    store.ack("s", got[0][:3])  # the first part acknowledged three, then moved on
    resumed, following = store.read_share("s", 0, 100, halves[0])
    assert offsets(resumed) == got[0][3:] and following == 44
    whole, _ = store.read_share("s", 0, 100, (0, 0, 0))
    assert offsets(whole) == [o for o in range(44) if o not in got[0][:3]]
    store.ack("s", got[1])  # the other part acknowledged all of its own
    small, following = store.read_share("s", 0, 2, halves[1])  # looked at two, none its
    assert offsets(small) == [] and following == min(got[0][3:]) + 2
    assert store.read_share("s", 44, 10, halves[0]) == (store.read(44, 1), 44)


def test_subscriptions_created_at_earliest_and_latest(store: SegmentStore) -> None:
    store.append(batch_of(0, 5), None, None)
    assert store.create_subscription("early", "earliest", None) == 0
    assert store.create_subscription("late", "latest", None) == 5
    store.append(batch_of(5, 2), None, None)
    # Idempotent: re-creating keeps the existing position, whatever position is asked.
    assert store.create_subscription("early", "latest", None) == 0
    assert store.position("early") == 0
    assert store.position("late") == 5
    assert store.subscriptions() == ["early", "late"]
    with pytest.raises(InvalidArgumentError):
        store.create_subscription("x", "middle", None)  # type: ignore[arg-type]
    store.delete_subscription("late", None)
    assert store.subscriptions() == ["early"]
    with pytest.raises(SubscriptionNotFoundError):
        store.position("late")


def test_stream_position_and_drained(tmp_path: Path) -> None:
    store = open_store(tmp_path)
    store.create_subscription("s", "earliest", None)
    store.append(batch_of(0, 10), None, None)
    assert store.position("s") == 0
    store.ack_cumulative("s", 3)
    assert store.position("s") == 4
    store.ack_cumulative("s", 1)  # backwards: ignored
    assert store.position("s") == 4
    store.ack("s", [5, 6])  # a hole at 4 keeps the position
    assert store.position("s") == 4
    store.ack("s", [4])
    assert store.position("s") == 7
    assert not store.drained("s")  # not terminated
    store.ack_cumulative("s", 9)
    assert store.position("s") == 10
    assert not store.drained("s")  # caught up, but more may come
    store.close()

    store = open_store(tmp_path)  # positions are durable
    assert store.position("s") == 10
    store.create_subscription("lagging", "earliest", None)
    store.terminate(None)
    assert store.drained("s")
    assert not store.drained("lagging")
    store.ack_cumulative("lagging", 9)
    assert store.drained("lagging")
    store.close()


def test_acks_saved_later_are_saved_by_a_close_and_never_after_a_delete(tmp_path: Path) -> None:
    store = open_store(tmp_path)
    store.create_subscription("s", "earliest", None)
    store.append(batch_of(0, 10), None, None)
    assert store.ack_cumulative("s", 5, save_later=True)
    assert store.position("s") == 6  # readers see it at once
    store.close()  # a hibernation or a replacement: what was owed is saved
    store = open_store(tmp_path)
    assert store.position("s") == 6
    store.ack_cumulative("s", 8, save_later=True)
    store.delete(None)
    store.save_acks()  # the saver running late: nothing is written back
    assert not store.directory.exists()


def test_ack_on_missing_subscription_is_not_found(store: SegmentStore) -> None:
    store.append(batch_of(0, 2), None, None)
    with pytest.raises(SubscriptionNotFoundError):
        store.ack_cumulative("nope", 0)
    with pytest.raises(SubscriptionNotFoundError):
        store.ack("nope", [0])
    with pytest.raises(SubscriptionNotFoundError):
        store.queue_receive("nope", "c", 10)


def test_an_offset_not_written_yet_cannot_be_acknowledged(store: SegmentStore) -> None:
    """A cursor moved past the end would skip what is written there next: a client that
    lies (or a stale one) is refused, and the cursor stays where it was."""
    store.create_subscription("s", "earliest", None)
    store.append(batch_of(0, 3), None, None)
    store.ack_cumulative("s", 0)
    for refused in (lambda: store.ack_cumulative("s", 3), lambda: store.ack("s", [1, 99])):
        with pytest.raises(InvalidArgumentError, match="not written yet"):
            refused()
    assert store.position("s") == 1
    store.ack("s", [1, 2])  # the last one written
    assert store.position("s") == 3
    store.append(batch_of(3, 2), None, None)
    assert store.read(store.position("s"), 10).num_rows == 2  # nothing skipped


# --- queue dispatch -------------------------------------------------------------------


def test_queue_receive_ack_and_negative_ack(store: SegmentStore) -> None:
    store.append(batch_of(0, 10), None, None)
    store.create_subscription("q", "earliest", None)
    first = store.queue_receive("q", "a", 4)
    second = store.queue_receive("q", "b", 4)
    assert offsets(first) == [0, 1, 2, 3]
    assert values(first) == [b"v0", b"v1", b"v2", b"v3"]
    assert offsets(second) == [4, 5, 6, 7]
    assert store.stats()["subscriptions"]["q"]["inFlight"] == 8

    store.ack("q", [0, 2, 3])
    store.negative_ack("q", [1], consumer="a")
    store.negative_ack("q", [4], consumer="a")  # b holds 4: a cannot give it away
    redelivered = store.queue_receive("q", "b", 10)
    assert offsets(redelivered) == [1, 8, 9]
    assert values(redelivered) == [b"v1", b"v8", b"v9"]
    assert store.queue_receive("q", "c", 10).num_rows == 0

    store.consumer_left("q", "b")  # b held 1, 4..9
    assert offsets(store.queue_receive("q", "c", 100)) == [1, 4, 5, 6, 7, 8, 9]
    store.ack("q", [1, 4, 5, 6, 7, 8, 9])
    sub = store.stats()["subscriptions"]["q"]
    assert sub == {"backlog": 0, "markDelete": 10, "inFlight": 0, "oldestUnackedMs": None}
    assert store.queue_receive("q", "a", 10).num_rows == 0
    store.append(batch_of(10, 2), None, None)
    assert offsets(store.queue_receive("q", "a", 10)) == [10, 11]


def test_queue_ack_timeout_redelivers(tmp_path: Path) -> None:
    store = open_store(tmp_path, ack_timeout_s=0.05)
    store.append(batch_of(0, 3), None, None)
    store.create_subscription("q", "earliest", None)
    assert offsets(store.queue_receive("q", "a", 10)) == [0, 1, 2]
    store.ack("q", [1])
    assert store.queue_receive("q", "b", 10).num_rows == 0
    time.sleep(0.1)
    assert offsets(store.queue_receive("q", "b", 10)) == [0, 2]
    store.close()


def test_queue_starts_after_stream_acks_and_redelivers_after_reopen(tmp_path: Path) -> None:
    store = open_store(tmp_path)
    store.append(batch_of(0, 6), None, None)
    store.create_subscription("q", "earliest", None)
    store.ack_cumulative("q", 1)
    store.ack("q", [3])
    assert offsets(store.queue_receive("q", "a", 10)) == [2, 4, 5]
    store.ack("q", [4])
    store.close()
    # In-flight state is not persisted: unacked messages come back after a restart.
    store = open_store(tmp_path)
    assert offsets(store.queue_receive("q", "b", 10)) == [2, 5]
    store.close()


# --- delete and stats -------------------------------------------------------------------


def test_delete_removes_everything(tmp_path: Path) -> None:
    store = open_store(tmp_path)
    store.append(batch_of(0, 3), None, None)
    store.create_subscription("s", "earliest", 1)
    directory = segment_directory(tmp_path, NAME, INCARNATION)
    assert store.directory == directory and directory.exists()
    store.delete(1)
    assert not directory.exists()
    for call in (
        lambda: store.append(batch_of(0, 1), None, None),
        lambda: store.read(0, 1),
        lambda: store.stats(),
        lambda: store.subscriptions(),
        lambda: store.terminate(1),
        lambda: store.create_subscription("t", "earliest", 1),
        lambda: store.queue_receive("s", "c", 1),
    ):
        with pytest.raises(SegmentNotFoundError):
            call()
    store.close()  # harmless after delete
    fresh = open_store(tmp_path)
    assert fresh.stats()["records"] == 0
    assert fresh.subscriptions() == []
    fresh.close()


def test_stats_keys_and_values(store: SegmentStore) -> None:
    store.append(batch_of(0, 5), "p", 0)
    store.create_subscription("s", "earliest", 2)
    store.ack_cumulative("s", 1)
    stats = store.stats()
    assert set(stats) == {
        "segment",
        "segmentId",
        "terminated",
        "startOffset",
        "endOffset",
        "stableEnd",
        "records",
        "sizeBytes",
        "lastPublishTimeMs",
        "sealedAtMs",
        "tiered",
        "fenceEpoch",
        "subscriptions",
    }
    assert (stats["sealedAtMs"], stats["tiered"], stats["stableEnd"]) == (None, False, 5)
    assert stats["segment"] == str(NAME)
    assert stats["segmentId"] == 7
    assert stats["terminated"] is False
    assert (stats["startOffset"], stats["endOffset"], stats["records"]) == (0, 5, 5)
    assert stats["sizeBytes"] > 0
    assert abs(stats["lastPublishTimeMs"] - time.time() * 1000) < 60_000
    assert stats["fenceEpoch"] == 2
    oldest = store.log.publish_time_at(2)  # the first unacknowledged record's time
    assert oldest is not None and oldest <= stats["lastPublishTimeMs"]
    assert stats["subscriptions"] == {
        "s": {"backlog": 3, "markDelete": 2, "oldestUnackedMs": oldest}
    }


# --- tiering -----------------------------------------------------------------------


@pytest.fixture
def records(ray_cluster, unique: str) -> TierRecords:
    """Tiered segments' records in the real metadata store (GCS KV), in a namespace of
    the test's own."""
    return TierRecords(MetadataStore(f"test-tier-{unique}"), NAME.topic, INCARNATION)


def test_a_sealed_segment_moves_to_the_tier_and_serves_from_there(
    tmp_path: Path, records: TierRecords
) -> None:
    """Copied and committed while the local log serves; then every local file goes and the
    tiered copy answers reads, cursors, producers' retries and a reopen from its record
    alone; deleting the segment deletes its tiered copy and its record."""
    store = open_store(tmp_path / "root", records=records)
    store.append(batch_of(0, 30), "p", 0)
    store.append(batch_of(30, 20), "p", 1)
    store.create_subscription("s", "earliest", 2)
    store.ack_cumulative("s", 10)
    with pytest.raises(InvalidArgumentError, match="not sealed"):
        store.copy_to_tier(f"file://{tmp_path / 'tier'}", "t/7")
    store.terminate(2)
    before = store.read(0, 100)
    uri, directory = f"file://{tmp_path / 'tier'}", str(tmp_path / "tier" / "t" / "7")
    tiered = store.copy_to_tier(uri, directory)
    assert not store.tiered and store.read(0, 100).equals(before)  # still the local log
    assert records.get(NAME.segment_id) is None
    store.use_tier(uri, tiered)
    local = segment_directory(tmp_path / "root", NAME, INCARNATION)
    assert store.tiered and not local.exists()
    assert store.read(0, 100).equals(before) and store.read(45, 100).num_rows == 5
    assert store.position("s") == 11 and not store.drained("s")
    store.ack_cumulative("s", 49)
    assert store.drained("s")
    assert records.get(NAME.segment_id).cursors["s"]["mark_delete"] == 50  # type: ignore[union-attr]
    assert store.append(batch_of(30, 20), "p", 1).base_offset == 30  # a retry: its offsets
    assert (store.log.last_sequence("p"), store.log.last_sequence("q")) == (1, -1)
    with pytest.raises(SegmentTerminated):
        store.append(batch_of(50, 1), "p", 2)
    assert store.terminate(2) == 50  # a resumed operation seals again
    store.check_epoch(3)
    stats = store.stats()
    assert (stats["tiered"], stats["records"], stats["terminated"]) == (True, 50, True)
    assert stats["sealedAtMs"] is not None and stats["fenceEpoch"] == 3
    store.close()

    # Another node: a storage root that never held the segment.
    reopened = open_store(tmp_path / "elsewhere", create=False, records=records)
    assert reopened.tiered and reopened.read(0, 100).equals(before)
    assert reopened.position("s") == 50 and reopened.fence_epoch == 3
    with pytest.raises(StaleEpochError):
        reopened.check_epoch(2)
    reopened.delete(3)
    assert records.get(NAME.segment_id) is None
    assert not Path(directory).exists() or not any(Path(directory).iterdir())


def test_a_hibernating_segment_s_stats_and_subscriptions_need_no_store(
    tmp_path: Path, records: TierRecords
) -> None:
    """What the controller sees and changes of a tiered segment with no actor: the same
    stats as the store gives; a subscription added or removed in the record is what an
    open store then serves; a controller older than the fence is refused."""
    store = open_store(tmp_path / "root", records=records)
    store.append(batch_of(0, 20), None, None)
    store.create_subscription("s", "earliest", 1)
    store.ack_cumulative("s", 4)
    store.terminate(1)
    uri, directory = f"file://{tmp_path / 'tier'}", str(tmp_path / "tier" / "h")
    store.use_tier(uri, store.copy_to_tier(uri, directory))
    record = records.get(NAME.segment_id)
    assert record is not None
    expected = {k: v for k, v in store.stats().items() if k != "hibernating"}
    assert expected["subscriptions"]["s"].pop("oldestUnackedMs") == store.log.publish_time_at(5)
    from_record = hibernated_stats(NAME, record)
    # without its file, a hibernating segment cannot tell when its record 5 was published
    assert from_record["subscriptions"]["s"].pop("oldestUnackedMs") is None
    assert from_record.pop("hibernating") is True and from_record == expected
    assert from_record["subscriptions"]["s"] == {"backlog": 15, "markDelete": 5}

    assert records.add_cursor(NAME.segment_id, "late", "earliest", 2)
    assert records.add_cursor(NAME.segment_id, "tail", "latest", 2)
    assert store.position("late") == 0 and store.position("tail") == 20  # found on a miss
    store.ack_cumulative("late", 9)
    assert records.add_cursor(NAME.segment_id, "late", "earliest", 2)  # kept as it is
    assert store.position("late") == 10
    assert records.delete_cursor(NAME.segment_id, "late", 2)
    with pytest.raises(SubscriptionNotFoundError):
        store.ack_cumulative("late", 12)  # deleted by the controller meanwhile
    with pytest.raises(StaleEpochError):
        records.add_cursor(NAME.segment_id, "x", "earliest", 1)
    assert not records.add_cursor(99, "x", "earliest", 2)  # not a tiered segment
    store.close()


def test_a_segment_moved_before_records_existed_is_recorded_when_opened(
    tmp_path: Path, records: TierRecords
) -> None:
    """Storage a previous version left: the local ``tiered.json`` and cursors become the
    record, and the local files go."""
    store = open_store(tmp_path / "root")  # no records: the previous version's way
    store.append(batch_of(0, 12), None, None)
    store.create_subscription("s", "earliest", 4)
    store.ack_cumulative("s", 2)
    store.terminate(4)
    uri, directory = f"file://{tmp_path / 'tier'}", str(tmp_path / "tier" / "old")
    store.copy_to_tier(uri, directory)
    store.close()
    local = segment_directory(tmp_path / "root", NAME, INCARNATION)
    (local / TIERED_RECORD).write_text(json.dumps({"uri": uri, "directory": directory}))
    shutil.rmtree(local / "log")
    reopened = open_store(tmp_path / "root", create=False, records=records)
    assert reopened.tiered and not local.exists()
    assert reopened.position("s") == 3 and reopened.fence_epoch == 4
    assert reopened.read(0, 100).num_rows == 12
    reopened.close()


def test_a_crash_on_either_side_of_the_switch_leaves_one_readable_copy(
    tmp_path: Path, records: TierRecords
) -> None:
    store = open_store(tmp_path / "root", records=records)
    store.append(batch_of(0, 40), None, None)
    store.terminate(1)
    before = store.read(0, 100)
    uri, directory = f"file://{tmp_path / 'tier'}", str(tmp_path / "tier" / "x")
    tiered = store.copy_to_tier(uri, directory)  # committed there, not yet recorded: a crash
    store.close()
    reopened = open_store(tmp_path / "root", create=False, records=records)
    assert not reopened.tiered and reopened.read(0, 100).equals(before)
    reopened.use_tier(uri, tiered)
    reopened.close()
    local = segment_directory(tmp_path / "root", NAME, INCARNATION)
    (local / "log").mkdir(parents=True)  # as if the crash came after the record, before removal
    again = open_store(tmp_path / "root", create=False, records=records)
    assert again.tiered and not local.exists()
    assert again.read(0, 100).equals(before)
    again.close()


def test_a_tiered_segment_is_deleted_even_while_its_object_store_is_down(
    tmp_path: Path, records: TierRecords
) -> None:
    """The deletion goes on, the objects stay (and the log says so)."""
    with s3_server() as endpoint:
        store = open_store(tmp_path / "root", records=records)
        store.append(batch_of(0, 10), None, None)
        store.terminate(1)
        uri = s3_uri(endpoint, "tier/down")
        store.use_tier(uri, store.copy_to_tier(uri, "tier/down/7"))
    store.delete(2)
    assert not segment_directory(tmp_path / "root", NAME, INCARNATION).exists()
    assert records.get(NAME.segment_id) is None
