"""The metadata store's compare-and-swap, on Ray's GCS KV and on the in-memory KV with
the same primitives: the rules built on them (versions decided once, no ABA after a
delete, fencing of a stale controller) hold on both, and on the latter without Ray."""

import threading
from collections.abc import Callable

import pytest
import ray

from runtime.errors import AlreadyExistsError, BadVersion, KeyNotFoundError, StaleEpochError
from runtime.layout import SegmentLayout
from runtime.names import TopicName
from storage.catalog import Catalog, fenced
from storage.metadata import MemoryKeyValue, MetadataStore
from storage.records import TopicRecord
from storage.topic_storage import new_incarnation


@ray.remote(num_cpus=0.25, max_retries=0)
def increment(path: str, times: int) -> int:
    """Raw read-modify-CAS loop: retried from a fresh read on every lost race."""
    store, lost = MetadataStore(), 0
    for _ in range(times):
        while True:
            current = store.get(path)
            try:
                store.compare_and_swap(path, current.version, str(int(current.value) + 1).encode())
                break
            except BadVersion:
                lost += 1
    return lost


def test_cas_under_contention_is_linearizable(ray_cluster, unique):
    store, path = MetadataStore(), f"/test/counter-{unique}"
    store.put_if_absent(path, b"0")
    lost = ray.get([increment.remote(path, 50) for _ in range(8)])
    assert store.get(path).value == b"400"
    assert store.get(path).version.seq == 401
    print("lost races:", sum(lost))


