from __future__ import annotations

import contextlib
import os
import random
import shutil
import tempfile
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import storage.chunk_files as chunk_files_module
import storage.segment_log as segment_log_module
from runtime.batch import (
    BATCH_SCHEMA,
    DELIVERY_SCHEMA,
    VALUES_SCHEMA,
    deserialize_batch,
    make_batch,
    serialize_batch,
)
from runtime.errors import InvalidArgumentError, SegmentTerminated, UnavailableError
from storage import frames
from storage.appends import PRODUCER_WINDOW, Append, AppendResult, StoredBatch
from storage.durability import Durability, default_storage_root
from storage.segment_log import SegmentLog

FAST = Durability("none")
FIRST_CHUNK = "00000000000000000000.log"


def values_for(start: int, count: int, size: int = 20) -> list[bytes]:
    """Distinct, recognisable values: record ``i`` holds its own offset."""
    return [f"{offset:08d}".encode().ljust(size, b"v") for offset in range(start, start + count)]


def read_values(log: SegmentLog, offset: int, max_records: int) -> list[bytes]:
    return [v for b in log.read(offset, max_records) for v in b.records.column("value").to_pylist()]


def chunk_files(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.glob("*.log"))


# --- the batch contract ------------------------------------------------------------


def test_make_batch_from_lists_and_round_trip() -> None:
    batch = make_batch([b"a", b"bc"], keys=["k", None], properties=[{"h": "1"}, None])
    assert batch.schema.equals(BATCH_SCHEMA)
    decoded = deserialize_batch(serialize_batch(batch))
    assert decoded.equals(batch)
    assert decoded.column("properties").to_pylist() == [[("h", "1")], None]


@pytest.mark.parametrize("count", [1, 7, 1_000])
def test_a_batch_without_keys_and_properties_travels_as_its_values_alone(count: int) -> None:
    """Most batches have neither, and Arrow's IPC format keeps an absent column's
    offsets: 8 KB per 1,000 messages (8% of a batch of 100-byte values) on the wire,
    in the segment's checksum and write, and on disk. Decoded, the batch is whole."""
    batch = make_batch([b"v" * 100] * count)
    payload = serialize_batch(batch)
    decoded = deserialize_batch(payload)
    decoded.validate(full=True)
    assert decoded.schema.equals(BATCH_SCHEMA) and decoded.equals(batch)
    assert decoded.column("key").to_pylist() == [None] * count
    assert decoded.column("properties").to_pylist() == [None] * count
    assert deserialize_batch(payload, restore_absent=False).schema.equals(VALUES_SCHEMA)

    values = 100 * count + -(-4 * (count + 1) // 8) * 8  # the bytes and their offsets
    assert len(payload) - values < 600  # the rest: the IPC messages' metadata


@pytest.mark.parametrize(
    "columns",
    [{"keys": ["k", None]}, {"properties": [None, {"a": "b"}]}, {"keys": ["k", "l"]}],
)
def test_a_batch_with_keys_or_properties_keeps_every_column(columns: dict) -> None:
    batch = make_batch([b"x", b"y"], **columns)
    payload = serialize_batch(batch)
    assert deserialize_batch(payload).equals(batch)
    assert deserialize_batch(payload, restore_absent=False).equals(batch)


def test_both_forms_are_stored_and_read_back_whole(tmp_path) -> None:
    """A log holds both forms side by side (and batches stored before the values-only
    form existed); a read gives every batch in ``BATCH_SCHEMA``."""
    log = SegmentLog(tmp_path)
    bare = make_batch([b"a", b"b"])
    keyed = make_batch([b"c"], keys=["k"])
    wide = b"".join((bare.schema.serialize(), bare.serialize(), b"\xff\xff\xff\xff\0\0\0\0"))
    log.append(bare)
    log.append(keyed)
    log.append(bare, payload=wide)
    log.close()
    reopened = SegmentLog(tmp_path)
    read = reopened.read(0, 10)
    assert [stored.records.schema.equals(BATCH_SCHEMA) for stored in read] == [True] * 3
    assert [stored.records for stored in read] == [bare, keyed, bare]
    with pytest.raises(InvalidArgumentError, match="BATCH_SCHEMA"):
        reopened.append(pa.RecordBatch.from_pydict({"value": ["x"]}))  # strings: not ours


def test_our_batches_decode_without_parsing_the_schema(monkeypatch) -> None:
    """The fast path must hold for what a socket hands over (a memoryview of a
    bytearray) as well as for bytes; a batch of another schema takes the general
    reader."""
    batch = make_batch([bytes([200, i]) for i in range(5)], keys=["k"] * 5)
    foreign = pa.RecordBatch.from_pydict({"x": [1, 2]})
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, foreign.schema) as writer:
        writer.write_batch(foreign)
    foreign_payload = sink.getvalue().to_pybytes()

    def no_general_reader(*_args: object) -> None:
        raise AssertionError("the schema was parsed")

    publish_type = DELIVERY_SCHEMA.field("publish_time").type
    extra = [pa.array(range(5), pa.int64()), pa.array([1_000] * 5, publish_type)]
    delivery = pa.RecordBatch.from_arrays([*batch.columns, *extra], schema=DELIVERY_SCHEMA)
    monkeypatch.setattr(pa.ipc, "open_stream", no_general_reader)
    for each in (batch, delivery):  # what producers append, what segments answer reads with
        payload = serialize_batch(each)
        for form in (payload, memoryview(bytearray(payload))):
            assert deserialize_batch(form).equals(each)
    monkeypatch.undo()
    assert deserialize_batch(memoryview(bytearray(foreign_payload))).equals(foreign)


