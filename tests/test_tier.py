"""Sealed segment logs in an object store (``storage.tier``), without Ray: against a
``file://`` directory and a real S3 API server on loopback (moto in server mode),
through ``pyarrow.fs``. What is read back from the tier is exactly what the log
serves; nothing is committed unless the upload matches the log; a crash before the
commit leaves nothing a reader would take for a segment; unusable tiers are refused
with the store's reason.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from object_store import s3_uri
from pyarrow import fs as pafs

from runtime.batch import make_batch
from runtime.errors import InvalidArgumentError, UnavailableError
from storage.durability import Durability
from storage.log import SegmentRecords, to_delivery
from storage.segment_log import SegmentLog
from storage.tier import (
    MANIFEST_FILE,
    TIERED_RECORD,
    TieredSegment,
    check_reachable,
    delete_tiered,
    offload,
    open_tier,
    read_manifest,
    tiered_location,
)
from storage.topic_storage import delete_storage

FAST = Durability("none")


@pytest.fixture(params=["file", "s3"])
def tier(request, tmp_path: Path) -> tuple[pafs.FileSystem, str]:
    if request.param == "file":
        return open_tier(f"file://{tmp_path / 'tier'}")
    endpoint = request.getfixturevalue("s3_endpoint")
    return open_tier(s3_uri(endpoint, f"tier/{tmp_path.name}"))


def sealed_log(directory: Path, batches: int = 40, per_batch: int = 4_000) -> SegmentLog:
    """A terminated log of keyed records with properties from two producers, some
    batches unsequenced, the oldest dropped by retention, over several row groups."""
    log = SegmentLog(directory, durability=FAST, max_chunk_bytes=1 << 20)
    offset = 0
    for number in range(batches):
        values = [f"value-{offset + i}".encode() * 3 for i in range(per_batch)]
        keys = [f"k{(offset + i) % 97}" for i in range(per_batch)]
        properties = [{"n": str(offset + i)} if i % 5 == 0 else None for i in range(per_batch)]
        producer = None if number % 3 == 0 else f"p{number % 2}"
        sequence = None if producer is None else number
        log.append(make_batch(values, keys, properties), producer, sequence)
        offset += per_batch
        time.sleep(0.002)  # distinct publish times
    log.retain(None, None, None)
    log.truncate_head(8_000)
    log.terminate()
    return log


def test_a_tiered_segment_reads_exactly_as_its_log(tmp_path: Path, tier) -> None:
    filesystem, base = tier
    log = sealed_log(tmp_path / "log")
    directory = f"{base}/t/ns/x/inc/0"
    manifest = offload(log, filesystem, directory, segment_id=7, row_group_bytes=2 << 20)
    assert (manifest.start_offset, manifest.end_offset) == (log.start_offset, log.end_offset)
    assert manifest.records == log.end_offset - log.start_offset
    assert len(manifest.row_groups) > 1
    second_group = manifest.row_groups[1][0]

    tiered = TieredSegment(filesystem, directory)
    assert isinstance(log, SegmentRecords) and isinstance(tiered, SegmentRecords)
    for offset, count in [
        (log.start_offset, 10),
        (log.start_offset, 100_000),
        (second_group - 3, 7),  # across a row group's end
        (second_group - 3, 200_000),  # over several groups
        (log.end_offset - 5, 50),
        (50_001, 1),
    ]:
        want, got = log.read(offset, count), tiered.read(offset, count)
        assert to_delivery(got).equals(to_delivery(want)), (offset, count)
        assert [(b.producer_id, b.sequence) for b in got] == [
            (b.producer_id, b.sequence) for b in want
        ]
    assert tiered.read(log.end_offset, 10) == []
    for offset in (log.start_offset, second_group - 1, second_group, log.end_offset - 1):
        assert tiered.publish_time_at(offset) == log.publish_time_at(offset) is not None
    assert tiered.publish_time_at(log.end_offset) is log.publish_time_at(log.end_offset) is None
    with pytest.raises(InvalidArgumentError, match="below the start offset"):
        tiered.read(log.start_offset - 1, 1)
    for entry in log.read(log.start_offset, 10**6)[::7]:
        for time_ms in (
            entry.publish_time_ms - 1,
            entry.publish_time_ms,
            entry.publish_time_ms + 1,
        ):
            assert tiered.offset_at_time(time_ms) == log.offset_at_time(time_ms), time_ms
    assert tiered.offset_at_time(0) == log.start_offset
    assert tiered.offset_at_time(2**62) == log.end_offset

    # Spark and any engine read the records file as it is
    with filesystem.open_input_file(f"{directory}/records.parquet") as file:
        assert pq.read_table(file, columns=["offset"]).num_rows == manifest.records
    delete_tiered(filesystem, directory)
    assert read_manifest(filesystem, directory) is None
    log.close()


def test_only_a_sealed_intact_log_is_committed(tmp_path: Path, tier) -> None:
    filesystem, base = tier
    open_log = SegmentLog(tmp_path / "open", durability=FAST)
    open_log.append(make_batch([b"x"]))
    with pytest.raises(InvalidArgumentError, match="not sealed"):
        offload(open_log, filesystem, f"{base}/open", segment_id=7)
    open_log.close()

    log = sealed_log(tmp_path / "damaged", batches=6, per_batch=1_000)
    chunk = sorted((tmp_path / "damaged").glob("*.log"))[0]
    with open(chunk, "r+b") as file:  # a flipped byte inside the first frame's payload
        file.seek(200)
        byte = file.read(1)
        file.seek(200)
        file.write(bytes([byte[0] ^ 0xFF]))
    with pytest.raises(UnavailableError, match="fails its checksums"):
        offload(log, filesystem, f"{base}/damaged", segment_id=7)
    assert read_manifest(filesystem, f"{base}/damaged") is None
    log.close()


def test_a_crash_before_the_commit_leaves_no_segment_and_offloading_again_commits(
    tmp_path: Path, tier
) -> None:
    filesystem, base = tier
    log = sealed_log(tmp_path / "log", batches=5, per_batch=1_000)
    directory = f"{base}/crashed"
    offload(log, filesystem, directory, segment_id=7)
    filesystem.delete_file(f"{directory}/{MANIFEST_FILE}")  # as if the crash came just before
    assert read_manifest(filesystem, directory) is None
    with pytest.raises(UnavailableError, match="manifest is missing"):
        TieredSegment(filesystem, directory)
    offload(log, filesystem, directory, segment_id=7)  # the next owner finishes the move
    tiered = TieredSegment(filesystem, directory)
    want = log.read(log.start_offset, 10**6)
    assert to_delivery(tiered.read(log.start_offset, 10**6)).equals(to_delivery(want))
    log.close()


def test_unusable_tiers_are_refused_with_the_reason(tmp_path: Path, s3_endpoint: str) -> None:
    with pytest.raises(InvalidArgumentError, match="cannot be used") as refused:
        open_tier(s3_uri(s3_endpoint, "tier/x") + "&secret_key=hush&no_such_option=1")
    assert "testing" not in str(refused.value) and "hush" not in str(refused.value)
    assert "no_such_option" in str(refused.value)
    with pytest.raises(InvalidArgumentError, match="cannot be used"):
        open_tier("nosuch://bucket/prefix")
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    filesystem, base = open_tier(f"file://{blocker}/tier")
    with pytest.raises(UnavailableError, match="not usable"):
        check_reachable(filesystem, base)
    filesystem, base = open_tier(s3_uri(s3_endpoint, "no-such-bucket/x"))
    with pytest.raises(UnavailableError, match="not usable"):
        check_reachable(filesystem, base)
    filesystem, base = open_tier(s3_uri(s3_endpoint, "tier/usable"))
    check_reachable(filesystem, base)


def test_removing_local_storage_removes_the_tiered_copies_it_points_to(tmp_path: Path) -> None:
    """Storage a previous version left, with a local note of where its records went:
    however it goes (a prune, a topic's incarnation, the storage check's clean-up), its
    tiered copy goes first."""
    filesystem, base = open_tier(f"file://{tmp_path / 'tier'}")
    incarnation = tmp_path / "root" / "t" / "ns" / "x" / "inc"
    for number in range(2):
        segment = incarnation / f"segment-{number}"
        log = sealed_log(segment / "log", batches=2, per_batch=100)
        directory = f"{base}/seg-{number}"
        offload(log, filesystem, directory, segment_id=7)
        log.close()
        legacy = {"uri": f"file://{tmp_path / 'tier'}", "directory": directory}
        (segment / TIERED_RECORD).write_text(json.dumps(legacy))  # a previous version's note
        assert tiered_location(segment) is not None
    delete_storage(incarnation)
    assert not incarnation.exists()
    assert [read_manifest(filesystem, f"{base}/seg-{n}") for n in range(2)] == [None, None]
