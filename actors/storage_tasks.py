"""Looking at the storage root from inside the cluster.

The storage check and recovery must see the storage root the cluster's
segments write to, which is a path on the cluster's nodes (a shared mount on a
multi-node cluster), not necessarily one the calling process has: a REST
gateway, a CLI on a laptop or a job driver may each run elsewhere. So the scan
and the deletion run as Ray tasks, on a node of the cluster.
"""

from __future__ import annotations

from pathlib import Path

import ray

from runtime.errors import InvalidArgumentError
from runtime.names import TopicName
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