def test_cas_under_contention_is_linearizable_in_memory():
    """Threads race read-modify-CAS loops on the in-memory KV: every increment lands once."""
    store, path = MetadataStore(kv=MemoryKeyValue()), "/test/counter"
    store.put_if_absent(path, b"0")

    def increment(times: int) -> None:
        for _ in range(times):
            store.update(path, lambda raw: str(int(raw) + 1).encode())

    threads = [threading.Thread(target=increment, args=(100,)) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert store.get(path).value == b"800" and store.get(path).version.seq == 801


def test_store_semantics(ray_cluster, unique):
    check_store_semantics(MetadataStore(), unique)


def test_store_semantics_in_memory():
    check_store_semantics(MetadataStore(kv=MemoryKeyValue()), "memory")


def test_a_stale_controller_is_fenced_off_in_memory():
    """The controller's authority without Ray: each election raises the epoch, and a
    change made under an older one is refused and leaves the record as it was."""
    catalog = Catalog(store=MetadataStore(kv=MemoryKeyValue()))
    topic = TopicName.parse("topic://t/ns/fenced")
    old = catalog.elect(topic)
    record = TopicRecord.new(SegmentLayout.initial(2), new_incarnation(), old)
    catalog.create_topic(topic, record)
    new = catalog.elect(topic)
    assert new == old + 1 and catalog.elect(topic, at_least=10) == 10
    catalog.update_topic(topic, fenced(10, topic, lambda r: r.model_copy(update={"epoch": 1})))
    with pytest.raises(StaleEpochError, match="stale"):
        catalog.update_topic(topic, fenced(new, topic, lambda r: r.model_copy(update={"epoch": 2})))
    assert catalog.require_topic(topic).epoch == 1
    assert catalog.require_topic(topic).controller_epoch == 10


def test_every_topic_of_every_namespace_is_listed_and_nothing_else():
    """``all_topics`` names the topics whose records exist, not the namespaces or the
    records a topic owns, nor a topic of which only such records are left."""
    catalog = Catalog(store=MetadataStore(kv=MemoryKeyValue()))
    topics = [TopicName.parse(n) for n in ("topic://a/x/one", "topic://a/y/two", "topic://b/x/one")]
    for topic in topics:
        catalog.create_topic(topic, TopicRecord.new(SegmentLayout.initial(1), new_incarnation(), 1))
        catalog.elect(topic)
    catalog.ensure_group(topics[0], "group", 5.0)
    assert catalog.all_topics() == topics
    catalog.delete_topic(topics[1])
    catalog.elect(topics[1])  # a leftover leadership record is not a topic
    assert catalog.all_topics() == [topics[0], topics[2]]


def check_store_semantics(store: MetadataStore, unique: str) -> None:
    path = f"/test/{unique}/a"
    assert store.get(path) is None
    v1 = store.put_if_absent(path, b"one")
    with pytest.raises(AlreadyExistsError):
        store.put_if_absent(path, b"again")
    v2 = store.compare_and_swap(path, v1, b"two")
    with pytest.raises(BadVersion):
        store.compare_and_swap(path, v1, b"stale")
    assert store.get(path).value == b"two"
    v3 = store.compare_and_swap(path, v2, b"three")
    v4 = store.compare_and_swap(path, v3, b"four")
    with pytest.raises(BadVersion):  # v1's slot was compacted: can never be re-filled
        store.compare_and_swap(path, v1, b"stale")
    assert store.get(path).value == b"four" and store.get(path).version == v4

    store.put_if_absent(f"/test/{unique}/b", b"x")
    store.put_if_absent(f"/test/{unique}/b/c", b"y")
    assert store.list(f"/test/{unique}/") == [path, f"/test/{unique}/b", f"/test/{unique}/b/c"]
    assert store.children(f"/test/{unique}") == ["a", "b"]

    with pytest.raises(BadVersion):
        store.delete(path, expected=v3)
    store.delete(path, expected=v4)
    assert store.get(path) is None
    with pytest.raises(KeyNotFoundError):
        store.delete(path)
    # No ABA: a writer holding a version of the deleted path cannot touch its successor.
    store.put_if_absent(path, b"reborn")
    with pytest.raises(BadVersion):
        store.compare_and_swap(path, v4, b"ghost")
    assert store.get(path).value == b"reborn"

    store.update(path, lambda old: old + b"!")
    assert store.get(path).value == b"reborn!"
    # every path under a prefix read together, as each alone (the reborn one included)
    every = {p: store.get(p) for p in store.list(f"/test/{unique}/")}
    assert store.get_all(f"/test/{unique}/") == every and len(every) == 3
    store.delete_tree(f"/test/{unique}")
    assert store.list(f"/test/{unique}") == []


class CountingKeyValue(MemoryKeyValue):
    """The in-memory KV, counting the round trips each read makes; ``between`` runs once,
    after the first listing (a writer that comes between a reader's round trips)."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[str] = []
        self.between: Callable[[], None] | None = None

    def get(self, key: bytes) -> bytes | None:
        self.calls.append("get")
        return super().get(key)

    def keys(self, prefix: bytes) -> list[bytes]:
        self.calls.append("keys")
        found = super().keys(prefix)
        if self.between is not None:
            between, self.between = self.between, None
            between()
        return found

    def get_many(self, keys: list[bytes]) -> dict[bytes, bytes]:
        self.calls.append("get_many")
        return super().get_many(keys)


def test_get_all_reads_many_paths_in_three_round_trips() -> None:
    kv = CountingKeyValue()
    store = MetadataStore(kv=kv)
    for i in range(20):
        version = store.put_if_absent(f"/sets/{i}", b"%d" % i)
        for n in range(i % 3):
            version = store.compare_and_swap(f"/sets/{i}", version, b"%d.%d" % (i, n))
    store.put_if_absent("/other/0", b"not under the prefix")
    kv.calls.clear()
    found = store.get_all("/sets/")
    assert kv.calls == ["keys", "get_many", "get_many"]  # against 60 for 20 gets
    assert found == {f"/sets/{i}": store.get(f"/sets/{i}") for i in range(20)}
    assert found["/sets/5"].value == b"5.1" and found["/sets/5"].version.seq == 3


def test_get_all_reads_again_what_changed_between_its_round_trips() -> None:
    """A path updated, deleted, re-created or created after the listing: never a value
    that was superseded before the read ended, nor a deleted path."""
    kv = CountingKeyValue()
    store = MetadataStore(kv=kv)
    versions = {i: store.put_if_absent(f"/sets/{i}", b"old") for i in range(4)}

    def writers() -> None:
        store.compare_and_swap("/sets/0", versions[0], b"new")  # its read slot superseded
        v = store.compare_and_swap("/sets/0", store.get("/sets/0").version, b"newer")
        assert v.seq == 3
        store.delete("/sets/1")
        store.delete("/sets/2")
        store.put_if_absent("/sets/2", b"reborn")  # another chain
        store.put_if_absent("/sets/9", b"late")  # not listed: may be left out

    kv.between = writers
    found = store.get_all("/sets/")
    assert {p: v.value for p, v in found.items()} == {
        "/sets/0": b"newer", "/sets/2": b"reborn", "/sets/3": b"old"
    }  # fmt: skip
    assert all(store.get(p) == v for p, v in found.items())
