"""Where a topic's storage lives on disk, and the identity it carries there.

Under the storage root every topic *incarnation* has its own directory::

    {root}/{tenant}/{namespace}/{topic}/{incarnation}/topic.json
    {root}/{tenant}/{namespace}/{topic}/{incarnation}/{descriptor}/segment.json
    {root}/{tenant}/{namespace}/{topic}/{incarnation}/{descriptor}/log/...     (storage.segment_log)
    {root}/{tenant}/{namespace}/{topic}/{incarnation}/{descriptor}/cursors/... (storage.cursors)

Why an incarnation: a topic name outlives its topics. Metadata can be lost, a
topic deleted while a node was away, a name re-created; storage named by the
topic alone would then be adopted by whatever topic next carries the name and
serve its messages as the new topic's. The incarnation id is issued when a
topic is created, kept in its metadata record, and names the directory its
segments open, so a new incarnation always starts empty and never sees another
one's files.

Why the identity files: metadata lives in the GCS and can be lost on its own
(an in-memory GCS restarted, a KV wiped). Each segment therefore keeps its own
``SegmentInfo`` (range, parents, children, state, epochs) and each incarnation
the topic-level facts the segments cannot know (properties, policy, the last
layout epoch, subscription settings), which is everything ``runtime.recovery``
needs to rebuild the topic's metadata from storage alone.
"""

from __future__ import annotations

import contextlib
import json
import re
import secrets
import shutil
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from runtime.config import ray_namespace
from runtime.errors import AmbiguousStorageError, StorageNotFoundError, UnavailableError
from runtime.layout import SegmentInfo
from runtime.names import SegmentName, TopicName, is_valid_part
from runtime.recovery import StoredSegmentState
from runtime.subscription import DEFAULT_GRACE_S, StartPosition
from storage.cursors import stored_subscriptions
from storage.files import atomic_write
from storage.tier import delete_tiered_copies

TOPIC_FILE = "topic.json"
SEGMENT_FILE = "segment.json"
FENCE_FILE = "fence.json"  # the newest controller epoch a segment has seen
INCARNATION_PATTERN = r"\d{8}T\d{6}Z-[0-9a-f]{8}"
_INCARNATION = re.compile(INCARNATION_PATTERN)
_DESCRIPTOR = re.compile(r"[0-9a-f]{4}-[0-9a-f]{4}-\d+")
_R = TypeVar("_R", bound=BaseModel)


def new_incarnation() -> str:
    """A fresh incarnation id; ids sort by creation time, so listings read oldest first."""
    return f"{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}-{secrets.token_hex(4)}"


def is_incarnation(value: str) -> bool:
    return isinstance(value, str) and _INCARNATION.fullmatch(value) is not None


def topic_directory(root: Path, topic: TopicName) -> Path:
    return Path(root) / topic.tenant / topic.namespace / topic.topic


def incarnation_directory(root: Path, topic: TopicName, incarnation: str) -> Path:
    if not is_incarnation(incarnation):
        raise ValueError(f"invalid incarnation id {incarnation!r}")
    return topic_directory(root, topic) / incarnation


def segment_directory(root: Path, name: SegmentName, incarnation: str) -> Path:
    return incarnation_directory(root, name.topic, incarnation) / name.descriptor


# --- identity records ------------------------------------------------------------------------


class _Record(BaseModel):
    model_config = ConfigDict(frozen=True, populate_by_name=True, extra="forbid")


class SubscriptionSettings(_Record):
    """What a subscription was created with; its position lives in the cursors."""

    position: StartPosition = "earliest"
    session_grace_s: float = Field(default=DEFAULT_GRACE_S, alias="sessionGraceS", gt=0)


class TopicIdentity(_Record):
    """``topic.json``: one incarnation's topic-level facts, rewritten by its controller."""

    topic: str
    incarnation: str
    ray_namespace: str = Field(alias="rayNamespace")
    created_at_ms: int = Field(alias="createdAtMs")
    epoch: int = Field(default=0, ge=0, description="the last committed layout epoch")
    next_segment_id: int = Field(default=0, alias="nextSegmentId", ge=0)
    properties: dict[str, str] = Field(default_factory=dict)
    policy: dict[str, Any] | None = None
    subscriptions: dict[str, SubscriptionSettings] = Field(default_factory=dict)
    deleting: bool = False


class SegmentIdentity(_Record):
    """``segment.json``: whose storage this is and the segment's place in the DAG.

    ``in_layout`` is false for a segment made through the low-level Segments API
    outside the topic's layout: recovery leaves it out of the DAG.
    """

    topic: str
    incarnation: str
    in_layout: bool = Field(default=True, alias="inLayout")
    info: SegmentInfo


def write_topic_identity(root: Path, identity: TopicIdentity) -> None:
    topic = TopicName.parse(identity.topic)
    directory = incarnation_directory(root, topic, identity.incarnation)
    directory.mkdir(parents=True, exist_ok=True)
    atomic_write(directory / TOPIC_FILE, identity.model_dump_json(by_alias=True).encode())


