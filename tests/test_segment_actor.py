"""The segment actor on a real local Ray: crash recovery, termination, queues, long-poll, fencing.

Every test starts its own detached segment actor and kills it at the end, so
the 2-core CI machine never carries idle actors from earlier tests.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import os
import random
import signal
import threading
import time
from collections import Counter
from collections.abc import Iterator

import numpy as np
import pyarrow as pa
import pytest
import ray

from actors.segment.host import start_segment_actor
from clients._data_plane import ReadChannel
from runtime import wire
from runtime.batch import make_batch
from runtime.errors import SegmentTerminated, StaleEpochError
from runtime.names import SegmentName, TopicName
from storage.durability import Durability

SEGMENT_ID = 3


def segment_name(unique: str) -> SegmentName:
    return TopicName("test", "segments", f"t-{unique}").segment(SEGMENT_ID, 0, 0xFFFF)


@pytest.fixture
def make_actor(ray_cluster, unique: str) -> Iterator:
    """Start a fresh segment actor; kill every actor started by the test afterwards."""
    started = []

    def start(policy: str = "none") -> ray.actor.ActorHandle:
        handle = start_segment_actor(
            segment_name(f"{unique}-{len(started)}"),
            initialize=True,
            durability=Durability(policy=policy),  # type: ignore[arg-type]
        )
        started.append(handle)
        return handle

    yield start
    for handle in started:
        ray.kill(handle.host, no_restart=True)


def records(start: int, count: int) -> pa.RecordBatch:
    """Record ``n`` carries its own number in the key and (as 12 digits) in the value."""
    numbers = range(start, start + count)
    return make_batch([b"%012d" % n for n in numbers], keys=[str(n) for n in numbers])


def kill_process(handle: ray.actor.ActorHandle) -> int:
    """SIGKILL the actor's worker, as a machine crash would; Ray restarts it."""
    pid = ray.get(handle.ready.remote())["pid"]
    os.kill(pid, signal.SIGKILL)
    return pid


def read_all(handle: ray.actor.ActorHandle, end: int) -> pa.RecordBatch:
    batches, offset = [], 0
    while offset < end:
        batch = ray.get(handle.read.remote(offset, 20_000))
        assert batch.num_rows > 0, f"read at {offset} returned nothing, end is {end}"
        batches.append(batch)
        offset += batch.num_rows
    return pa.Table.from_batches(batches).combine_chunks().to_batches()[0]


def run_seed() -> int:
    """Random per run; set RAYTOPICS_TEST_SEED to replay a printed seed."""
    return int(os.environ.get("RAYTOPICS_TEST_SEED") or random.randrange(2**32))


def raised_by(ref: ray.ObjectRef, timeout: float = 10) -> BaseException:
    with pytest.raises(Exception) as caught:  # noqa: B017 - the type is checked by the caller
        ray.get(ref, timeout=timeout)
    return caught.value


# --- a. crash during pipelined appends -----------------------------------------------


def test_crash_during_pipelined_appends_loses_and_duplicates_nothing(make_actor) -> None:
    batches, per_batch, window = 100, 500, 8
    total = batches * per_batch
    seed = run_seed()
    print(f"crash test seed: {seed}")
    rng = random.Random(seed)
    kill_after = rng.randrange(3 * window, batches - window)  # the batch submitted last
    kill_delay = rng.uniform(0, 0.005)

    handle = make_actor("fsync")
    assert ray.get(handle.create_subscription.remote("s")) == 0
    payloads = [records(i * per_batch, per_batch) for i in range(batches)]
    old_pid = ray.get(handle.ready.remote())["pid"]

    results: list[tuple[int, int] | None] = [None] * batches
    in_flight: list[tuple[int, ray.ObjectRef]] = []
    acked, killed = -1, False
    for i, payload in enumerate(payloads):
        if i == kill_after - window:  # early enough for the pipeline to refill before the kill
            done = [r for r in results if r is not None]
            acked = rng.randrange(max(b + n for b, n in done))
            ray.get(handle.ack_cumulative.remote("s", acked))
        in_flight.append((i, handle.append.remote(payload, "producer-1", i)))
        if i >= kill_after and not killed:
            time.sleep(kill_delay)
            refs = [ref for _, ref in in_flight]
            _, unfinished = ray.wait(refs, num_returns=len(refs), timeout=0)
            if unfinished:
                os.kill(old_pid, signal.SIGKILL)
                print(f"killed after batch {i} with {len(unfinished)} appends unfinished")
                killed = True
            else:  # the window drained during the delay: kill right after the next batch
                kill_delay = 0.0
        if len(in_flight) >= window:
            j, ref = in_flight.pop(0)
            results[j] = ray.get(ref, timeout=60)
    for j, ref in in_flight:
        results[j] = ray.get(ref, timeout=60)
    assert killed, "the kill never landed while appends were in flight"

    info = ray.get(handle.ready.remote())
    assert info["pid"] != old_pid, "the actor was not restarted"
    assert info["endOffset"] == total
    # Retried appends were answered with their original offsets, never stored twice.
    assert results == [(i * per_batch, per_batch) for i in range(batches)]

    stored = read_all(handle, total)
    assert stored.num_rows == total
    assert stored.column("offset").equals(pa.array(np.arange(total, dtype=np.int64)))
    expected = records(0, total)
    assert stored.column("value").equals(expected.column("value"))
    assert stored.column("key").equals(expected.column("key"))
    position = ray.get(handle.position.remote("s"))
    assert position["position"] == acked + 1
    assert position["endOffset"] == total