def test_serialized_batches_are_exactly_what_a_stream_writer_writes() -> None:
    """``serialize_batch`` skips the stream writer; its bytes must not differ from it,
    for sliced batches and for any schema (reads encode the delivery schema)."""
    batch = make_batch([b"x" * 30] * 20, keys=["k"] * 20, properties=[{"h": "1"}] * 20)
    delivery = pa.RecordBatch.from_pydict({"offset": [1, 2]})
    for each in (batch, batch.slice(3, 7), batch.slice(0, 0), delivery):
        sink = pa.BufferOutputStream()
        with pa.ipc.new_stream(sink, each.schema) as writer:
            writer.write_batch(each)
        assert serialize_batch(each) == sink.getvalue().to_pybytes()


def test_make_batch_arrow_and_numpy_inputs() -> None:
    values = pa.array([b"x", b"y"], type=pa.large_binary())
    keys = pa.array(["a", "b"], type=pa.large_string())
    batch = make_batch(values, keys=keys)
    assert batch.column("value").type == pa.binary()
    assert batch.column("key").to_pylist() == ["a", "b"]
    assert batch.column("properties").null_count == 2
    from_numpy = make_batch(np.array([b"x", b"y"], dtype=object))
    assert from_numpy.column("value").to_pylist() == [b"x", b"y"]


@pytest.mark.parametrize(
    ("values", "keys", "properties"),
    [
        (b"not a list", None, None),
        ([1, 2], None, None),
        (pa.array([1, 2]), None, None),
        ([b"a"], ["k1", "k2"], None),
        ([b"a"], [3], None),
        ([b"a"], None, [{"h": 1}]),
        ([b"a", b"b"], None, [None]),
    ],
)
def test_make_batch_rejects_bad_input(values: object, keys: object, properties: object) -> None:
    with pytest.raises(InvalidArgumentError):
        make_batch(values, keys=keys, properties=properties)  # type: ignore[arg-type]


# --- append and read ---------------------------------------------------------------


def test_a_log_says_when_its_files_were_removed_or_replaced_under_it(tmp_path: Path) -> None:
    """Writes to removed files still succeed: only a look at the paths tells a replica
    that it must be rebuilt."""
    for damage in ("directory", "old chunk", "active chunk replaced"):
        directory = tmp_path / damage.replace(" ", "-")
        log = SegmentLog(directory, durability=FAST, max_chunk_bytes=4096)
        for i in range(20):
            log.append(make_batch(values_for(i * 10, 10)))
        assert log.files_lost() is None
        chunks = [directory / name for name in chunk_files(directory)]
        assert len(chunks) > 1
        if damage == "directory":
            shutil.rmtree(directory)
        elif damage == "old chunk":
            chunks[0].unlink()
        else:
            chunks[-1].unlink()
            chunks[-1].write_bytes(b"")
        assert log.files_lost() is not None, damage
        log.append(make_batch(values_for(200, 1)))  # unnoticed by the write itself
        log.close()
        assert log.files_lost() is None  # a closed log holds nothing to lose


