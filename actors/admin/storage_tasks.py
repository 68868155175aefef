"""Looking at the storage root from inside the cluster.

The storage check and recovery must see the storage root the cluster's
segments write to, which is a path on the cluster's nodes (a shared mount on a
multi-node cluster), not necessarily one the calling process has: a REST
gateway, a CLI on a laptop or a job driver may each run elsewhere. So the scan
and the deletion run as Ray tasks, on a node of the cluster.

What is orphaned is decided against the metadata (``storage_report``): storage
of an incarnation no live topic names. Storage another deployment (another Ray
namespace) wrote under a shared root is listed apart and never deleted.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import ray

from runtime.errors import InvalidArgumentError
from runtime.names import TopicName
from runtime.remote import call
from storage.catalog import Catalog
from storage.durability import default_storage_root
from storage.records import TopicRecord
from storage.topic_storage import StoredIncarnation, delete_storage, scan


@ray.remote(num_cpus=0)
def scan_storage(root: str, topic: str | None = None) -> list[StoredIncarnation]:
    """Every incarnation stored under ``root`` (of ``topic`` only, when given)."""
    return scan(Path(root), TopicName.parse(topic) if topic is not None else None)


@ray.remote(num_cpus=0)
def remove_storage(root: str, directories: list[str]) -> None:
    """Delete incarnation directories found by ``scan_storage`` under ``root``; anything
    else is refused before anything is deleted."""
    base = Path(root).resolve()
    resolved = [Path(d).resolve() for d in directories]
    outside = [
        str(d) for d in resolved if base not in d.parents or len(d.relative_to(base).parts) != 4
    ]
    if outside:
        raise InvalidArgumentError(f"refusing to delete {outside}: not topic storage under {base}")
    for directory in resolved:
        delete_storage(directory)


async def storage_report(catalog: Catalog, delete: bool = False) -> dict[str, Any]:
    """Storage under the storage root that no live metadata names (with ``delete``,
    removed): ``{"storageRoot", "live", "orphaned", "foreign", "deleted"}``."""
    root = str(default_storage_root())
    stored = await call(scan_storage.remote(root))
    orphaned, foreign, live = [], [], 0
    for entry in stored:
        record = catalog.topic(entry.topic)
        if entry.ray_namespace not in (None, catalog.store.namespace):
            foreign.append(entry)
        elif record is not None and record.incarnation == entry.incarnation:
            live += 1
        else:
            orphaned.append((entry, _orphan_reason(entry, record)))
    report: dict[str, Any] = {
        "storageRoot": root,
        "live": live,
        "orphaned": [{**e.describe(), "reason": why} for e, why in orphaned],
        "foreign": [e.describe() for e in foreign],
        "deleted": [],
    }
    if delete and orphaned:
        directories = [str(d) for e, _ in orphaned for d in e.removable]
        await call(remove_storage.remote(root, directories))
        report["deleted"] = report["orphaned"]
    return report


def _orphan_reason(entry: StoredIncarnation, record: TopicRecord | None) -> str:
    if entry.incarnation is None:
        return "written before topic incarnations existed: it cannot be recovered"
    if record is None:
        return "no metadata names this topic: deleted, or its metadata was lost (recover)"
    return f"the topic's live metadata names incarnation {record.incarnation}"