def read_topic_identity(directory: Path) -> TopicIdentity | None:
    return _read(directory / TOPIC_FILE, TopicIdentity)


def write_segment_identity(directory: Path, identity: SegmentIdentity) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    atomic_write(directory / SEGMENT_FILE, identity.model_dump_json(by_alias=True).encode())


def read_segment_identity(directory: Path) -> SegmentIdentity | None:
    return _read(directory / SEGMENT_FILE, SegmentIdentity)


def _read(path: Path, model: type[_R]) -> _R | None:
    try:
        raw = path.read_bytes()
    except (FileNotFoundError, NotADirectoryError):
        return None
    try:
        return model.model_validate_json(raw)
    except ValidationError as err:
        raise UnavailableError(f"{path} is not a valid {model.__name__}: {err}") from None


# --- scanning (storage check and recovery) ---------------------------------------------------


@dataclass
class StoredSegment:
    """One segment directory of an incarnation, as found on disk."""

    descriptor: str
    directory: Path
    identity: SegmentIdentity | None
    size_bytes: int
    last_write_ms: int | None


@dataclass
class StoredIncarnation:
    """One incarnation's directory. ``incarnation`` is ``None`` for storage written before
    incarnations existed (``{topic}/{descriptor}`` directly), which can be listed and
    deleted but not recovered: it carries no identity."""

    topic: TopicName
    incarnation: str | None
    directory: Path
    identity: TopicIdentity | None
    segments: list[StoredSegment] = field(default_factory=list)

    @property
    def size_bytes(self) -> int:
        return sum(s.size_bytes for s in self.segments)

    @property
    def last_write_ms(self) -> int | None:
        times = [s.last_write_ms for s in self.segments if s.last_write_ms is not None]
        if self.identity is not None:
            times.append(_mtime_ms(self.directory / TOPIC_FILE) or 0)
        return max(times) if times else None

    @property
    def ray_namespace(self) -> str | None:
        return self.identity.ray_namespace if self.identity is not None else None

    @property
    def removable(self) -> list[Path]:
        """What deleting this storage removes: the incarnation's directory, or a legacy
        topic's segment directories (its topic directory may hold incarnations too)."""
        if self.incarnation is not None:
            return [self.directory]
        return [s.directory for s in self.segments]

    def describe(self) -> dict[str, Any]:
        """The storage check's JSON row for this incarnation."""
        return {
            "topic": str(self.topic),
            "incarnation": self.incarnation,
            "rayNamespace": self.ray_namespace,
            "segments": len(self.segments),
            "sizeBytes": self.size_bytes,
            "lastWriteMs": self.last_write_ms,
            "path": str(self.directory),
        }


def scan(root: Path, topic: TopicName | None = None) -> list[StoredIncarnation]:
    """Every incarnation stored under ``root`` (of ``topic`` only, when given), sorted."""
    found: list[StoredIncarnation] = []
    for name in [topic] if topic is not None else _topic_names(Path(root)):
        directory = topic_directory(root, name)
        if not directory.is_dir():
            continue
        legacy = StoredIncarnation(name, None, directory, None)
        for entry in sorted(directory.iterdir()):
            if is_incarnation(entry.name) and entry.is_dir():
                found.append(_incarnation(name, entry))
            elif _DESCRIPTOR.fullmatch(entry.name) and entry.is_dir():
                legacy.segments.append(_segment(entry))
        if legacy.segments:
            found.append(legacy)
    return found


def choose_incarnation(
    stored: list[StoredIncarnation],
    topic: TopicName,
    incarnation: str | None = None,
    namespace: str | None = None,
) -> StoredIncarnation:
    """The incarnation of ``topic`` to recover: the one asked for, or the only one.

    Storage another deployment (Ray namespace) wrote under a shared root is never
    a candidate, nor storage from before incarnations (it carries no identity).
    Several candidates and no choice is refused, listing them: picking one
    silently could resurrect a topic that was deleted on purpose.
    """
    namespace = namespace or ray_namespace()
    candidates = [
        s
        for s in stored
        if s.topic == topic
        and s.incarnation is not None
        and (s.identity is None or s.identity.ray_namespace == namespace)
    ]
    if incarnation is not None:
        for candidate in candidates:
            if candidate.incarnation == incarnation:
                return candidate
        raise StorageNotFoundError(
            f"no storage of incarnation {incarnation!r} of {topic} to recover; "
            f"found: {_listing(candidates) or 'none'}"
        )
    if not candidates:
        raise StorageNotFoundError(f"no storage of {topic} to recover under the storage root")
    if len(candidates) > 1:
        raise AmbiguousStorageError(
            f"storage of {len(candidates)} incarnations of {topic} exists: "
            f"{_listing(candidates)}; say which one to recover (--incarnation ID, "
            "or recover_topic(topic, incarnation=ID))",
            [c.incarnation for c in candidates if c.incarnation is not None],
        )
    return candidates[0]


