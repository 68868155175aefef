"""Looking at the storage root from inside the cluster.

The storage check and recovery must see the storage root the cluster's
segments write to, which is a path on the cluster's nodes (a shared mount on a
multi-node cluster), not necessarily one the calling process has: a REST
gateway, a CLI on a laptop or a job driver may each run elsewhere. So the scan
and the deletion run as Ray tasks, on a node of the cluster.

What is orphaned is decided against the metadata (``storage_report``): storage
of an incarnation no live topic names. Storage another deployment (another Ray
namespace) wrote under a shared root is listed apart and never deleted.

With a disk per node (storage scope ``node``) each live node's disk is scanned by a task
pinned to that node, and what is orphaned there is deleted there: a replicated topic's
incarnation has a copy on several disks, and a scan of one node would miss the others.
A node that does not answer is reported (``unscanned``), never silently left out.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import ray

from actors.registry import live_nodes, on_each_node, on_node
from runtime.errors import InvalidArgumentError, UnavailableError
from runtime.names import TopicName
from runtime.remote import call
from storage.catalog import Catalog
from storage.durability import default_storage_root, node_storage_root, storage_scope
from storage.placements import disk_id
from storage.records import TopicRecord
from storage.topic_storage import StoredIncarnation, delete_storage, merge_incarnations, scan

# How long a node may take to scan its disk before the report lists it as unscanned.
SCAN_WAIT_S = 60.0


@ray.remote(num_cpus=0)
def scan_storage(root: str, topic: str | None = None) -> list[StoredIncarnation]:
    """Every incarnation stored under ``root`` (of ``topic`` only, when given)."""
    return scan(Path(root), TopicName.parse(topic) if topic is not None else None)


@ray.remote(num_cpus=0, max_retries=0)
def scan_disk(cluster_root: str) -> tuple[str, str, list[StoredIncarnation]]:
    """This node's own disk (storage scope ``node``): its id, its root, and every
    incarnation stored there."""
    root = node_storage_root(cluster_root)
    return disk_id(root), str(root), scan(root)


@ray.remote(num_cpus=0)
def remove_storage(root: str, directories: list[str], own_disk: bool = False) -> None:
    """Delete incarnation directories found by ``scan_storage`` under ``root`` (this node's
    own root instead, with ``own_disk``); anything else is refused before anything is
    deleted."""
    base = (node_storage_root(root) if own_disk else Path(root)).resolve()
    resolved = [Path(d).resolve() for d in directories]
    outside = [
        str(d) for d in resolved if base not in d.parents or len(d.relative_to(base).parts) != 4
    ]
    if outside:
        raise InvalidArgumentError(f"refusing to delete {outside}: not topic storage under {base}")
    for directory in resolved:
        delete_storage(directory)


@dataclass
class _Scanned:
    """What one storage root holds: the shared root (``disk`` None), or a node's disk."""

    entries: list[StoredIncarnation]
    disk: str | None = None
    node: str | None = None

    def row(self, entry: StoredIncarnation) -> dict[str, Any]:
        described = entry.describe()
        return described if self.disk is None else {**described, "disk": self.disk}


async def storage_report(catalog: Catalog, delete: bool = False) -> dict[str, Any]:
    """Storage under the storage root that no live metadata names (with ``delete``,
    removed): ``{"storageRoot", "live", "orphaned", "foreign", "deleted"}``; with a disk
    per node, each row names its ``disk``, and ``disks`` and ``unscanned`` say which
    nodes were scanned and which did not answer. ``live``: incarnations, each counted once
    however many disks hold a copy."""
    root = str(default_storage_root())
    node_scope = storage_scope() == "node"
    if node_scope:
        scanned, unscanned = await asyncio.to_thread(_scan_disks, root)
    else:
        scanned, unscanned = [_Scanned(await call(scan_storage.remote(root)))], []
    orphaned: list[tuple[_Scanned, StoredIncarnation, str]] = []
    foreign: list[dict[str, Any]] = []
    live: set[tuple[str, str | None]] = set()
    for where in scanned:
        for entry in where.entries:
            record = catalog.topic(entry.topic)
            if entry.ray_namespace not in (None, catalog.store.namespace):
                foreign.append(where.row(entry))
            elif record is not None and record.incarnation == entry.incarnation:
                live.add((str(entry.topic), entry.incarnation))
            else:
                orphaned.append((where, entry, _orphan_reason(entry, record)))
    report: dict[str, Any] = {
        "storageRoot": root,
        "live": len(live),
        "orphaned": [{**where.row(e), "reason": why} for where, e, why in orphaned],
        "foreign": foreign,
        "deleted": [],
    }
    if node_scope:
        report["disks"] = [{"disk": w.disk, "node": w.node} for w in scanned]
        report["unscanned"] = unscanned
    if delete and orphaned:
        await _delete(root, orphaned, node_scope)
        report["deleted"] = report["orphaned"]
    return report


async def _delete(
    root: str, orphaned: list[tuple[_Scanned, StoredIncarnation, str]], node_scope: bool
) -> None:
    """Remove each orphaned incarnation where it was found: on its node's disk, by a task
    pinned to that node, or under the shared root."""
    by_node: dict[str | None, list[str]] = {}
    for where, entry, _ in orphaned:
        by_node.setdefault(where.node, []).extend(str(d) for d in entry.removable)
    await asyncio.gather(
        *(
            call(_remover(node).remote(root, directories, node_scope))
            for node, directories in by_node.items()
        )
    )


def _remover(node: str | None) -> Any:
    if node is None:
        return remove_storage
    return remove_storage.options(scheduling_strategy=on_node(node))


def _scan_disks(root: str) -> tuple[list[_Scanned], list[dict[str, str]]]:
    """Every live node's disk scanned on that node (two nodes sharing a disk count once),
    and the nodes that did not answer within ``SCAN_WAIT_S``, with why. Blocking."""
    answers, missing = on_each_node(live_nodes(), scan_disk, root, wait_s=SCAN_WAIT_S)
    scanned: dict[str, _Scanned] = {}
    for node, (disk, _, entries) in sorted(answers.items()):
        scanned.setdefault(disk, _Scanned(entries, disk, node))
    unscanned = [{"node": node, "why": why} for node, why in sorted(missing.items())]
    return [scanned[d] for d in sorted(scanned)], unscanned


async def stored_incarnations(topic: TopicName) -> list[StoredIncarnation]:
    """``topic``'s stored incarnations, each once: under the shared root, or on every live
    node's disk (``UnavailableError`` naming a node that did not answer: a recovery must
    not choose among incarnations it did not all see)."""
    root = str(default_storage_root())
    if storage_scope() != "node":
        return await call(scan_storage.remote(root, str(topic)))
    scanned, unscanned = await asyncio.to_thread(_scan_disks, root)
    if unscanned:
        raise UnavailableError(f"{topic}: these nodes' disks could not be read: {unscanned}")
    found = [entry for where in scanned for entry in where.entries if entry.topic == topic]
    return merge_incarnations(found)


def _orphan_reason(entry: StoredIncarnation, record: TopicRecord | None) -> str:
    if entry.incarnation is None:
        return "written before topic incarnations existed: it cannot be recovered"
    if record is None:
        return "no metadata names this topic: deleted, or its metadata was lost (recover)"
    return f"the topic's live metadata names incarnation {record.incarnation}"
