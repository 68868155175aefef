"""Transactions on a real Ray: the admin service as coordinator, segments that join a
transaction on its first batch and take its markers, readers that see committed
messages only, acknowledgements that apply on commit, the sweeper that aborts a
transaction past its deadline, and producers and consumers taking part."""

from __future__ import annotations

import threading
import time

import pyarrow as pa
import pytest
import ray
from ray.exceptions import RayTaskError

from clients import CheckpointConsumer, Producer, QueueConsumer, StreamConsumer
from runtime.batch import following, make_batch
from runtime.errors import TransactionConflictError, TransactionNotOpenError
from runtime.names import SegmentName, TopicName
from tests.segments import segment_actor
from tests.txn_support import commit_beside_an_abort


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


@pytest.mark.parametrize("transport", ["tcp", "ray"])
def test_a_producer_s_sends_in_a_transaction_are_read_together_once_it_commits(
    admin,
    topic: str,
    transport: str,  # noqa: ANN001
) -> None:
    with Producer(topic, transport=transport) as producer:
        kept = admin.new_transaction()
        dropped = admin.new_transaction()
        sent = [producer.send(f"k{i}:{i}".encode(), key=f"k{i}", txn=kept) for i in range(20)]
        producer.send_batch([b"k1:x", b"k2:x"], keys=["k1", "k2"], txn=dropped).result()
        producer.send(b"k0:plain", key="k0").result()  # waits behind "kept" in its segment
        for future in sent:
            future.result()
        assert "k0:plain" not in everything(admin, topic)
        dropped.abort()
        kept.commit()
    got = everything(admin, topic)
    assert sorted(got) == sorted([f"k{i}:{i}" for i in range(20)] + ["k0:plain"])
    assert got.index("k0:0") < got.index("k0:plain")  # a key's order holds


def test_consume_transform_produce_commits_the_output_and_the_acknowledgement_together(
    admin,
    topic: str,
    unique: str,  # noqa: ANN001
) -> None:
    output = f"topic://acme/txn/out{unique}"
    admin.create_scalable_topic(output, 2)
    admin.create_subscription(output, "s")
    with Producer(topic) as producer:
        for i in range(10):
            producer.send(f"{i}".encode(), key=f"k{i}")
    consumer = StreamConsumer(topic, "s", "c1")
    try:
        with Producer(output) as producer:
            for commit in (False, True):  # the first round aborts: nothing moves
                received = [consumer.receive(timeout=30) for _ in range(10)]
                assert all(received), "not every input arrived"
                txn = admin.new_transaction()
                for message in received:
                    doubled = str(2 * int(message.value)).encode()
                    producer.send(doubled, key=message.key, txn=txn)
                consumer.acknowledge_cumulative(received, txn=txn)
                if commit:
                    txn.commit()
                else:
                    txn.abort()
                    consumer.close()  # its messages come again, to the next consumer
                    consumer = StreamConsumer(topic, "s", "c2")
    finally:
        consumer.close()
    assert sorted(map(int, everything(admin, output))) == [2 * i for i in range(10)]
    assert backlog(admin, topic, "s") == 0


def everything(admin, topic: str) -> list[str]:  # noqa: ANN001
    """Every message of the topic readable now, segment after segment."""
    return [value for segment in segments_of(admin, topic) for value in read_all(segment)]


def test_a_split_and_a_merge_during_open_transactions_carry_them_through(
    admin,
    topic: str,  # noqa: ANN001
) -> None:
    kept, dropped = admin.new_transaction(), admin.new_transaction()
    sent: dict[str, list[int]] = {f"k{k}": [] for k in range(10)}
    with Producer(topic) as producer:

        def send(first: int, last: int) -> None:
            for i in range(first, last):
                key = f"k{i % 10}"
                producer.send(f"{key}:{i}".encode(), key=key, txn=kept)
                producer.send(f"{key}:-{i}".encode(), key=key, txn=dropped)
                sent[key].append(i)
            producer.flush()

        send(0, 50)
        children = admin.split_segment(topic, 0)["children"]  # sealed with both open
        send(50, 100)
        admin.merge_segments(topic, children[-1], 1)
        send(100, 150)
        dropped.abort()
        kept.commit()
    got: dict[str, list[int]] = {key: [] for key in sent}
    consumer = StreamConsumer(topic, "s", "c1")
    try:
        while sum(map(len, got.values())) < 150:
            message = consumer.receive(timeout=30)
            assert message is not None, f"only {sum(map(len, got.values()))} arrived"
            key, seq = message.value.decode().split(":")
            got[key].append(int(seq))
            consumer.acknowledge_cumulative(message)
        assert consumer.receive(timeout=1) is None
    finally:
        consumer.close()
    assert got == sent  # the committed messages, each once, each key in order; none aborted