def _listing(stored: list[StoredIncarnation]) -> str:
    return "; ".join(
        f"{s.incarnation} ({len(s.segments)} segments, {s.size_bytes} bytes, "
        f"last write {written_at(s.last_write_ms)})"
        for s in stored
    )


def written_at(epoch_ms: int | None) -> str:
    """A last-write time as the storage check shows it (UTC), ``never`` for none."""
    if epoch_ms is None:
        return "never"
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(epoch_ms / 1000))


def delete_storage(directory: Path) -> None:
    """Remove one incarnation's (or a legacy topic's, or a segment's) storage, tiered
    copies first, then prune empty parents."""
    delete_tiered_copies(directory)
    shutil.rmtree(directory, ignore_errors=True)
    for parent in list(directory.parents)[:3]:
        with contextlib.suppress(OSError):
            parent.rmdir()  # only succeeds once empty


def _topic_names(root: Path) -> Iterator[TopicName]:
    if not root.is_dir():
        return
    for tenant in sorted(root.iterdir()):
        if not (is_valid_part(tenant.name) and tenant.is_dir()):
            continue  # e.g. the embedded metadata store's '.metadata'
        for namespace in sorted(p for p in tenant.iterdir() if p.is_dir()):
            for topic in sorted(p for p in namespace.iterdir() if p.is_dir()):
                if is_valid_part(namespace.name) and is_valid_part(topic.name):
                    yield TopicName(tenant.name, namespace.name, topic.name)


def _incarnation(topic: TopicName, directory: Path) -> StoredIncarnation:
    stored = StoredIncarnation(topic, directory.name, directory, read_topic_identity(directory))
    for entry in sorted(directory.iterdir()):
        if _DESCRIPTOR.fullmatch(entry.name) and entry.is_dir():
            stored.segments.append(_segment(entry))
    return stored


def _segment(directory: Path) -> StoredSegment:
    size, newest = 0, None
    for path in directory.rglob("*"):
        with contextlib.suppress(FileNotFoundError):
            status = path.stat()
            if path.is_file():
                size += status.st_size
                newest = max(newest or 0, int(status.st_mtime * 1000))
    identity = None
    with contextlib.suppress(UnavailableError):
        identity = read_segment_identity(directory)
    return StoredSegment(directory.name, directory, identity, size, newest)


def _mtime_ms(path: Path) -> int | None:
    try:
        return int(path.stat().st_mtime * 1000)
    except FileNotFoundError:
        return None


def stored_states(stored: StoredIncarnation) -> list[StoredSegmentState]:
    """What each segment of a stored incarnation says about itself, for recovery."""
    return [state for _, state in segment_states(stored)]


def segment_states(stored: StoredIncarnation) -> list[tuple[StoredSegment, StoredSegmentState]]:
    """Each segment of a stored incarnation with what it says about itself.

    Segments without an identity were being laid out when their operation was
    cut short (identity is written first), and segments made outside the layout
    (the low-level Segments API) are not part of the DAG: both are left out.
    """
    states = []
    for segment in stored.segments:
        identity = segment.identity
        if identity is None or not identity.in_layout:
            continue
        if (identity.topic, identity.incarnation) != (str(stored.topic), stored.incarnation):
            raise UnavailableError(
                f"{segment.directory} says it belongs to {identity.topic} (incarnation "
                f"{identity.incarnation}), not {stored.topic} ({stored.incarnation})"
            )
        state = StoredSegmentState(
            identity.info,
            tuple(stored_subscriptions(segment.directory)),
            stored_fence_epoch(segment.directory),
        )
        states.append((segment, state))
    return states


def merge_incarnations(copies: list[StoredIncarnation]) -> list[StoredIncarnation]:
    """One incarnation per name from its copies on several disks (storage scope ``node``):
    the identity with the newest epoch (the controller's own disk keeps ``topic.json``,
    and a controller that moved wrote another), every segment once; the directory is the
    first copy's, for listings."""
    merged: dict[tuple[str, str | None], StoredIncarnation] = {}
    for copy in copies:
        key = (str(copy.topic), copy.incarnation)
        found = merged.get(key)
        if found is None:
            merged[key] = StoredIncarnation(
                copy.topic, copy.incarnation, copy.directory, copy.identity, list(copy.segments)
            )
            continue
        if copy.identity is not None and (
            found.identity is None or copy.identity.epoch > found.identity.epoch
        ):
            found.identity = copy.identity
        held = {segment.descriptor for segment in found.segments}
        found.segments += [s for s in copy.segments if s.descriptor not in held]
    return [merged[key] for key in sorted(merged, key=lambda k: (k[0], k[1] or ""))]


def stored_fence_epoch(directory: Path) -> int:
    """The newest controller epoch a segment's storage has seen (0: none yet)."""
    try:
        return int(json.loads((Path(directory) / FENCE_FILE).read_bytes())["fenceEpoch"])
    except (FileNotFoundError, NotADirectoryError):
        return 0
