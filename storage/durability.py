"""Where segment data lives and how hard an append tries to reach the disk: the two
storage settings an operator chooses per deployment (environment variables), so
they can trade safety for speed without code changes."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, get_args

import platformdirs

from runtime.errors import InvalidArgumentError

DurabilityPolicy = Literal["fsync", "interval", "none"]
StorageScope = Literal["shared", "node"]
STORAGE_SCOPE_ENV = "RAYTOPICS_STORAGE_SCOPE"
# Read from the node's own environment (as ``ray start`` ran there), never passed on
# from the program that started an actor: it is what makes one node's disk its own.
NODE_STORAGE_ROOT_ENV = "RAYTOPICS_NODE_STORAGE_ROOT"


def default_storage_root() -> Path:
    """Where segment logs live unless the deployment says otherwise."""
    configured = os.environ.get("RAYTOPICS_STORAGE_ROOT")
    if configured:
        return Path(configured)
    return Path(platformdirs.user_data_dir("raytopics")) / "segments"


def storage_scope() -> StorageScope:
    """``shared``: every node sees the same storage root (one file system, NFS/EFS on
    several nodes), so any node may open any segment. ``node``: each node keeps the
    segments it holds on its own disk; a segment's actor runs only on that node until
    its records move to an object-store tier, after which it opens anywhere."""
    scope = os.environ.get(STORAGE_SCOPE_ENV) or "shared"
    if scope not in get_args(StorageScope):
        raise InvalidArgumentError(
            f"{STORAGE_SCOPE_ENV} must be one of {get_args(StorageScope)}, got {scope!r}"
        )
    return scope  # type: ignore[return-value]


def node_storage_root(cluster_root: Path | str | None = None) -> Path:
    """This node's storage root: its own ``RAYTOPICS_NODE_STORAGE_ROOT`` when set, else
    the cluster's (the same path on every machine, each on its own disk)."""
    own = os.environ.get(NODE_STORAGE_ROOT_ENV)
    if own:
        return Path(own)
    return Path(cluster_root) if cluster_root else default_storage_root()


@dataclass(frozen=True)
class Durability:
    """How hard an append tries to reach the disk before it returns.

    ``fsync`` loses nothing on power failure but pays a disk flush per append;
    ``interval`` bounds the loss window to ``interval_s`` for a fraction of the
    cost; ``none`` leaves flushing to the OS (a process crash still loses
    nothing, since written data is in the page cache).
    """

    policy: DurabilityPolicy = "interval"
    interval_s: float = 0.2

    def __post_init__(self) -> None:
        if self.policy not in get_args(DurabilityPolicy):
            raise InvalidArgumentError(
                f"durability policy must be one of {get_args(DurabilityPolicy)}, "
                f"got {self.policy!r}"
            )
        if not self.interval_s >= 0:
            raise InvalidArgumentError(f"interval_s must be >= 0, got {self.interval_s!r}")

    @classmethod
    def from_env(cls) -> Durability:
        """Read ``RAYTOPICS_DURABILITY`` and ``RAYTOPICS_FSYNC_INTERVAL_S``."""
        policy = os.environ.get("RAYTOPICS_DURABILITY", cls.policy)
        interval = os.environ.get("RAYTOPICS_FSYNC_INTERVAL_S")
        if interval is None:
            return cls(policy=policy)  # type: ignore[arg-type]
        try:
            interval_s = float(interval)
        except ValueError as exc:
            raise InvalidArgumentError(
                f"RAYTOPICS_FSYNC_INTERVAL_S must be a number, got {interval!r}"
            ) from exc
        return cls(policy=policy, interval_s=interval_s)  # type: ignore[arg-type]

    @property
    def flushes(self) -> bool:
        """Whether this policy ever asks the disk to flush."""
        return self.policy != "none"


DEFAULT_DURABILITY = Durability()