def test_round_trip_across_chunk_rollovers(tmp_path: Path) -> None:
    log = SegmentLog(tmp_path, durability=FAST, max_chunk_bytes=4096)
    expected: list[bytes] = []
    rng = random.Random(7)
    for _ in range(60):
        count = rng.randint(1, 40)
        result = log.append(make_batch(values_for(len(expected), count)))
        assert result == AppendResult(len(expected), count, duplicate=False)
        expected += values_for(len(expected), count)
    assert log.end_offset == len(expected)
    assert len(chunk_files(tmp_path)) > 5
    for _ in range(100):
        offset = rng.randrange(len(expected) + 5)
        max_records = rng.randint(1, 150)
        assert read_values(log, offset, max_records) == expected[offset : offset + max_records]
    log.close()

    reopened = SegmentLog(tmp_path, durability=FAST, max_chunk_bytes=4096)
    assert reopened.end_offset == len(expected)
    assert read_values(reopened, 0, len(expected)) == expected
    assert reopened.size_bytes == sum(p.stat().st_size for p in tmp_path.glob("*.log"))
    reopened.close()


def crc32c_reference(data: bytes) -> int:
    """CRC-32C bit by bit (reflected polynomial 0x82F63B78), independent of any library."""
    crc = 0xFFFFFFFF
    for byte in data:
        crc ^= byte
        for _ in range(8):
            crc = (crc >> 1) ^ (0x82F63B78 & -(crc & 1))
    return crc ^ 0xFFFFFFFF


def test_frames_carry_the_documented_crc32c(tmp_path: Path) -> None:
    """The checksum on disk is CRC-32C of everything after it, as the module docstring
    says, whichever library computes it: logs written by an earlier build (another
    CRC library) must stay readable."""
    assert crc32c_reference(b"123456789") == 0xE3069283  # the standard check value
    log = SegmentLog(tmp_path, durability=FAST)
    log.append(make_batch(values_for(0, 3)), producer_id="p-1", sequence=0)
    log.close()
    data = (tmp_path / FIRST_CHUNK).read_bytes()
    prefix, body = frames.PREFIX, frames.BODY
    magic, crc = prefix.unpack_from(data)
    _, payload_length, *_, producer_length = body.unpack_from(data, prefix.size)
    end = prefix.size + body.size + producer_length + payload_length
    assert magic == frames.MAGIC
    assert crc == crc32c_reference(data[prefix.size : end])


def allocated(path: Path) -> int:
    return path.stat().st_blocks * 512


def test_chunks_reserve_blocks_ahead_and_give_back_the_rest(tmp_path: Path) -> None:
    """Appends go into preallocated blocks (no delayed allocation per write); a chunk
    that rolls over, a terminated log and a closed one keep only what they hold."""
    step = chunk_files_module._PREALLOCATE_BYTES
    log = SegmentLog(tmp_path / "a", durability=FAST, max_chunk_bytes=4 * step)
    log.append(make_batch(values_for(0, 100)))
    first = tmp_path / "a" / FIRST_CHUNK
    assert first.stat().st_size < 10_000 and allocated(first) >= step  # size: only the data
    log.close()
    assert allocated(first) < 64 << 10
    reopened = SegmentLog(tmp_path / "a", durability=FAST, max_chunk_bytes=4 * step)
    assert read_values(reopened, 0, 1000) == values_for(0, 100)
    reopened.terminate()
    assert allocated(first) < 64 << 10
    reopened.close()

    rolling = SegmentLog(tmp_path / "b", durability=FAST, max_chunk_bytes=200_000)
    for start in range(0, 4000, 100):
        rolling.append(make_batch(values_for(start, 100, size=200)))
    *full, active = sorted((tmp_path / "b").glob("*.log"))
    assert full and all(allocated(path) < path.stat().st_size + (64 << 10) for path in full)
    assert allocated(active) >= 200_000  # reserved up to the planned chunk size, no more
    assert allocated(active) < 200_000 + (64 << 10)
    rolling.close()


