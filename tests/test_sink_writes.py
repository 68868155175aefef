"""Idempotent writes (``runtime.sink_writes.write_chunk``) with the cluster's real record
keeper (``actors.admin.stream_writes.CatalogLedger`` on a metadata store in memory) and
segments in memory, without Ray: while the topic splits and merges and the writer
crashes and replays at any step, every record is stored exactly once, in a segment
that owned its hash when it was stored, and no segment sees a sequence reused."""

from __future__ import annotations

import asyncio
from collections import defaultdict
from collections.abc import Callable

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from actors.admin.stream_writes import CatalogLedger
from runtime.batch import make_batch
from runtime.errors import SegmentTerminated
from runtime.layout import SegmentLayout
from runtime.names import MAX_HASH, TopicName
from runtime.sink_writes import EarlierChunkFailed, producer_id, routing_hashes, write_chunk
from storage.catalog import Catalog
from storage.metadata import MemoryKeyValue, MetadataStore
from storage.records import TopicRecord

TOPIC = TopicName("t", "ns", "orders")


class Crash(Exception):
    """The writer's process dies here."""


class Topic:
    """One topic's record in a metadata store in memory, and what its segments stored."""

    def __init__(self, segments: int) -> None:
        self.catalog = Catalog(store=MetadataStore(kv=MemoryKeyValue()))
        layout = SegmentLayout.initial(segments)
        record = TopicRecord(**layout.to_metadata().model_dump(), incarnation="i")
        self.catalog.create_topic(TOPIC, record)
        self.sequences: dict[int, dict[str, list[int]]] = defaultdict(lambda: defaultdict(list))
        self.rows: dict[int, list[int]] = defaultdict(list)
        self.before_append: Callable[[], None] = lambda: None

    @property
    def layout(self) -> SegmentLayout:
        return self.catalog.require_topic(TOPIC).layout

    def reshape(self, choice: int) -> None:
        """A split (even ``choice``) or a merge of neighbours (odd), committed."""
        layout = self.layout
        active = sorted(layout.active_segments.values(), key=lambda s: s.hash_range.start)
        if choice % 2 == 0 or len(active) == 1:
            target = active[choice // 2 % len(active)]
            if target.hash_range.width < 2:
                return
            after = layout.split_segment(target.segment_id)
        else:
            left = choice // 2 % (len(active) - 1)
            after = layout.merge_segments(active[left].segment_id, active[left + 1].segment_id)
        self.catalog.update_topic(TOPIC, lambda record: record.with_layout(after))

    def _id(self, segment: str) -> int:
        layout = self.layout
        return next(
            i for i, info in layout.all_segments.items() if str(info.name(TOPIC)) == segment
        )

    # --- runtime.sink_writes.Segments ------------------------------------------------

    async def last_sequence(self, segment: str, producer: str) -> int:
        return max(self.sequences[self._id(segment)][producer], default=-1)

    async def append(
        self, segment: str, batch: pa.RecordBatch, producer: str, sequence: int
    ) -> None:
        self.before_append()
        segment_id = self._id(segment)
        if not self.layout.get(segment_id).is_active:
            raise SegmentTerminated(f"{segment} is sealed")
        held = self.sequences[segment_id][producer]
        assert sequence > max(held, default=-1), "a sequence reused or reordered"
        held.append(sequence)
        self.rows[segment_id] += [int(v) for v in batch.column("value").to_pylist()]


def chunk(hashes: list[int]) -> tuple[pa.RecordBatch, np.ndarray]:
    """Records whose values are their positions, routed by the given hashes."""
    records = make_batch([str(i).encode() for i in range(len(hashes))])
    return records, np.array(hashes, dtype=np.int64)


async def write(topic: Topic, records: pa.RecordBatch, hashes: np.ndarray, batch: int = 0) -> dict:
    ledger = CatalogLedger(topic.catalog, topic, TOPIC, "q", 0, 0)
    return await write_chunk(ledger, topic, producer_id("q", 0, 0), batch, records, hashes)


@settings(max_examples=200, deadline=None)
@given(
    segments=st.integers(1, 4),
    hashes=st.lists(st.integers(0, MAX_HASH), min_size=1, max_size=30),
    actions=st.lists(st.tuples(st.sampled_from(["reshape", "crash", "go"]), st.integers(0, 50))),
)
def test_a_chunk_is_stored_once_whatever_the_layout_and_crashes_do(
    segments: int, hashes: list[int], actions: list[tuple[str, int]]
) -> None:
    topic = Topic(segments)
    records, routing = chunk(hashes)
    schedule = list(actions)

    def before_append() -> None:
        while schedule:
            action, choice = schedule.pop(0)
            if action == "reshape":
                topic.reshape(choice)
            elif action == "crash":
                raise Crash
            else:
                return

    topic.before_append = before_append
    while True:
        try:
            asyncio.run(write(topic, records, routing))
            break
        except Crash:
            continue  # the writer runs the chunk again
    placed = sorted(row for rows in topic.rows.values() for row in rows)
    assert placed == list(range(len(hashes)))
    layout = topic.layout
    for segment_id, rows in topic.rows.items():
        assert all(hashes[row] in layout.get(segment_id).hash_range for row in rows)
    again = asyncio.run(write(topic, records, routing))
    assert again == {"stored": 0, "duplicate": True}


def test_a_later_batch_replaces_the_record_and_an_older_one_is_a_duplicate() -> None:
    topic = Topic(2)
    records, routing = chunk([5, MAX_HASH - 5, 7])
    assert asyncio.run(write(topic, records, routing, batch=1)) == {"stored": 3, "duplicate": False}
    assert asyncio.run(write(topic, records, routing, batch=0)) == {"stored": 0, "duplicate": True}
    assert asyncio.run(write(topic, records, routing, batch=2)) == {"stored": 3, "duplicate": False}
    assert sorted(sum(topic.rows.values(), [])) == [0, 0, 1, 1, 2, 2]


def test_records_without_a_key_are_routed_alike_on_every_replay() -> None:
    keys = pa.array(["a", None, "b", None], type=pa.string())
    first, again = routing_hashes(keys, 3, 7), routing_hashes(keys, 3, 7)
    assert (first == again).all() and (first >= 0).all()
    assert (routing_hashes(keys, 3, 8)[[1, 3]] != first[[1, 3]]).any()


def test_a_record_from_a_writer_is_held_to_the_stored_one() -> None:
    """A replay that presents a record another attempt has replaced changes nothing."""
    from runtime.errors import BadVersion

    topic = Topic(1)
    records, routing = chunk([1, 2])
    ledger = CatalogLedger(topic.catalog, topic, TOPIC, "q", 0, 0)
    opened = asyncio.run(ledger.open(0, routing))
    assert opened.recorded is not None and not opened.resumed
    asyncio.run(ledger.finish(opened.recorded))
    with pytest.raises(BadVersion):
        asyncio.run(ledger.finish(opened.recorded))
    assert asyncio.run(ledger.open(0, routing)).recorded is None  # stored whole


def test_overlapped_chunks_reach_each_segment_in_order_and_a_failure_stops_the_next() -> None:
    """Chunk 1's record is opened while chunk 0's parts are still being appended, but its
    own appends wait for chunk 0's (``after``): every segment gets chunk 0 first, so
    per-key order holds across chunks. A chunk that fails stops the one after it."""
    records, routing = chunk([5, MAX_HASH - 5, 9, MAX_HASH - 9])

    class Segments:
        """The topic's segments; chunk 0's appends slower than chunk 1's, or failing."""

        def __init__(self, topic: Topic, fail: bool) -> None:
            self.topic, self.fail, self.arrivals = topic, fail, []

        async def last_sequence(self, segment: str, producer: str) -> int:
            return await self.topic.last_sequence(segment, producer)

        async def append(self, segment: str, batch: pa.RecordBatch, producer: str, seq: int):
            if producer.endswith(":0"):
                await asyncio.sleep(0.05)
                if self.fail:
                    raise ConnectionError("the segment went away")
            self.arrivals.append(producer)
            await self.topic.append(segment, batch, producer, seq)

    async def two_chunks(segments: Segments) -> list[object]:
        loop = asyncio.get_running_loop()
        first, second = loop.create_future(), loop.create_future()
        ledgers = [
            CatalogLedger(segments.topic.catalog, segments.topic, TOPIC, "q", 0, n) for n in (0, 1)
        ]
        writes = [
            write_chunk(ledgers[0], segments, producer_id("q", 0, 0), 0, records, routing,
                        appended=first),
            write_chunk(ledgers[1], segments, producer_id("q", 0, 1), 0, records, routing,
                        after=first, appended=second),
        ]  # fmt: skip
        results = await asyncio.gather(*writes, return_exceptions=True)
        assert second.done() and (second.exception() is None) == (first.exception() is None)
        return results

    ordered = Segments(Topic(2), fail=False)
    assert asyncio.run(two_chunks(ordered)) == [{"stored": 4, "duplicate": False}] * 2
    assert ordered.arrivals == [producer_id("q", 0, 0)] * 2 + [producer_id("q", 0, 1)] * 2
    failing = Segments(Topic(2), fail=True)
    results = asyncio.run(two_chunks(failing))
    assert isinstance(results[0], ConnectionError), results
    assert isinstance(results[1], EarlierChunkFailed), results
    assert failing.arrivals == []  # chunk 1 appended nothing ahead of chunk 0
