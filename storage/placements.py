"""Which node's disk holds a segment, when every node keeps its own (storage scope
``node``, ``storage.durability.storage_scope``).

A segment's local files are then on one machine only, so its actor must run there
and nowhere else, and a restarted Ray (new node ids) must still find that machine.
Each storage root therefore carries a *disk id* of its own (``disk.json``, written the
first time the root is used), and the metadata store records, per segment of a topic
incarnation, the disk id its files were laid out on. A node is found by asking each
live node which disk it has (``actors.control.node_disks``); a segment whose disk no live node
has is unavailable, said so, never re-created empty elsewhere.

A segment moved to an object-store tier needs no disk (``storage.tier_records``): its
placement is dropped with its local files, and it opens on any node.
"""

from __future__ import annotations

import json
import os
import secrets
from pathlib import Path

from runtime.names import TopicName
from storage.files import atomic_write
from storage.metadata import MetadataStore
from storage.metadata_paths import placements_path
from storage.segment_entries import SegmentEntries

DISK_FILE = "disk.json"


def disk_id(root: Path) -> str:
    """The id of the disk under ``root``, made the first time it is asked for. Two
    processes racing to make it agree: the file is created exclusively, and the loser
    reads the winner's."""
    root = Path(root)
    path = root / DISK_FILE
    try:
        return str(json.loads(path.read_bytes())["id"])
    except FileNotFoundError:
        pass
    root.mkdir(parents=True, exist_ok=True)
    candidate = root / f".{DISK_FILE}.{secrets.token_hex(4)}"
    atomic_write(candidate, json.dumps({"id": secrets.token_hex(8)}).encode())
    try:
        os.link(candidate, path)  # exclusive: fails if another process made it first
    except FileExistsError:
        pass
    finally:
        candidate.unlink(missing_ok=True)
    return str(json.loads(path.read_bytes())["id"])


class SegmentPlacements(SegmentEntries):
    """The disk of each local segment of one topic incarnation (segment id → disk id)."""

    def __init__(self, store: MetadataStore, topic: TopicName, incarnation: str) -> None:
        super().__init__(store, placements_path(topic, incarnation))

    def get(self, segment_id: int) -> str | None:
        raw = self._raw(segment_id)
        return raw.decode() if raw is not None else None

    def place(self, segment_id: int, disk: str) -> str:
        """Record ``disk`` for the segment unless it has one; returns the one it has (a
        resumed operation lays a segment out where its first attempt did)."""
        return self._write_first(segment_id, disk.encode()).decode()

    def move(self, segment_id: int, disk: str) -> None:
        """The segment is served from ``disk`` now: a replicated segment's new leader, whose
        node its actor is started on again after any restart."""
        self._write(segment_id, disk.encode())

    def all(self) -> dict[int, str]:
        placed = {segment_id: self.get(segment_id) for segment_id in self.segment_ids()}
        return {segment_id: disk for segment_id, disk in placed.items() if disk is not None}