def test_readers_throughout_see_exactly_the_committed_transactions_whole(
    admin,
    unique: str,  # noqa: ANN001
) -> None:
    """100 transactions of 50 messages over 3 topics and 8 segments, every other one
    aborted, while a consumer of each topic reads."""
    topics = [f"topic://acme/txn/many{n}{unique}" for n in range(3)]
    for topic, segments in zip(topics, (3, 3, 2), strict=True):
        admin.create_scalable_topic(topic, segments)
        admin.create_subscription(topic, "s")
    got: list[str] = []
    stop = threading.Event()

    def read(topic: str) -> None:
        consumer = StreamConsumer(topic, "s", "reader")
        try:
            while not stop.is_set():
                message = consumer.receive(timeout=0.5)
                if message is not None:
                    got.append(message.value.decode())
                    consumer.acknowledge_cumulative(message)
        finally:
            consumer.close()

    readers = [threading.Thread(target=read, args=(topic,)) for topic in topics]
    for reader in readers:
        reader.start()
    committed: set[str] = set()
    producers = [Producer(topic) for topic in topics]
    try:
        for t in range(100):
            txn = admin.new_transaction()
            values = [f"{t}:{j}" for j in range(50)]
            for j, value in enumerate(values):
                producers[j % 3].send(value.encode(), key=f"k{j % 7}", txn=txn)
            if t % 2:
                txn.abort()
            else:
                txn.commit()
                committed.update(values)
        deadline = time.monotonic() + 60
        while len(got) < len(committed) and time.monotonic() < deadline:
            time.sleep(0.2)
        time.sleep(1.0)  # anything more that would come
    finally:
        stop.set()
        for reader in readers:
            reader.join()
        for producer in producers:
            producer.close()
        for topic in topics:
            admin.delete_scalable_topic(topic)
    assert len(got) == len(set(got)) == len(committed) == 2500  # each once
    assert set(got) == committed  # every committed transaction whole, no aborted message


def test_ray_data_reads_only_committed_messages(admin, topic: str) -> None:  # noqa: ANN001
    """A snapshot's ranges step over an aborted transaction in their middle and at
    their end, and stop at an open one (``runtime.batch.following``)."""
    from clients.ray_data import read_topic_dataset

    still_open = admin.new_transaction()
    with Producer(topic) as producer:
        committed = commit_beside_an_abort(admin, producer, 40)
        producer.send(b"open-0", key="k0", txn=still_open).result()
    rows = read_topic_dataset(topic).take_all()
    assert sorted(row["value"].decode() for row in rows) == committed
    still_open.abort()


def receive_all(consumer, count: int, acknowledge: bool = True) -> list[str]:  # noqa: ANN001
    """``count`` messages (each acknowledged), then checks that nothing more comes."""
    got = []
    while len(got) < count:
        message = consumer.receive(timeout=30)
        assert message is not None, f"after {len(got)} of {count}: {sorted(got)}"
        got.append(message.value.decode())
        if acknowledge:
            consumer.acknowledge(message)
    assert consumer.receive(timeout=1) is None
    return sorted(got)


def test_queue_and_checkpoint_consumers_get_only_committed_messages(admin, topic) -> None:  # noqa: ANN001
    """A queue consumer and a checkpoint consumer step over an aborted transaction's
    records and the markers, and a subscription made afterwards has no backlog left."""
    admin.create_subscription(topic, "q")
    with Producer(topic) as producer:
        committed = commit_beside_an_abort(admin, producer, 20)
    queue = QueueConsumer(topic, "q")
    try:
        assert receive_all(queue, 40) == committed
    finally:
        queue.close()
    checkpoints = CheckpointConsumer(topic, "g", "c1")
    try:
        assert receive_all(checkpoints, 40, acknowledge=False) == committed
        reached = checkpoints.checkpoint()
    finally:
        checkpoints.close()
    resumed = CheckpointConsumer(topic, "g2", "c1", start=reached)
    try:
        assert resumed.receive(timeout=2) is None  # nothing again, no step over again
    finally:
        resumed.close()
    admin.create_subscription(topic, "later", position="earliest")
    assert backlog(admin, topic, "later") == 40


def test_a_queue_message_acknowledged_in_a_transaction_is_held_for_it(admin, topic) -> None:  # noqa: ANN001
    """Pulsar's pending ack: another transaction may not acknowledge the message too, an
    abort delivers it again at once (not after the ack time-out), and a commit takes it."""
    admin.create_subscription(topic, "q")
    with Producer(topic) as producer:
        producer.send(b"once", key="k").result(timeout=30)
    first, second = QueueConsumer(topic, "q"), QueueConsumer(topic, "q")
    try:
        message = first.receive(timeout=30)
        assert message is not None
        held, rival = admin.new_transaction(), admin.new_transaction()
        first.acknowledge(message, txn=held)
        with pytest.raises(TransactionConflictError, match=held.id):
            first.acknowledge(message, txn=rival)
        rival.abort()
        first.close()  # what it took comes back, but the message is the transaction's
        assert second.receive(timeout=2) is None  # held: handed to nobody
        held.abort()
        again = second.receive(timeout=20)
        assert again is not None and again.value == b"once"  # before the ack time-out (30 s)
        with admin.new_transaction() as taking:
            second.acknowledge(again, txn=taking)
        assert backlog(admin, topic, "q") == 0
    finally:
        first.close()
        second.close()


def test_a_process_outside_ray_runs_a_transaction_through_the_gateway(
    admin,
    topic: str,  # noqa: ANN001
) -> None:
    """``AdminHttpClient`` begins and commits; ``Producer(url=...)`` sends over the data
    plane with the transaction's id (``OP_TXN_APPEND``)."""
    from actors.gateway.server import start_gateway, stop_gateway
    from clients import AdminHttpClient
    from tests.ports import free_port

    port = free_port()
    url = start_gateway(port)
    try:
        with AdminHttpClient(url) as remote:
            with Producer(topic, url=url) as producer:
                aborted = remote.new_transaction(timeout_s=30)
                producer.send(b"never", key="k1", txn=aborted).result()
                aborted.abort()
                with remote.new_transaction(timeout_s=30) as txn:
                    for i in range(10):
                        producer.send(f"remote-{i}".encode(), key=f"k{i}", txn=txn)
            assert remote.get_transaction(txn.id)["status"] == "committed"
            assert remote.get_transaction(aborted.id)["status"] == "aborted"
    finally:
        stop_gateway(port)
    assert sorted(everything(admin, topic)) == sorted(f"remote-{i}" for i in range(10))