def test_appends_work_where_blocks_cannot_be_reserved(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[int] = []
    monkeypatch.setattr(chunk_files_module, "preallocate", lambda *args: calls.append(1) and False)
    log = SegmentLog(tmp_path, durability=FAST)
    for start in range(0, 500, 100):
        log.append(make_batch(values_for(start, 100)))
    assert read_values(log, 0, 1000) == values_for(0, 500)
    assert calls == [1]  # asked once, then never again
    log.close()


def test_read_slices_batches_and_keeps_metadata(tmp_path: Path) -> None:
    log = SegmentLog(tmp_path, durability=FAST)
    log.append(make_batch(values_for(0, 10)), producer_id="p", sequence=0)
    log.append(make_batch(values_for(10, 10)))
    batches = log.read(7, 5)
    assert [(b.base_offset, b.records.num_rows) for b in batches] == [(7, 3), (10, 2)]
    assert isinstance(batches[0], StoredBatch)
    assert (batches[0].producer_id, batches[0].sequence) == ("p", 0)
    assert (batches[1].producer_id, batches[1].sequence) == (None, None)
    assert batches[0].publish_time_ms <= batches[1].publish_time_ms == log.last_publish_time_ms
    assert log.read(20, 10) == []
    with pytest.raises(InvalidArgumentError):
        log.read(0, 0)
    log.close()


def test_refuses_empty_and_foreign_batches(tmp_path: Path) -> None:
    log = SegmentLog(tmp_path, durability=FAST)
    with pytest.raises(InvalidArgumentError):
        log.append(make_batch([]))
    with pytest.raises(InvalidArgumentError):
        log.append(pa.record_batch([pa.array([1])], names=["value"]))
    assert log.end_offset == 0
    log.close()


@contextlib.contextmanager
def repeated_in_a_thread(step: Callable[[], None]) -> Iterator[list[Exception]]:
    """Run ``step`` over and over in another thread for the duration of the block; the
    yielded list holds what it raised, for the main thread to assert on."""
    errors: list[Exception] = []
    done = threading.Event()

    def loop() -> None:
        try:
            while not done.is_set():
                step()
        except Exception as exc:  # surfaced through the main thread's assert
            errors.append(exc)

    thread = threading.Thread(target=loop)
    thread.start()
    try:
        yield errors
    finally:
        done.set()
        thread.join()


def test_reads_run_concurrently_with_appends(tmp_path: Path) -> None:
    log = SegmentLog(tmp_path, durability=FAST, max_chunk_bytes=8192)

    def read_all() -> None:
        end = log.end_offset
        values = read_values(log, 0, 10_000)
        assert len(values) >= end
        assert values == values_for(0, len(values))

    with repeated_in_a_thread(read_all) as errors:
        for start in range(0, 2000, 20):
            log.append(make_batch(values_for(start, 20)))
    assert errors == []
    log.close()


# --- crash recovery ----------------------------------------------------------------


def build_single_chunk_log(directory: Path) -> tuple[list[int], list[pa.RecordBatch]]:
    """~30 batches of varied sizes; returns the byte position after each frame."""
    rng = random.Random(1234)
    log = SegmentLog(directory, durability=FAST)
    ends: list[int] = []
    batches: list[pa.RecordBatch] = []
    for number in range(30):
        count = rng.randint(1, 25)
        size = rng.randint(1, 300)
        producer = f"producer-{number % 3}" if number % 2 else None
        batch = make_batch(
            values_for(log.end_offset, count, size),
            keys=[f"k{i}" for i in range(count)],
            properties=[{"n": str(number)}] * count,
        )
        log.append(batch, producer_id=producer, sequence=number if producer else None)
        ends.append(log.size_bytes)
        batches.append(batch)
    log.close()
    assert chunk_files(directory) == [FIRST_CHUNK]
    return ends, batches


def all_records(log: SegmentLog) -> pa.Table:
    stored = log.read(log.start_offset, max(log.end_offset, 1))
    return pa.Table.from_batches([b.records for b in stored], schema=BATCH_SCHEMA)


def descriptors_into(directory: Path) -> list[str]:
    """This process's open descriptors on files under `directory`: other tests'
    threads in the same worker open and close their own meanwhile, so a count of
    every descriptor is no measure."""
    found = []
    for fd in Path("/proc/self/fd").iterdir():
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        if target.startswith(str(directory)):
            found.append(target)
    return found


def test_background_sync_runs_beside_appends_and_chunk_rolls(tmp_path: Path) -> None:
    """Interval syncs from another thread, while appends roll chunks: nothing is lost,
    and every descriptor a sync duplicated (or a roll left for it) is closed again."""
    log = SegmentLog(
        tmp_path,
        durability=Durability("interval", 0.001),
        max_chunk_bytes=8192,
        background_sync=True,
    )
    with repeated_in_a_thread(log.sync) as errors:
        for start in range(0, 2000, 20):
            log.append(make_batch(values_for(start, 20)))
    assert errors == []
    assert len(chunk_files(tmp_path)) > 5
    assert descriptors_into(tmp_path)
    log.close()
    assert descriptors_into(tmp_path) == []
    reopened = SegmentLog(tmp_path, durability=FAST)
    assert read_values(reopened, 0, 10_000) == values_for(0, 2000)
    reopened.close()


def test_torn_tail_at_random_positions_recovers_complete_batches(tmp_path: Path) -> None:
    ends, batches = build_single_chunk_log(tmp_path / "original")
    original = (tmp_path / "original" / FIRST_CHUNK).read_bytes()
    assert len(original) == ends[-1]
    seed = 20240611
    print(f"torn-tail seed: {seed}")
    rng = random.Random(seed)
    cuts = [rng.randrange(len(original) + 1) for _ in range(200)]
    for number, cut in enumerate(cuts):
        directory = tmp_path / f"cut-{number}"
        directory.mkdir()
        (directory / FIRST_CHUNK).write_bytes(original[:cut])
        complete = sum(1 for end in ends if end <= cut)
        expected = pa.Table.from_batches(batches[:complete], schema=BATCH_SCHEMA)

        log = SegmentLog(directory, durability=FAST)
        assert all_records(log).equals(expected), f"cut at byte {cut}"
        assert log.end_offset == expected.num_rows
        assert log.size_bytes == (ends[complete - 1] if complete else 0)
        result = log.append(make_batch([b"after the crash"]))
        assert result.base_offset == expected.num_rows
        log.close()
        reopened = SegmentLog(directory, durability=FAST)
        assert reopened.end_offset == expected.num_rows + 1
        assert read_values(reopened, result.base_offset, 10) == [b"after the crash"]
        assert all_records(reopened).slice(0, expected.num_rows).equals(expected)
        reopened.close()
        shutil.rmtree(directory)


def test_corrupt_byte_in_last_frame_drops_only_that_frame(tmp_path: Path) -> None:
    ends, batches = build_single_chunk_log(tmp_path)
    path = tmp_path / FIRST_CHUNK
    data = bytearray(path.read_bytes())
    data[(ends[-2] + ends[-1]) // 2] ^= 0xFF
    path.write_bytes(bytes(data))

    log = SegmentLog(tmp_path, durability=FAST)
    assert all_records(log).equals(pa.Table.from_batches(batches[:-1], schema=BATCH_SCHEMA))
    assert path.stat().st_size == ends[-2]
    log.close()


def test_corruption_before_the_last_chunk_refuses_to_open(tmp_path: Path) -> None:
    log = SegmentLog(tmp_path, durability=FAST, max_chunk_bytes=2048)
    for start in range(0, 200, 10):
        log.append(make_batch(values_for(start, 10)))
    log.close()
    first = tmp_path / FIRST_CHUNK
    data = bytearray(first.read_bytes())
    data[len(data) // 2] ^= 0x01
    first.write_bytes(bytes(data))
    with pytest.raises(UnavailableError, match="corrupt"):
        SegmentLog(tmp_path, durability=FAST, max_chunk_bytes=2048)


# --- idempotent producers ----------------------------------------------------------


def test_duplicate_sequence_returns_original_result(tmp_path: Path) -> None:
    log = SegmentLog(tmp_path, durability=FAST)
    first = log.append(make_batch(values_for(0, 5)), producer_id="p", sequence=0)
    second = log.append(make_batch(values_for(5, 3)), producer_id="p", sequence=1)
    size = log.size_bytes
    retry = log.append(make_batch(values_for(0, 5)), producer_id="p", sequence=0)
    assert retry == AppendResult(first.base_offset, first.count, duplicate=True)
    assert log.size_bytes == size and log.end_offset == 8
    other = log.append(make_batch([b"x"]), producer_id="q", sequence=0)
    assert other == AppendResult(8, 1, duplicate=False)
    log.close()

    reopened = SegmentLog(tmp_path, durability=FAST)
    assert reopened.append(make_batch([b"y"]), producer_id="p", sequence=1) == AppendResult(
        second.base_offset, second.count, duplicate=True
    )
    assert reopened.end_offset == 9
    reopened.close()


def test_sequence_gaps_order_and_window(tmp_path: Path) -> None:
    log = SegmentLog(tmp_path, durability=FAST)
    log.append(make_batch([b"a"]), producer_id="p", sequence=5)
    log.append(make_batch([b"b"]), producer_id="p", sequence=9)
    with pytest.raises(InvalidArgumentError, match="out of order"):
        log.append(make_batch([b"c"]), producer_id="p", sequence=7)
    with pytest.raises(InvalidArgumentError, match="older than the retained window"):
        log.append(make_batch([b"c"]), producer_id="p", sequence=2)
    for sequence in range(10, 10 + PRODUCER_WINDOW):
        log.append(make_batch([b"x"]), producer_id="p", sequence=sequence)
    with pytest.raises(InvalidArgumentError, match="older than the retained window"):
        log.append(make_batch([b"c"]), producer_id="p", sequence=9)
    assert log.append(make_batch([b"c"]), producer_id="p", sequence=10).duplicate
    log.close()


def test_append_all_gives_each_append_its_own_outcome(tmp_path: Path) -> None:
    log = SegmentLog(tmp_path, durability=FAST)
    log.append(make_batch([b"a"]), producer_id="p", sequence=0)
    outcomes = log.append_all(
        [
            Append(make_batch([b"b", b"c"]), "p", 1),
            Append(make_batch([b"a"]), "p", 0),  # stored before: a duplicate
            Append(make_batch([b"b", b"c"]), "p", 1),  # earlier in this group: a duplicate
            Append(make_batch([b"d"]), "", None),  # refused, and stops nothing
            Append(make_batch([b"e"])),
        ]
    )
    assert outcomes[:3] == [
        AppendResult(1, 2),
        AppendResult(0, 1, duplicate=True),
        AppendResult(1, 2, duplicate=True),
    ]
    assert isinstance(outcomes[3], InvalidArgumentError)
    assert outcomes[4] == AppendResult(3, 1)
    log.terminate()
    refused = log.append_all([Append(make_batch([b"f"])), Append(make_batch([b"b"]), "p", 1)])
    assert isinstance(refused[0], SegmentTerminated)
    assert refused[1] == AppendResult(1, 2, duplicate=True)  # resends still get their offsets
    log.close()
    reopened = SegmentLog(tmp_path, durability=FAST)
    assert [v for b in reopened.read(0, 10) for v in b.records.column("value").to_pylist()] == [
        b"a",
        b"b",
        b"c",
        b"e",
    ]
    reopened.close()


@pytest.mark.parametrize(("producer", "sequence"), [(None, 1), ("", None), ("p", -1)])
def test_rejects_bad_producer_arguments(
    tmp_path: Path, producer: str | None, sequence: int | None
) -> None:
    log = SegmentLog(tmp_path, durability=FAST)
    with pytest.raises(InvalidArgumentError):
        log.append(make_batch([b"a"]), producer_id=producer, sequence=sequence)
    log.close()


# --- termination -------------------------------------------------------------------


def test_resend_of_a_stored_batch_after_the_seal_gets_its_offsets(tmp_path: Path) -> None:
    """A producer whose acknowledgement was lost around a seal resends: it must learn the
    batch is stored (not be told to re-route it to the children, which would duplicate it)."""
    log = SegmentLog(tmp_path, durability=FAST, segment_id=7)
    first = log.append(make_batch([b"a", b"b"]), producer_id="p", sequence=0)
    log.terminate()
    again = log.append(make_batch([b"a", b"b"]), producer_id="p", sequence=0)
    assert (again.base_offset, again.count, again.duplicate) == (first.base_offset, 2, True)
    with pytest.raises(SegmentTerminated):
        log.append(make_batch([b"c"]), producer_id="p", sequence=1)
    log.close()


def test_terminated_log_refuses_appends_across_reopen(tmp_path: Path) -> None:
    log = SegmentLog(tmp_path, durability=FAST, segment_id=42)
    log.append(make_batch([b"a", b"b"]))
    log.terminate()
    size = log.size_bytes
    log.terminate()
    assert log.size_bytes == size and log.terminated
    with pytest.raises(SegmentTerminated, match="segment 42 is terminated") as caught:
        log.append(make_batch([b"c"]))
    assert caught.value.segment_id == 42
    log.close()

    reopened = SegmentLog(tmp_path, durability=FAST, segment_id=42)
    assert reopened.terminated and reopened.end_offset == 2
    assert read_values(reopened, 0, 10) == [b"a", b"b"]
    with pytest.raises(SegmentTerminated) as caught:
        reopened.append(make_batch([b"c"]), producer_id="p", sequence=0)
    assert caught.value.segment_id == 42
    reopened.close()


# --- durability and retention ------------------------------------------------------


@pytest.mark.parametrize(
    ("durability", "syncs_after_appends", "syncs_after_sync"),
    [
        (Durability("fsync"), 3, 3),
        (Durability("interval", interval_s=0.0), 3, 3),
        (Durability("interval", interval_s=3600.0), 0, 1),
        (Durability("none"), 0, 1),
    ],
)
def test_durability_policies(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    durability: Durability,
    syncs_after_appends: int,
    syncs_after_sync: int,
) -> None:
    calls: list[int] = []
    real = chunk_files_module._datasync
    monkeypatch.setattr(chunk_files_module, "_datasync", lambda fd: (calls.append(fd), real(fd)))
    log = SegmentLog(tmp_path, durability=durability)
    for start in range(0, 3):
        log.append(make_batch(values_for(start, 1)))
    assert len(calls) == syncs_after_appends
    log.sync()
    assert len(calls) == syncs_after_sync
    log.close()
    reopened = SegmentLog(tmp_path, durability=durability)
    assert read_values(reopened, 0, 10) == values_for(0, 3)
    reopened.close()


def test_durability_from_env_and_validation(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RAYTOPICS_DURABILITY", "fsync")
    monkeypatch.setenv("RAYTOPICS_FSYNC_INTERVAL_S", "0.5")
    assert Durability.from_env() == Durability("fsync", 0.5)
    monkeypatch.delenv("RAYTOPICS_FSYNC_INTERVAL_S")
    monkeypatch.delenv("RAYTOPICS_DURABILITY")
    assert Durability.from_env() == Durability()
    monkeypatch.setenv("RAYTOPICS_DURABILITY", "sometimes")
    with pytest.raises(InvalidArgumentError):
        Durability.from_env()
    with pytest.raises(InvalidArgumentError):
        Durability("interval", interval_s=-1)


def test_default_storage_root(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("RAYTOPICS_STORAGE_ROOT", str(tmp_path))
    assert default_storage_root() == tmp_path
    monkeypatch.delenv("RAYTOPICS_STORAGE_ROOT")
    root = default_storage_root()
    assert root.name == "segments" and "raytopics" in str(root)


def test_truncate_head_drops_whole_old_chunks_only(tmp_path: Path) -> None:
    log = SegmentLog(tmp_path, durability=FAST, max_chunk_bytes=2048)
    for start in range(0, 300, 10):
        log.append(make_batch(values_for(start, 10)))
    bases = [int(name.removesuffix(".log")) for name in chunk_files(tmp_path)]
    assert len(bases) > 3
    cut = bases[2] + 1  # inside the third chunk: only the first two are wholly below it
    assert log.truncate_head(cut) == bases[2]
    assert log.start_offset == bases[2]
    assert chunk_files(tmp_path)[0] == f"{bases[2]:020d}.log"
    with pytest.raises(InvalidArgumentError, match="below the start offset"):
        log.read(bases[2] - 1, 1)
    assert read_values(log, bases[2], 1000) == values_for(bases[2], 300 - bases[2])

    assert log.truncate_head(10**9) == bases[-1] - bases[2]
    assert chunk_files(tmp_path) == [f"{bases[-1]:020d}.log"]
    log.append(make_batch(values_for(300, 5)))
    log.close()

    reopened = SegmentLog(tmp_path, durability=FAST, max_chunk_bytes=2048)
    assert (reopened.start_offset, reopened.end_offset) == (bases[-1], 305)
    assert read_values(reopened, bases[-1], 1000) == values_for(bases[-1], 305 - bases[-1])
    reopened.delete()
    assert not tmp_path.exists()


def test_retain_drops_whole_batches_by_time_and_size_and_survives_a_restart(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    clock = iter(range(1_000, 10**6, 1_000))  # each batch published one second after the last
    monkeypatch.setattr(segment_log_module, "_now_ms", lambda: next(clock))
    log = SegmentLog(tmp_path, durability=FAST, max_chunk_bytes=2048)
    for start in range(0, 300, 10):  # 30 batches, published at 1s, 2s, ... 30s
        log.append(make_batch(values_for(start, 10)))
    full = log.size_bytes
    assert log.retain(oldest_publish_ms=5_500, max_bytes=None) == 50  # batches at 1s..5s go
    assert log._index.bases[0] == 50, "the index still holds batches retention dropped"
    with pytest.raises(InvalidArgumentError, match="below the start offset"):
        log.read(49, 1)
    assert read_values(log, 50, 20) == values_for(50, 20)
    assert log.size_bytes < full
    assert log.retain(None, max_bytes=log.size_bytes // 2) % 10 == 0  # whole batches only
    assert log.size_bytes <= full // 2
    start = log.start_offset
    assert int(chunk_files(tmp_path)[0].removesuffix(".log")) <= start  # whole files unlinked
    assert len(chunk_files(tmp_path)) < 10
    log.close()
    reopened = SegmentLog(tmp_path, durability=FAST, max_chunk_bytes=2048)
    assert (reopened.start_offset, reopened.end_offset) == (start, 300)
    assert reopened.retain(10**9, None, keep_from=start + 15) == start + 10  # a reader needs it
    assert reopened.retain(10**9, None) == 300  # everything expired: the log is empty, not gone
    assert reopened._index.bases == []
    reopened.append(make_batch(values_for(300, 5)))
    assert read_values(reopened, 300, 10) == values_for(300, 5)
    reopened.close()


# --- property: the log behaves like a list -----------------------------------------

operations = st.lists(
    st.one_of(
        st.tuples(st.just("append"), st.integers(1, 30), st.integers(0, 200)),
        st.tuples(st.just("group"), st.integers(1, 5), st.integers(0, 200)),
        st.tuples(st.just("read"), st.integers(0, 400), st.integers(1, 100)),
        st.tuples(st.just("reopen"), st.just(0), st.just(0)),
    ),
    max_size=40,
)


def open_small_chunk_log(directory: Path) -> SegmentLog:
    return SegmentLog(directory, durability=FAST, max_chunk_bytes=3000)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(operations)
def test_log_matches_in_memory_model(ops: list[tuple[str, int, int]]) -> None:
    with tempfile.TemporaryDirectory() as directory:
        log = open_small_chunk_log(Path(directory))
        model: list[bytes] = []
        for kind, first, second in ops:
            if kind == "append":
                values = [b"%d:" % (len(model) + i) + b"v" * second for i in range(first)]
                assert log.append(make_batch(values)).base_offset == len(model)
                model += values
            elif kind == "group":  # one write of several batches, across chunk rolls too
                batches = [[b"%d:" % (len(model) + i) + b"g" * second] for i in range(first)]
                results = log.append_all([Append(make_batch(values)) for values in batches])
                assert [r.base_offset for r in results] == [len(model) + i for i in range(first)]
                model += [v for values in batches for v in values]
            elif kind == "read":
                batches = log.read(first, second)
                assert [v for b in batches for v in b.records.column("value").to_pylist()] == (
                    model[first : first + second]
                )
                offsets = [b.base_offset for b in batches]
                sizes = [b.records.num_rows for b in batches]
                assert offsets == [first + sum(sizes[:i]) for i in range(len(sizes))]
            else:
                log.close()
                log = open_small_chunk_log(Path(directory))
            assert log.end_offset == len(model)
        log.close()