# --- b. terminated segments refuse appends, also after a restart ---------------------------


def assert_terminated(err: BaseException) -> None:
    assert isinstance(err, SegmentTerminated), repr(err)
    assert err.segment_id == SEGMENT_ID


def test_terminated_segment_refuses_appends_before_and_after_restart(make_actor) -> None:
    handle = make_actor()
    assert ray.get(handle.append.remote(records(0, 5), "p", 0)) == (0, 5)
    assert ray.get(handle.terminate.remote()) == 5

    # Pipelined sequenced appends all fail fast with SegmentTerminated: none of
    # them may wait for a predecessor that the terminated segment refused.
    started = time.monotonic()
    refs = [handle.append.remote(records(5, 1), "p", seq) for seq in (1, 2, 3)]
    refs.append(handle.append.remote(records(5, 1)))
    for ref in refs:
        assert_terminated(raised_by(ref))
    assert time.monotonic() - started < 5

    old_pid = kill_process(handle)
    info = ray.get(handle.ready.remote(), timeout=60)
    assert info["pid"] != old_pid
    assert info["terminated"] and info["endOffset"] == 5
    for ref in (
        handle.append.remote(records(5, 1), "p", 1),
        handle.append.remote(records(5, 1), "q", 0),
        handle.append.remote(records(5, 1)),
    ):
        assert_terminated(raised_by(ref))
    assert ray.get(handle.read.remote(0, 100)).column("value").equals(records(0, 5).column("value"))


def test_appends_waiting_for_their_turn_fail_fast_when_terminated(make_actor) -> None:
    handle = make_actor()
    ray.get(handle.ready.remote())
    waiting = handle.append.remote(records(0, 1), "p", 1)  # sequence 0 has not come yet
    time.sleep(0.3)
    ray.get(handle.terminate.remote())
    assert_terminated(raised_by(waiting, timeout=5))


# --- c. queue dispatch with three consumers ---------------------------------------------


class QueueWire:
    """A queue consumer's two data-plane connections to a segment (takes on one, settles
    on the other, as ``QueueConsumer`` holds them), driven from one thread."""

    def __init__(self, handle: object, consumer: str) -> None:
        self.consumer = consumer
        self.loop = asyncio.new_event_loop()
        self.takes, self.settles = ReadChannel(handle), ReadChannel(handle)

    def take(self, max_records: int, wait_s: float = 0.0) -> pa.RecordBatch:
        request = wire.TakeRequest("q", self.consumer, max_records, wait_s)
        return self.loop.run_until_complete(self.takes.take(request))[0]

    def settle(self, kind: wire.Settle, offsets: list[int]) -> None:
        request = wire.SettleRequest(kind, "q", self.consumer, offsets)
        self.loop.run_until_complete(self.settles.settle(request))

    def close(self) -> None:
        self.takes.close()
        self.settles.close()
        self.loop.run_until_complete(asyncio.sleep(0))  # the transports' closing callbacks
        self.loop.close()


