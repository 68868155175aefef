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


def default_storage_root() -> Path:
    """Where segment logs live unless the deployment says otherwise."""
    configured = os.environ.get("RAYTOPICS_STORAGE_ROOT")
    if configured:
        return Path(configured)
    return Path(platformdirs.user_data_dir("raytopics")) / "segments"


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
