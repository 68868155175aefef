"""Which node's disk holds a segment, when every node keeps its own (storage scope
``node``, ``storage.durability.storage_scope``).

A segment's local files are then on one machine only, so its actor must run there
and nowhere else, and a restarted Ray (new node ids) must still find that machine.
Each storage root therefore carries a *disk id* of its own (``disk.json``, written the
first time the root is used), and the metadata store records, per segment of a topic
incarnation, the disk id its files were laid out on. A node is found by asking each
live node which disk it has (``actors.node_disks``); a segment whose disk no live node
has is unavailable, said so, never re-created empty elsewhere.

A segment moved to an object-store tier needs no disk (``storage.tier_records``): its
placement is dropped with its local files, and it opens on any node.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
from pathlib import Path

from runtime.errors import AlreadyExistsError, KeyNotFoundError
from runtime.names import TopicName
from storage.catalog import placements_path
from storage.files import atomic_write
from storage.metadata import MetadataStore

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


class SegmentPlacements:
    """The disk of each local segment of one topic incarnation (segment id → disk id)."""

    def __init__(self, store: MetadataStore, topic: TopicName, incarnation: str) -> None:
        self.store = store
        self._base = placements_path(topic, incarnation)

    def get(self, segment_id: int) -> str | None:
        found = self.store.get(self._path(segment_id))
        return found.value.decode() if found is not None else None

    def place(self, segment_id: int, disk: str) -> str:
        """Record ``disk`` for the segment unless it has one; returns the one it has (a
        resumed operation lays a segment out where its first attempt did)."""
        with contextlib.suppress(AlreadyExistsError):
            self.store.put_if_absent(self._path(segment_id), disk.encode())
        found = self.get(segment_id)
        return found if found is not None else disk

    def all(self) -> dict[int, str]:
        base = f"{self._base}/"
        placed = {}
        for path in self.store.list(base):
            found = self.store.get(path)
            if found is not None:
                placed[int(path[len(base) :])] = found.value.decode()
        return placed

    def drop(self, segment_id: int) -> None:
        with contextlib.suppress(KeyNotFoundError):
            self.store.delete(self._path(segment_id))

    def drop_all(self) -> None:
        self.store.delete_tree(self._base)

    def _path(self, segment_id: int) -> str:
        return f"{self._base}/{segment_id}"
