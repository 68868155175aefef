"""Transactions on a real Ray: the admin service as coordinator, segments that join a
transaction on its first batch and take its markers, readers that see committed
messages only, acknowledgements that apply on commit, and the sweeper that aborts a
transaction past its deadline. Messages are appended with the segments' own calls:
the producer's ``send(txn=...)`` is not built yet."""

from __future__ import annotations

import time

import pyarrow as pa
import pytest
import ray
from ray.exceptions import RayTaskError

from runtime.batch import following, make_batch
from runtime.errors import TransactionNotOpenError
from runtime.names import SegmentName, TopicName
from tests.segments import segment_actor


def segments_of(admin, topic: str) -> list[SegmentName]:  # noqa: ANN001
    name = TopicName.parse(topic)
    layout = admin.get_layout(topic)
    return [
        name.segment(s.segment_id, s.hash_range.start, s.hash_range.end)
        for s in layout.active_segments.values()
    ]


def append(segment: SegmentName, *values: str, txn: str | None = None) -> int:
    batch = make_batch([v.encode() for v in values])
    base, _ = ray.get(segment_actor(segment).append.remote(batch, txn_id=txn))
    return base


def read_all(segment: SegmentName) -> list[str]:
    """Everything readable in ``segment`` now, each read starting where the last said."""
    handle, offset, got = segment_actor(segment), 0, []
    while True:
        batch: pa.RecordBatch = ray.get(handle.read.remote(offset, 100))
        nxt = following(batch, offset)
        if nxt == offset:
            return got
        got += [v.decode() for v in batch.column("value").to_pylist()]
        offset = nxt


def backlog(admin, topic: str, subscription: str) -> int:  # noqa: ANN001
    return admin.get_stats(topic)["subscriptions"][subscription]["backlog"]


@pytest.fixture
def topic(admin, unique: str) -> str:  # noqa: ANN001
    name = f"topic://acme/txn/t{unique}"
    admin.create_scalable_topic(name, 2)
    admin.wait_until_ready(name, 60)
    admin.create_subscription(name, "s")
    return name


def test_a_transaction_s_messages_are_read_only_once_it_commits(admin, topic: str) -> None:  # noqa: ANN001
    first, second = segments_of(admin, topic)
    txn = admin.new_transaction(timeout_s=60)
    append(first, "plain-0")
    append(first, "t-0", "t-1", txn=txn.id)
    append(first, "plain-1")  # after the open transaction's first message: waits with it
    append(second, "t-2", txn=txn.id)
    assert read_all(first) == ["plain-0"] and read_all(second) == []
    assert admin.get_transaction(txn.id)["segments"] == sorted(map(str, (first, second)))
    assert txn.commit()["status"] == "committed"
    assert read_all(first) == ["plain-0", "t-0", "t-1", "plain-1"]
    assert read_all(second) == ["t-2"]
    with pytest.raises(RayTaskError) as refused:  # a committed transaction takes no more
        append(second, "late", txn=txn.id)
    assert isinstance(refused.value.cause, TransactionNotOpenError)


def test_an_aborted_transaction_leaves_nothing_to_read_and_no_backlog(admin, topic) -> None:  # noqa: ANN001
    first, _ = segments_of(admin, topic)
    with pytest.raises(RuntimeError), admin.new_transaction() as txn:
        append(first, "x-0", "x-1", txn=txn.id)
        raise RuntimeError("the application failed: the block aborts")
    assert admin.get_transaction(txn.id)["status"] == "aborted"
    append(first, "after")
    assert read_all(first) == ["after"]
    assert backlog(admin, topic, "s") == 1  # only "after": the rest counts as acknowledged


def test_acknowledgements_in_a_transaction_apply_only_when_it_commits(admin, topic) -> None:  # noqa: ANN001
    first, second = segments_of(admin, topic)
    append(first, "in-0", "in-1")
    dropped = admin.new_transaction()
    admin.transaction_acknowledge(dropped.id, str(first), "s", 1, cumulative=True)
    dropped.abort()
    assert backlog(admin, topic, "s") == 2
    with admin.new_transaction() as txn:
        admin.transaction_acknowledge(txn.id, str(first), "s", 1, cumulative=True)
        append(second, "out-0", txn=txn.id)
        assert backlog(admin, topic, "s") == 3  # "out-0" counts: it is written, as in Pulsar
    assert backlog(admin, topic, "s") == 1  # "in-*" acknowledged, "out-0" now readable


def test_a_transaction_past_its_deadline_is_aborted_by_the_sweeper(admin, topic) -> None:  # noqa: ANN001
    first, _ = segments_of(admin, topic)
    txn = admin.new_transaction(timeout_s=1)
    append(first, "slow", txn=txn.id)
    append(first, "waiting")
    deadline = time.monotonic() + 30
    while admin.get_transaction(txn.id)["status"] != "aborted":
        assert time.monotonic() < deadline, "the sweeper never aborted it"
        time.sleep(0.2)
    assert admin.get_transaction(txn.id)["reason"] == "timed out"
    assert read_all(first) == ["waiting"]
    with pytest.raises(TransactionNotOpenError):
        txn.commit()