def test_queue_dispatch_three_consumers_every_offset_acked_exactly_once(make_actor) -> None:
    total, seed = 10_000, run_seed()
    print(f"queue test seed: {seed}")
    handle = make_actor()
    ray.get(handle.create_subscription.remote("q"))
    appends = [handle.append.remote(records(i * 1_000, 1_000), "p", i) for i in range(10)]
    assert ray.get(appends) == [(i * 1_000, 1_000) for i in range(10)]

    lock = threading.Lock()
    holder: dict[int, str] = {}  # offset -> the consumer holding it right now
    acks: Counter[int] = Counter()
    received: Counter[str] = Counter()
    failures: list[str] = []

    def consume(consumer: str, rng: random.Random) -> None:
        queue = QueueWire(handle, consumer)
        try:
            take_and_settle(queue, consumer, rng)
        finally:
            queue.close()

    def take_and_settle(queue: QueueWire, consumer: str, rng: random.Random) -> None:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not failures:
            with lock:
                if len(acks) == total:
                    return
            batch = queue.take(250, 0.2)
            offsets = batch.column("offset").to_pylist()
            values = batch.column("value").to_pylist()
            nack, ack = [], []
            with lock:
                for offset, value in zip(offsets, values, strict=True):
                    if value != b"%012d" % offset:
                        failures.append(f"{consumer} got value {value!r} at {offset}")
                    if offset in holder:
                        failures.append(f"{offset} given to {consumer}, {holder[offset]} has it")
                    if acks[offset]:
                        failures.append(f"{offset} redelivered to {consumer} after its ack")
                    holder[offset] = consumer
                    (nack if rng.random() < 0.05 else ack).append(offset)
                received[consumer] += len(offsets)
                for offset in nack:  # released before the nack is sent, so it may move on
                    del holder[offset]
            if nack:
                queue.settle(wire.Settle.NEGATIVE_ACK, nack)
            if ack:
                queue.settle(wire.Settle.ACK, ack)
                with lock:
                    for offset in ack:
                        acks[offset] += 1
                        del holder[offset]

    consumers = [
        threading.Thread(target=consume, args=(f"c{i}", random.Random(seed + i))) for i in range(3)
    ]
    for thread in consumers:
        thread.start()
    for thread in consumers:
        thread.join()

    assert not failures, failures[:10]
    assert set(acks) == set(range(total))
    assert max(acks.values()) == 1
    sub = ray.get(handle.stats.remote())["subscriptions"]["q"]
    assert sub["backlog"] == 0 and sub["inFlight"] == 0
    assert sub["markDelete"] == total
    assert sorted(received) == ["c0", "c1", "c2"]
    assert all(count >= total // 10 for count in received.values()), received
    print(f"deliveries per consumer: {dict(received)}")


def test_queue_long_poll_wakes_on_a_redelivery(make_actor) -> None:
    handle = make_actor()
    ray.get(handle.create_subscription.remote("q"))
    ray.get(handle.append.remote(records(0, 1)))
    a, b = QueueWire(handle, "a"), QueueWire(handle, "b")
    try:
        assert a.take(10).column("offset").to_pylist() == [0]
        started = time.monotonic()
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            waiting = pool.submit(b.take, 10, 5.0)
            time.sleep(0.3)
            assert not waiting.done()
            a.settle(wire.Settle.NEGATIVE_ACK, [0])
            assert waiting.result(timeout=10).column("offset").to_pylist() == [0]
        assert time.monotonic() - started < 2
    finally:
        a.close()
        b.close()


# --- d. long-poll read ---------------------------------------------------------------------


def test_long_poll_read_returns_as_soon_as_an_append_lands(make_actor) -> None:
    handle = make_actor()
    ray.get(handle.append.remote(records(0, 3)))
    end = ray.get(handle.ready.remote())["endOffset"]
    started = time.monotonic()
    waiting = handle.read.remote(end, 100, 10.0)  # far longer than any wake-up takes
    ready, _ = ray.wait([waiting], timeout=0.3)
    assert not ready, "the read returned before anything was appended"
    appended_at = time.monotonic()
    ray.get(handle.append.remote(records(3, 2)))
    batch = ray.get(waiting, timeout=15)
    returned_at = time.monotonic()
    assert batch.column("offset").to_pylist() == [3, 4]
    # Woken by the append, not by the 10 s timeout (generous for a loaded 2-core box).
    assert returned_at - appended_at < 3.0
    assert returned_at - started < 5.0


# --- e. fencing over Ray ---------------------------------------------------------------------


def test_stale_controller_epoch_is_refused(make_actor) -> None:
    handle = make_actor()
    assert ray.get(handle.terminate.remote(epoch=5)) == 0
    for ref in (
        handle.terminate.remote(epoch=4),
        handle.create_subscription.remote("s", "earliest", epoch=4),
        handle.delete.remote(epoch=4),
    ):
        err = raised_by(ref)
        assert isinstance(err, StaleEpochError), repr(err)
        assert err.code == "stale_epoch"
    assert ray.get(handle.create_subscription.remote("s", "earliest", epoch=5)) == 0
    assert ray.get(handle.stats.remote())["fenceEpoch"] == 5
