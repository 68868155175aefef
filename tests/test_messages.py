"""What a consumer process pays per message: unpacking without pandas, and GC freezing."""

from __future__ import annotations

import gc
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from clients._gc import freeze_what_exists
from clients.message import highest_offsets
from runtime.batch import DELIVERY_SCHEMA
from runtime.config import GC_FREEZE_ENV
from runtime.errors import InvalidArgumentError

ROOT = Path(__file__).resolve().parents[1]

UNPACK = """
import sys
import pyarrow as pa
from clients.message import messages_from_delivery
batch = pa.ipc.open_stream(open(sys.argv[1], "rb").read()).read_next_batch().slice(1, 2)
print([(m.key, m.value, m.segment_id, m.offset, m.publish_time.isoformat(), m.properties)
       for m in messages_from_delivery(5, batch)])
from clients.message import highest_offsets, table_from_deliveries
table = table_from_deliveries([(5, batch), (3, batch.slice(0, 1))])
highest = highest_offsets(table)
pandas = "pandas" in sys.modules  # before printing: Arrow's to_pylist of zoned times imports it
columns = table.to_pydict()
columns["publish_time"] = [t.isoformat() for t in columns["publish_time"]]
print(columns)
print(highest)
print(pandas)
"""


def delivery_batch() -> pa.RecordBatch:
    columns = [
        pa.array(["k1", "k2", None]),
        pa.array([b"a", b"b", b"c"]),
        pa.array([None, [("p", "1")], None], DELIVERY_SCHEMA.field("properties").type),
        pa.array([7, 8, 9], pa.int64()),
        pa.array([1_000, 1_000, 2_500], DELIVERY_SCHEMA.field("publish_time").type),
    ]
    return pa.RecordBatch.from_arrays(columns, schema=DELIVERY_SCHEMA)


def test_unpacking_is_exact_and_never_imports_pandas(tmp_path: Path) -> None:
    """Arrow converts zoned timestamps through pandas: ~300 modules and half a second
    for every consumer process, and objects born after the client froze the GC. The
    batch arrives as IPC bytes, as from a segment, so building it imports nothing."""
    batch = delivery_batch()
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, batch.schema) as writer:
        writer.write_batch(batch)
    path = tmp_path / "delivery.arrows"
    path.write_bytes(sink.getvalue().to_pybytes())
    proc = subprocess.run(
        [sys.executable, "-c", UNPACK, str(path)],
        cwd=ROOT, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    messages, table, highest, pandas = proc.stdout.strip().splitlines()
    assert messages == (
        "[('k2', b'b', 5, 8, '1970-01-01T00:00:01+00:00', {'p': '1'}), "
        "(None, b'c', 5, 9, '1970-01-01T00:00:02.500000+00:00', {})]"
    )
    assert table == (
        "{'segment_id': [5, 5, 3], 'key': ['k2', None, 'k2'], 'value': [b'b', b'c', b'b'], "
        "'properties': [[('p', '1')], None, [('p', '1')]], 'offset': [8, 9, 8], "
        "'publish_time': ['1970-01-01T00:00:01+00:00', '1970-01-01T00:00:02.500000+00:00', "
        "'1970-01-01T00:00:01+00:00']}"
    )
    assert highest == "{3: 8, 5: 9}"
    assert pandas == "False"


@pytest.mark.parametrize(("setting", "freezes"), [(None, True), ("1", True), ("0", False)])
def test_clients_freeze_what_exists_unless_told_not_to(
    monkeypatch: pytest.MonkeyPatch, setting: str | None, freezes: bool
) -> None:
    if setting is None:
        monkeypatch.delenv(GC_FREEZE_ENV, raising=False)
    else:
        monkeypatch.setenv(GC_FREEZE_ENV, setting)
    gc.unfreeze()
    survivor = [object()]  # a tracked object alive now
    freeze_what_exists()
    assert (gc.get_freeze_count() > 0) == freezes
    assert survivor
    gc.unfreeze()


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 5), st.integers(0, 1 << 40)), max_size=60))
def test_highest_offsets_are_each_segments_maximum_over_any_rows(rows) -> None:
    """Rows of a received table in any order (a caller may filter or sort it), in chunks."""
    segments = [s for s, _ in rows]
    offsets = [o for _, o in rows]
    half = len(rows) // 2
    chunks = [
        pa.record_batch(
            [pa.array(segments[a:b], pa.int64()), pa.array(offsets[a:b], pa.int64())],
            names=["segment_id", "offset"],
        )
        for a, b in ((0, half), (half, len(rows)))
    ]
    expected: dict[int, int] = {}
    for segment, offset in rows:
        expected[segment] = max(offset, expected.get(segment, -1))
    assert highest_offsets(pa.Table.from_batches(chunks)) == expected
    assert highest_offsets(chunks[1]) == {
        s: max(o for t, o in rows[half:] if t == s) for s in segments[half:]
    }


@pytest.mark.parametrize(
    ("table", "wrong"),
    [
        (pa.table({"offset": pa.array([1], pa.int64())}), "segment_id"),
        (pa.table({"segment_id": [1], "offset": pa.array([1], pa.int32())}), "offset"),
        (pa.table({"segment_id": [1], "offset": pa.array([None], pa.int64())}), "nulls"),
    ],
)
def test_acknowledging_a_table_without_int64_positions_is_refused(table, wrong) -> None:
    with pytest.raises(InvalidArgumentError, match=wrong):
        highest_offsets(table)
