"""What a consumer process pays per message: unpacking without pandas, and GC freezing."""

from __future__ import annotations

import gc
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pytest

from clients._ray import freeze_what_exists
from runtime.batch import DELIVERY_SCHEMA
from runtime.config import GC_FREEZE_ENV

ROOT = Path(__file__).resolve().parents[1]

UNPACK = """
import sys
import pyarrow as pa
from clients.message import messages_from_delivery
batch = pa.ipc.open_stream(open(sys.argv[1], "rb").read()).read_next_batch().slice(1, 2)
print([(m.key, m.value, m.segment_id, m.offset, m.publish_time.isoformat(), m.properties)
       for m in messages_from_delivery(5, batch)])
print("pandas" in sys.modules)
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
    messages, pandas = proc.stdout.strip().splitlines()
    assert messages == (
        "[('k2', b'b', 5, 8, '1970-01-01T00:00:01+00:00', {'p': '1'}), "
        "(None, b'c', 5, 9, '1970-01-01T00:00:02.500000+00:00', {})]"
    )
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
