import pytest
import ray

from runtime.errors import AlreadyExistsError, BadVersion, KeyNotFoundError
from storage.metadata import MetadataStore


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


def test_store_semantics(ray_cluster, unique):
    store, path = MetadataStore(), f"/test/{unique}/a"
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
    store.delete_tree(f"/test/{unique}")
    assert store.list(f"/test/{unique}") == []
