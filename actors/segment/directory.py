"""Which process serves a segment: the directory of segments and their hosts.

Segments share processes. A Ray actor is a whole process, with a start-up cost and
a steady cost while it idles that are Ray's own (bench/README.md, ``idle.py``), so
one process per segment made every split dearer and every idle segment a tax, and one
per topic every topic a process. The segments of a namespace's topics live in
*segment hosts* (``actors.segment.host``): one per namespace, or
``RAYTOPICS_SEGMENT_HOSTS`` per namespace, and one per node disk where every node
keeps its own (``RAYTOPICS_STORAGE_SCOPE=node``: a segment runs where its files are).

This directory maps each segment's name to its host and to what the host needs to
open it (again). A replicated segment's followers (``actors.segment.replication``) have
entries of their own, one per host, apart from the segment's: clients are sent to the
host of the segment's entry, its leader, and a follower's host reopens it from its
replica entry after a restart. Whoever starts a segment enters it before its host opens it, the
host enters it again (with its node) once open and removes it when the segment
closes (hibernates or is deleted), so an entry whose host is alive is a segment that
serves: a call that reaches the host before the segment is open, or after the host
restarted, opens it from its entry. Entries live in Ray's GCS key-value
store, beside the actors' names and as short-lived as they: in their own KV
namespace, never in the metadata store (which may be Redis, and outlives Ray).

Who calls: the starters (a topic's controller) and the hosts write entries, the hosts
remove them (and mark themselves closing before a host that serves nothing exits);
lookups (``actors.segment.lookup``), readiness and capacity read them; a topic's
controller removes a whole topic's when it clears what an earlier incarnation left.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import asdict, dataclass, replace
from typing import Any

from runtime.config import ray_namespace
from runtime.names import SegmentName, TopicName
from storage.metadata import GcsKeyValue, KeyValue


@dataclass(frozen=True)
class Entry:
    """A segment's host and how that host opens it (the arguments a restart needs);
    ``failed``: why the host could not open it (its storage is gone), until it is opened
    anew."""

    host: str
    node: str
    storage_root: str
    durability: dict[str, Any]
    incarnation: str
    failed: str | None = None
    # When its starter entered it (ns since the epoch, the ``at`` of its ``Opening``): a
    # close issued before that is about an earlier opening and must not remove it.
    entered_at: int = 0
    replica: bool = False  # a follower's entry, not the one clients are sent to

    def serves(self, hosts_alive: set[str]) -> bool:
        """Whether the segment is served: its host is alive and did not fail to open it."""
        return self.host in hosts_alive and self.failed is None

    def to_bytes(self) -> bytes:
        return json.dumps(asdict(self), sort_keys=True).encode()

    @classmethod
    def from_bytes(cls, raw: bytes) -> Entry:
        return cls(**json.loads(raw))


class SegmentDirectory:
    """The entries of one Ray namespace's segments, in a ``KeyValue``."""

    def __init__(self, kv: KeyValue | None = None) -> None:
        self._kv = kv if kv is not None else GcsKeyValue(f"raytopics-hosts/{ray_namespace()}")

    def get(self, segment: SegmentName) -> Entry | None:
        """The entry clients are sent to: the segment's, or its leader's."""
        raw = self._kv.get(_key(segment))
        return Entry.from_bytes(raw) if raw is not None else None

    def get_replica(self, segment: SegmentName, host: str) -> Entry | None:
        """The entry of ``segment``'s follower in ``host``."""
        raw = self._kv.get(_replica_key(segment, host))
        return Entry.from_bytes(raw) if raw is not None else None

    def put(self, segment: SegmentName, entry: Entry) -> None:
        """Enter ``entry``: the segment's own, or (``entry.replica``) its host's follower."""
        key = _replica_key(segment, entry.host) if entry.replica else _key(segment)
        self._kv.put(key, entry.to_bytes(), True)

    def promote(self, segment: SegmentName, host: str, at: int) -> None:
        """Send ``segment``'s clients to its follower in ``host`` (elected its leader): that
        follower's entry becomes the segment's, and the replaced leader's becomes a
        follower's of its own host, so a restart of either reopens what it now is."""
        replaced = self.get(segment)
        if replaced is not None and replaced.host == host:
            return  # it leads from the host clients are sent to already
        promoted = self.get_replica(segment, host)
        if promoted is None:
            raise ValueError(f"{segment} has no follower in {host}")
        self._kv.delete(_replica_key(segment, host))
        self.put(segment, replace(promoted, replica=False, entered_at=at))
        if replaced is not None and replaced.host != host:
            self.put(segment, replace(replaced, replica=True))

    def remove(self, segment: SegmentName, host: str, issued_at: int | None = None) -> None:
        """Remove ``segment``'s entry if ``host`` still owns it (a segment moved to another
        host, a hibernated tiered one woken elsewhere, keeps the newer entry) and, for a
        close ``issued_at`` a time, if it was entered before then (a segment started again
        under the same name, a re-created topic's, keeps the newer entry even where the
        host has not opened it yet when the older close arrives)."""
        for key in (_key(segment), _replica_key(segment, host)):
            raw = self._kv.get(key)
            entry = Entry.from_bytes(raw) if raw is not None else None
            if entry is None or entry.host != host:
                continue
            if issued_at is None or entry.entered_at <= issued_at:
                self._kv.delete(key)

    def of_topic(self, topic: TopicName) -> dict[str, Entry]:
        """Every entry of ``topic``'s segments, by segment actor name."""
        return self._entries(_topic_prefix(topic))

    def remove_topic(self, topic: TopicName) -> None:
        self._kv.delete(_topic_prefix(topic), by_prefix=True)
        self._kv.delete(_REPLICA + _topic_prefix(topic), by_prefix=True)

    def names_host(self, namespace_path: str, host: str) -> bool:
        """Whether an entry of a segment of namespace ``namespace_path`` names ``host``:
        a segment it serves, will open on its first call, or is about to be opened in it."""
        prefix = f"segment:{namespace_path}/".encode()
        entries = [*self._entries(prefix).values(), *self._entries(_REPLICA + prefix).values()]
        return any(entry.host == host for entry in entries)

    # A host that serves nothing exits (``SegmentHost.exit_if_idle``) while a starter may
    # be entering a segment in it. The host marks itself closing, then looks for entries
    # naming it; a starter enters its segment, then looks for the mark. Whichever comes
    # second sees the other: a host that sees an entry stays (and lifts its mark), a
    # starter that sees the mark waits to learn which (``actors.segment.host``).

    def mark_closing(self, host: str) -> None:
        self._kv.put(_closing_key(host), b"1", True)

    def unmark_closing(self, host: str) -> None:
        self._kv.delete(_closing_key(host))

    def closing(self, host: str) -> bool:
        return self._kv.get(_closing_key(host)) is not None

    def per_node(self, hosts_alive: set[str]) -> Counter[str]:
        """Segments served per node id, counting only those whose host is in ``hosts_alive``."""
        entries = [*self._entries(b"segment:").values(), *self._entries(_REPLICA).values()]
        return Counter(entry.node for entry in entries if entry.serves(hosts_alive))

    def _entries(self, prefix: bytes) -> dict[str, Entry]:
        found = self._kv.get_many(self._kv.keys(prefix))
        return {key.decode(): Entry.from_bytes(raw) for key, raw in found.items()}


_REPLICA = b"replica:"


def _key(segment: SegmentName) -> bytes:
    return segment.actor_name.encode()


def _replica_key(segment: SegmentName, host: str) -> bytes:
    return _REPLICA + f"{segment.actor_name}@{host}".encode()


def _closing_key(host: str) -> bytes:
    return f"closing:{host}".encode()


def _topic_prefix(topic: TopicName) -> bytes:
    return f"segment:{topic.short}/".encode()
