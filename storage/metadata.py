"""Versioned metadata store over Ray's GCS key-value store, with compare-and-swap.

GCS KV offers only get/put/delete/list plus one atomic primitive: put-if-absent.
Compare-and-swap is built from it without any central actor:

* A path's value lives in a chain of immutable version slots
  ``{path}#g{generation}#v{seq}``. Moving from version ``n`` to ``n+1`` is an
  atomic put-if-absent on slot ``n+1``, so exactly one writer wins each step.
* A generation pointer ``{path}#gen`` (also created with put-if-absent) names
  the live chain. Deleting a path removes the pointer first, so a writer still
  holding a version of the old chain can never touch a re-created path (no ABA).
* Superseded slots are compacted in place to a tiny marker rather than
  deleted: a deleted slot could be re-filled by a late writer, a compacted one
  never can, so every step of the chain is decided exactly once.

Only this module touches ``ray.experimental.internal_kv``, through ``GcsKeyValue``;
``MemoryKeyValue`` offers the same four primitives in a dict, so the rules built on
them (compare-and-swap, fencing, the catalog's records) are also tested without Ray.
"""

from __future__ import annotations

import contextlib
import random
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from ray.experimental import internal_kv as kv

from runtime.errors import AlreadyExistsError, BadVersion, KeyNotFoundError

DEFAULT_KV_NAMESPACE = "scalable-topics"
# Where a Ray head records the backend of its GCS tables, and so of every path
# here (ray/_private/node.py ``_record_stats``): "memory", "redis" or "rocksdb".
_USAGE_NAMESPACE = b"usage_stats"
_GCS_STORAGE_TAG = b"extra_usage_tag_gcs_storage"
METADATA_BACKENDS = ("rocksdb", "redis", "memory")
DURABLE_BACKENDS = ("rocksdb", "redis")
_SEP = "#"
_GEN = f"{_SEP}gen"
_COMPACTED = b"\x00compacted"


class KeyValue(Protocol):
    """The primitives GCS KV offers, on one namespace's keys."""

    def get(self, key: bytes) -> bytes | None: ...

    def put(self, key: bytes, value: bytes, overwrite: bool) -> bool:
        """Whether ``key`` existed already (then, without ``overwrite``, nothing is
        written): atomic, the one primitive compare-and-swap is built on."""
        ...

    def delete(self, key: bytes, *, by_prefix: bool = False) -> None: ...

    def keys(self, prefix: bytes) -> list[bytes]: ...

    def get_many(self, keys: list[bytes]) -> dict[bytes, bytes]:
        """The values of those of ``keys`` that exist, in one round trip."""
        ...


class GcsKeyValue:
    """Ray's GCS key-value store (the process must be connected to Ray)."""

    def __init__(self, namespace: str) -> None:
        self.namespace = namespace

    def get(self, key: bytes) -> bytes | None:
        return kv._internal_kv_get(key, namespace=self.namespace)

    def put(self, key: bytes, value: bytes, overwrite: bool) -> bool:
        return kv._internal_kv_put(key, value, overwrite, namespace=self.namespace)

    def delete(self, key: bytes, *, by_prefix: bool = False) -> None:
        kv._internal_kv_del(key, del_by_prefix=by_prefix, namespace=self.namespace)

    def keys(self, prefix: bytes) -> list[bytes]:
        return kv._internal_kv_list(prefix, namespace=self.namespace)

    def get_many(self, keys: list[bytes]) -> dict[bytes, bytes]:
        if not keys:
            return {}
        client = kv.internal_kv_get_gcs_client()
        return client.internal_kv_multi_get(keys, namespace=self.namespace.encode())


class MemoryKeyValue:
    """The same primitives in this process's memory, each atomic (unit tests)."""

    def __init__(self) -> None:
        self._data: dict[bytes, bytes] = {}
        self._lock = threading.Lock()

    def get(self, key: bytes) -> bytes | None:
        with self._lock:
            return self._data.get(key)

    def put(self, key: bytes, value: bytes, overwrite: bool) -> bool:
        with self._lock:
            existed = key in self._data
            if overwrite or not existed:
                self._data[key] = value
            return existed

    def delete(self, key: bytes, *, by_prefix: bool = False) -> None:
        with self._lock:
            for found in [k for k in self._data if k.startswith(key)] if by_prefix else [key]:
                self._data.pop(found, None)

    def keys(self, prefix: bytes) -> list[bytes]:
        with self._lock:
            return [k for k in self._data if k.startswith(prefix)]

    def get_many(self, keys: list[bytes]) -> dict[bytes, bytes]:
        with self._lock:
            return {k: self._data[k] for k in keys if k in self._data}


