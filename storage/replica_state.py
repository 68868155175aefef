"""What a replica of a segment keeps beside its log, so that a restart forgets none of
the rules of ``runtime.replication``:

- the newest epoch it heard of: a replica fenced by an election, then restarted, must
  still refuse the leader it was fenced against (saved before the fence is answered);
- its log's epoch history: elections read its last epoch, and a leader answers a
  rejoining follower from it (saved with every change: a new epoch, a cut tail);
- the committed end it last knew: after a restart it serves readers below it at once,
  and a new leader starts from it.

One small JSON file, ``replica.json`` in the segment's directory, replaced whole
(``storage.files.atomic_write``): a crash leaves the old state or the new, never half.
A file that cannot be read is an error, never a default: a replica that forgot its
epoch would take frames from a fenced leader.
"""

from __future__ import annotations

import contextlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from runtime.errors import UnavailableError
from runtime.replication import EpochHistory
from storage.durability import Durability
from storage.files import atomic_write

FILE_NAME = "replica.json"


@dataclass(frozen=True)
class ReplicaState:
    seen_epoch: int = 0
    history: EpochHistory = field(default_factory=EpochHistory)
    high_watermark: int = 0

    def to_dict(self) -> dict[str, Any]:
        return {
            "seenEpoch": self.seen_epoch,
            "history": [[start.epoch, start.offset] for start in self.history.starts],
            "highWatermark": self.high_watermark,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ReplicaState:
        """The state a file held; ``ValueError`` when it breaks a rule of the model."""
        history = EpochHistory()
        for epoch, offset in data["history"]:
            history = history.begin(_natural(epoch), _natural(offset))
        seen, high_watermark = _natural(data["seenEpoch"]), _natural(data["highWatermark"])
        if seen < history.last_epoch:
            raise ValueError(f"seen epoch {seen} is older than its log's {history.last_epoch}")
        return cls(seen, history, high_watermark)


class ReplicaStateFile:
    """``replica.json`` of one segment's directory. Who calls: the segment, in either role
    (leader or follower), before it answers what the state decides."""

    def __init__(self, directory: Path, durability: Durability) -> None:
        self._path = Path(directory) / FILE_NAME
        self._fsync = durability.flushes

    def load(self) -> ReplicaState:
        """The saved state; a fresh one when none was ever saved."""
        with contextlib.suppress(FileNotFoundError):
            raw = self._path.read_bytes()
            try:
                return ReplicaState.from_dict(json.loads(raw))
            except (ValueError, KeyError, TypeError) as err:
                raise UnavailableError(
                    f"replica state {self._path} cannot be read ({err}): the replica must be "
                    "rebuilt from another, not trusted"
                ) from None
        return ReplicaState()

    def exists(self) -> bool:
        """Whether the segment is a replica: laid out as one (``mark_replicated``), or it
        led or followed once. A replica without a role serves no client."""
        return self._path.exists()

    def mark_replicated(self) -> None:
        """Lay a new replica's state out (no epoch seen yet), so that it serves no
        producer or reader until the controller gives it its role."""
        if not self.exists():
            self.save(ReplicaState())

    def save(self, state: ReplicaState) -> None:
        data = json.dumps(state.to_dict(), separators=(",", ":")).encode()
        atomic_write(self._path, data, fsync=self._fsync)


def _natural(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{value!r} is not a natural number")
    return value