@dataclass(frozen=True, order=True)
class Version:
    """Opaque CAS token: the chain a value belongs to and its position in it."""

    generation: str
    seq: int

    def __str__(self) -> str:
        return f"{self.generation}:{self.seq}"


@dataclass(frozen=True)
class Versioned:
    value: bytes
    version: Version


class MetadataStore:
    """get / put_if_absent / compare_and_swap / delete / list over GCS KV (or, given
    ``kv``, over another ``KeyValue``)."""

    def __init__(self, namespace: str = DEFAULT_KV_NAMESPACE, kv: KeyValue | None = None) -> None:
        self.namespace = namespace
        self._kv: KeyValue = kv if kv is not None else GcsKeyValue(namespace)

    # --- reads ---------------------------------------------------------------

    def get(self, path: str) -> Versioned | None:
        """Latest value and its version, or ``None`` when the path does not exist."""
        for _ in range(100):
            generation = self._generation(path)
            if generation is None:
                return None
            seq = self._latest_seq(path, generation)
            if seq is None:
                continue  # created or deleted under us: read again
            value = self._get(_slot(path, generation, seq))
            if value is not None and value != _COMPACTED:
                return Versioned(value, Version(generation, seq))
        raise BadVersion(f"could not read a stable version of {path} (constant contention)")

    def get_all(self, prefix: str) -> dict[str, Versioned]:
        """Every existing path that starts with ``prefix``, as ``get`` reads each, in
        three reads of the store however many there are (``get`` costs three each): for
        a controller's round over all of a topic's segment records. A path that changed
        between the reads (its latest value superseded, or its chain replaced) is read
        again alone; one deleted meanwhile is left out."""
        keys = self._kv.keys(prefix.encode())
        suffix = _GEN.encode()
        paths = sorted(k[: -len(suffix)].decode() for k in keys if k.endswith(suffix))
        generations = self._kv.get_many([_gen_key(p).encode() for p in paths])
        latest: dict[str, Version] = {}
        for path in paths:
            generation = generations.get(_gen_key(path).encode())
            if generation is None:
                continue  # deleted since the listing
            chain = f"{path}{_SEP}g{generation.decode()}{_SEP}v".encode()
            seqs = [int(k[len(chain) :]) for k in keys if k.startswith(chain)]
            latest[path] = Version(generation.decode(), max(seqs, default=0))
        slots = {p: _slot(p, v.generation, v.seq).encode() for p, v in latest.items() if v.seq}
        values = self._kv.get_many(list(slots.values()))
        found = {}
        for path, version in latest.items():
            value = values.get(slots[path]) if path in slots else None
            if value is not None and value != _COMPACTED:
                found[path] = Versioned(value, version)
            elif (again := self.get(path)) is not None:
                found[path] = again
        return found

    def get_required(self, path: str) -> Versioned:
        found = self.get(path)
        if found is None:
            raise KeyNotFoundError(f"metadata path {path} does not exist")
        return found

    def exists(self, path: str) -> bool:
        return self._generation(path) is not None

    def list(self, prefix: str) -> list[str]:
        """Every existing path that starts with ``prefix``, sorted."""
        keys = self._kv.keys(prefix.encode())
        suffix = _GEN.encode()
        return sorted(k[: -len(suffix)].decode() for k in keys if k.endswith(suffix))

    def children(self, path: str) -> list[str]:
        """Names of the direct children of ``path`` (``/a/b`` -> ``c`` for ``/a/b/c``)."""
        base = path.rstrip("/") + "/"
        names = {p[len(base) :].split("/", 1)[0] for p in self.list(base)}
        return sorted(n for n in names if n and self.exists(base + n))

    # --- writes --------------------------------------------------------------

    def put_if_absent(self, path: str, value: bytes) -> Version:
        """Create ``path``; ``AlreadyExistsError`` if it exists (atomically)."""
        generation = f"{time.time_ns():x}{uuid.uuid4().hex[:8]}"
        first = _slot(path, generation, 1)
        self._put(first, value, overwrite=True)
        if self._put(_gen_key(path), generation.encode(), overwrite=False):
            self._del(first)
            raise AlreadyExistsError(f"metadata path {path} already exists")
        return Version(generation, 1)

    def compare_and_swap(self, path: str, expected: Version, value: bytes) -> Version:
        """Write ``value`` iff ``expected`` is still the latest version; else ``BadVersion``."""
        current = self._get(_slot(path, expected.generation, expected.seq))
        if current is None or current == _COMPACTED:
            raise BadVersion(f"{path}: version {expected} is no longer current")
        new = Version(expected.generation, expected.seq + 1)
        slot = _slot(path, new.generation, new.seq)
        if self._put(slot, value, overwrite=False):
            raise BadVersion(f"{path}: version {expected} lost a concurrent update")
        if self._generation(path) != new.generation:
            self._del(slot)  # the path was deleted under us: the write never happened
            raise KeyNotFoundError(f"metadata path {path} was deleted concurrently")
        if expected.seq > 1:
            self._put(_slot(path, expected.generation, expected.seq - 1), _COMPACTED, True)
        return new

    def update(
        self, path: str, mutate: Callable[[bytes], bytes | None], *, attempts: int = 200
    ) -> Versioned:
        """Read-modify-CAS, retried from a fresh read whenever a concurrent writer wins;
        ``mutate`` returning ``None`` changes nothing (the current value is returned)."""
        for attempt in range(attempts):
            current = self.get_required(path)
            value = mutate(current.value)
            if value is None:
                return current
            try:
                return Versioned(value, self.compare_and_swap(path, current.version, value))
            except BadVersion:
                time.sleep(random.uniform(0, 0.001 * min(attempt + 1, 20)))
        raise BadVersion(f"{path}: gave up after {attempts} contended update attempts")

    def delete(self, path: str, expected: Version | None = None) -> None:
        """Remove ``path``; with ``expected``, only if that is still the latest version."""
        generation = self._generation(path)
        if generation is None:
            raise KeyNotFoundError(f"metadata path {path} does not exist")
        if expected is not None:
            latest = self.get(path)
            if latest is None or latest.version != expected:
                raise BadVersion(f"{path}: version {expected} is no longer current")
        self._del(_gen_key(path))
        self._kv.delete(f"{path}{_SEP}g{generation}{_SEP}".encode(), by_prefix=True)

    def delete_tree(self, path: str) -> None:
        """Remove ``path`` and every path below it (best effort, idempotent)."""
        for sub in sorted(self.list(path.rstrip("/") + "/"), reverse=True) + [path]:
            with contextlib.suppress(KeyNotFoundError):
                self.delete(sub)

    # --- internals -----------------------------------------------------------

    def _generation(self, path: str) -> str | None:
        raw = self._get(_gen_key(path))
        return raw.decode() if raw is not None else None

    def _seqs(self, path: str, generation: str) -> list[int]:
        prefix = f"{path}{_SEP}g{generation}{_SEP}v".encode()
        keys = self._kv.keys(prefix)
        return [int(k[len(prefix) :]) for k in keys]

    def _latest_seq(self, path: str, generation: str) -> int | None:
        seqs = self._seqs(path, generation)
        return max(seqs) if seqs else None

    def _get(self, key: str) -> bytes | None:
        return self._kv.get(key.encode())

    def _put(self, key: str, value: bytes, overwrite: bool) -> bool:
        return self._kv.put(key.encode(), value, overwrite)

    def _del(self, key: str) -> None:
        self._kv.delete(key.encode())


def metadata_backend() -> str:
    """Where the connected cluster's GCS keeps metadata: ``"rocksdb"`` or ``"redis"``
    (both outlive the head), ``"memory"`` (lost when the head restarts), or
    ``"unknown"`` (not connected, or a head that did not record it)."""
    if not kv._internal_kv_initialized():
        return "unknown"
    raw = kv._internal_kv_get(_GCS_STORAGE_TAG, namespace=_USAGE_NAMESPACE)
    backend = raw.decode(errors="replace") if raw else ""
    return backend if backend in METADATA_BACKENDS else "unknown"


def metadata_durability() -> dict[str, Any]:
    """Where the connected cluster keeps its metadata and whether that outlives its
    head: ``{"backend": "rocksdb" | "redis" | "memory" | "unknown", "durable": bool}``
    (``durable`` only when known to be)."""
    backend = metadata_backend()
    return {"backend": backend, "durable": backend in DURABLE_BACKENDS}


def _gen_key(path: str) -> str:
    return f"{path}{_GEN}"


def _slot(path: str, generation: str, seq: int) -> str:
    return f"{path}{_SEP}g{generation}{_SEP}v{seq:020d}"
