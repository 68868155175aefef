"""Limits: pure checks and slicing, then enforcement by producer, segment and controller."""

from __future__ import annotations

import time

import numpy as np
import pytest
import ray
from hypothesis import given
from hypothesis import strategies as st

from clients import Producer, ScalableTopicsAdmin
from runtime.batch import (
    batch_bytes,
    batch_slices,
    check_batch,
    deserialize_batch,
    equal_runs,
    make_batch,
    message_sizes,
    serialize_batch,
)
from runtime.errors import (
    InconsistentRequestError,
    InvalidArgumentError,
    LimitExceededError,
    is_integer,
)
from runtime.limits import Limits, LiveLimits
from runtime.names import TopicName
from tests.segments import segment_actor

# --- pure ------------------------------------------------------------------------------


def test_defaults_and_env(monkeypatch) -> None:
    assert Limits().max_message_bytes == 5 << 20
    monkeypatch.setenv("RAYTOPICS_MAX_MESSAGE_BYTES", "10")
    monkeypatch.setenv("RAYTOPICS_MAX_TOPICS_PER_NAMESPACE", "3")
    limits = Limits.from_env()
    assert (limits.max_message_bytes, limits.max_topics_per_namespace) == (10, 3)
    monkeypatch.setenv("RAYTOPICS_MAX_BATCH_BYTES", "lots")
    with pytest.raises(InvalidArgumentError, match="RAYTOPICS_MAX_BATCH_BYTES"):
        Limits.from_env()


@pytest.mark.parametrize(
    "overrides",
    [{"max_message_bytes": 0}, {"nope": 1}, {"max_batch_messages": True}],
)
def test_bad_overrides_are_refused(overrides: dict) -> None:
    with pytest.raises(InvalidArgumentError):
        Limits().overridden(overrides)


def test_limits_that_contradict_each_other_are_a_conflict() -> None:
    """Each value valid, the set not: no schema can say it, so it is 409, not 400."""
    with pytest.raises(InconsistentRequestError) as refused:
        Limits().overridden({"max_batch_bytes": 1})
    assert refused.value.http_status == 409


def test_checks_say_what_and_what_is_allowed() -> None:
    limits = Limits(max_message_bytes=10, max_batch_bytes=25, max_batch_messages=3)
    check_batch(limits, _sized([10, 10, 5]))
    check_batch(limits, make_batch([b"x" * 4], keys=["k" * 6]))  # key + value count
    with pytest.raises(LimitExceededError, match="11 bytes .* max_message_bytes 10"):
        check_batch(limits, _sized([11]))
    with pytest.raises(LimitExceededError, match="11 bytes .* max_message_bytes 10"):
        check_batch(limits, make_batch([b"x" * 5], keys=["k" * 6]))
    with pytest.raises(LimitExceededError, match="11 bytes .* max_message_bytes 10"):
        check_batch(limits, _sized([1, 11, 1]).slice(1, 1))  # a slice counts its own rows
    with pytest.raises(LimitExceededError, match="4 messages exceeds max_batch_messages 3"):
        check_batch(limits, _sized([1, 1, 1, 1]))
    with pytest.raises(LimitExceededError, match="26 bytes exceeds max_batch_bytes 25"):
        check_batch(limits, _sized([10, 10, 6]))
    with pytest.raises(LimitExceededError, match="has 3 topics; max_topics_per_namespace is 3"):
        Limits(max_topics_per_namespace=3).check_topics("a/b", 3)


def _sized(sizes: list[int]):
    return make_batch([b"v" * size for size in sizes])


@given(st.lists(st.tuples(st.integers(0, 30), st.integers(0, 30) | st.none()), max_size=50))
def test_batch_bytes_is_the_sum_of_message_sizes(messages: list[tuple[int, int | None]]) -> None:
    batch = make_batch(
        [b"v" * value for value, _ in messages],
        keys=[None if key is None else "k" * key for _, key in messages],
    )
    for view in (batch, batch.slice(len(messages) // 3, len(messages) // 2)):
        assert batch_bytes(view) == int(message_sizes(view).sum())


def test_a_batch_decoded_as_stored_is_checked_alike() -> None:
    """The segment checks a batch without keys and properties in its stored form (its
    values alone): the same sizes, the same refusals."""
    limits = Limits(max_message_bytes=10, max_batch_bytes=25, max_batch_messages=3)
    for sizes, error in (([10, 10, 5], None), ([11], "max_message_bytes"), ([10, 10, 6], "26")):
        stored = deserialize_batch(serialize_batch(_sized(sizes)), restore_absent=False)
        assert stored.num_columns == 1
        assert batch_bytes(stored) == sum(sizes) == int(message_sizes(stored).sum())
        if error is None:
            check_batch(limits, stored)
        else:
            with pytest.raises(LimitExceededError, match=error):
                check_batch(limits, stored)


@given(
    st.lists(st.integers(0, 50), max_size=200),
    st.integers(1, 20),
    st.integers(50, 400),
)
def test_slices_cover_in_order_within_limits(sizes: list[int], max_messages: int, max_bytes: int):
    array = np.array(sizes, dtype=np.int64)
    slices = batch_slices(array, max_messages, max_bytes)
    assert [i for a, b in slices for i in range(a, b)] == list(range(len(sizes)))
    for start, stop in slices:
        assert 0 < stop - start <= max_messages
        assert array[start:stop].sum() <= max_bytes


# --- enforced on a real cluster ---------------------------------------------------------


class _Overrides:
    """A catalog holding one namespace's overrides (what LiveLimits reads)."""

    def __init__(self) -> None:
        self.stored: dict = {}
        self.reads = 0

    def limit_overrides(self, namespace: str) -> dict:
        self.reads += 1
        return dict(self.stored)

    def active_segments(self, namespace: str) -> dict[str, int]:
        return {}


def test_live_limits_follow_the_catalog_within_their_age() -> None:
    catalog, now = _Overrides(), [0.0]
    live = LiveLimits(catalog, "a/b", max_age_s=2.0, clock=lambda: now[0])
    assert live.current.max_message_bytes == Limits().max_message_bytes
    catalog.stored = {"max_message_bytes": 4 << 20}
    now[0] = 1.9
    assert live.current.max_message_bytes == Limits().max_message_bytes and catalog.reads == 1
    now[0] = 2.0
    assert live.current.max_message_bytes == 4 << 20 and catalog.reads == 2


def test_a_refusal_of_mismatched_batch_and_message_limits_gives_the_values() -> None:
    with pytest.raises(InconsistentRequestError, match=r"max_batch_bytes \(10\) must be >= "
                       r"max_message_bytes \(20\)"):  # fmt: skip
        Limits(max_message_bytes=20, max_batch_bytes=10)


@pytest.fixture
def admin(ray_cluster) -> ScalableTopicsAdmin:
    return ScalableTopicsAdmin()


def _limited(admin: ScalableTopicsAdmin, unique: str, **limits: int) -> str:
    namespace = f"lim/{unique}"
    admin.set_namespace_limits(namespace, **limits)
    return namespace


def test_namespace_limits_are_stored_validated_whole(admin, unique, kv_snapshot) -> None:
    namespace = _limited(admin, unique, max_topics_per_namespace=2)
    assert admin.get_namespace_limits(namespace)["max_topics_per_namespace"] == 2
    before = kv_snapshot()
    with pytest.raises(InconsistentRequestError):  # valid + invalid: neither is applied
        admin.set_namespace_limits(namespace, max_segments_per_topic=5, max_batch_bytes=1)
    assert kv_snapshot() == before
    assert admin.get_namespace_limits("lim/other")["max_topics_per_namespace"] == 10_000


def test_topics_and_segments_per_namespace(admin, unique, kv_snapshot) -> None:
    namespace = _limited(
        admin, unique, max_topics_per_namespace=2, max_segments_per_namespace=4,
        max_segments_per_topic=3,
    )  # fmt: skip
    first, second = f"topic://{namespace}/a", f"topic://{namespace}/b"
    admin.create_scalable_topic(first, 2)
    before = kv_snapshot()
    with pytest.raises(LimitExceededError, match="max_segments_per_topic is 3"):
        admin.create_scalable_topic(second, 4)
    with pytest.raises(LimitExceededError, match="would have 5 active .*namespace is 4"):
        admin.create_scalable_topic(second, 3)
    assert kv_snapshot() == before and admin.list_scalable_topics(namespace) == [first]
    admin.create_scalable_topic(second, 2)
    with pytest.raises(LimitExceededError, match="has 2 topics; max_topics_per_namespace is 2"):
        admin.create_scalable_topic(f"topic://{namespace}/c", 1)
    before = kv_snapshot()
    with pytest.raises(LimitExceededError, match="namespace .* would have 5 active"):
        admin.split_segment(first, 0)
    assert kv_snapshot() == before
    admin.merge_segments(second, 0, 1)  # frees one
    admin.split_segment(first, 0)
    with pytest.raises(LimitExceededError, match="max_segments_per_topic is 3"):
        admin.split_segment(first, 3)
    for topic in (first, second):
        admin.delete_scalable_topic(topic)


def test_message_and_batch_size_at_producer_and_segment(admin, unique) -> None:
    namespace = _limited(
        admin, unique, max_message_bytes=1_000, max_batch_bytes=4_000, max_batch_messages=50
    )
    topic = f"topic://{namespace}/sizes"
    admin.create_scalable_topic(topic, 1)
    with Producer(topic) as producer:
        with pytest.raises(LimitExceededError, match="1001 bytes .* max_message_bytes 1000"):
            producer.send(b"x" * 1_000, key="k")
        with pytest.raises(LimitExceededError):
            producer.send_batch([b"x" * 1_001])
        # 200 x 100 bytes: the producer cuts batches of <= 40 so the segment accepts all
        producer.send_batch([b"y" * 100] * 200).result(timeout=60)
        producer.send(b"z" * 999, key="k").result(timeout=60)
    with Producer(topic, window=1, linger_ms=50) as producer:
        # 30 sends of 7 that meet in the queue merge only up to 40 messages / 4,000 bytes
        futures = [producer.send_batch([b"m" * 99] * 7) for _ in range(30)]
        for future in futures:
            future.result(timeout=60)
    name = TopicName.parse(topic).segment(0, 0, 0xFFFF)
    segment = segment_actor(name)
    records = ray.get(segment.stats.remote())["records"]
    assert records == 411
    for batch in (
        make_batch([b"x" * 1_001]),
        make_batch([b"x" * 10] * 51),
        make_batch([b"x" * 1_000] * 5),
    ):  # the segment is the authority: a client that skips the checks is refused
        with pytest.raises(LimitExceededError):
            ray.get(segment.append.remote(batch))
    assert ray.get(segment.stats.remote())["records"] == records
    admin.delete_scalable_topic(topic)


def test_a_producer_checks_the_clusters_limits_not_its_environments(
    admin, unique, monkeypatch
) -> None:
    """A client whose environment says 10 bytes (the cluster's default is 5 MiB) is not
    refused by its own producer; one whose environment says 5 MiB where the namespace
    allows 1,000 is refused at ``send``, before anything reaches a segment."""
    namespace = _limited(admin, unique, max_message_bytes=1_000)
    topic = f"topic://{namespace}/env"
    admin.create_scalable_topic(topic, 1)
    other = f"topic://lim/{unique}-default/env"
    admin.create_scalable_topic(other, 1)
    monkeypatch.setenv("RAYTOPICS_MAX_MESSAGE_BYTES", "10")
    with Producer(other) as producer:
        producer.send(b"v" * 100).result(timeout=60)
    monkeypatch.setenv("RAYTOPICS_MAX_MESSAGE_BYTES", str(5 << 20))
    with (
        Producer(topic) as producer,
        pytest.raises(LimitExceededError, match="max_message_bytes 1000"),
    ):
        producer.send(b"v" * 1_001)
    for name in (topic, other):
        admin.delete_scalable_topic(name)


def test_a_raised_limit_reaches_running_segments_and_producers(admin, unique) -> None:
    """Raising ``max_message_bytes`` from 1 MiB to 4 MiB lets a running producer send
    2 MiB to a running segment within seconds; a refusal names the limit in force."""
    namespace = _limited(admin, unique, max_message_bytes=1 << 20)
    topic = f"topic://{namespace}/raised"
    admin.create_scalable_topic(topic, 1)
    big = b"b" * (2 << 20)
    segment = segment_actor(TopicName.parse(topic).segment(0, 0, 0xFFFF))
    with Producer(topic) as producer:
        with pytest.raises(LimitExceededError, match="max_message_bytes 1048576"):
            producer.send(big)
        with pytest.raises(LimitExceededError, match="max_message_bytes 1048576"):
            ray.get(segment.append.remote(make_batch([big])))
        admin.set_namespace_limits(namespace, max_message_bytes=4 << 20)
        deadline = time.monotonic() + 10
        while True:
            try:
                producer.send(big).result(timeout=60)
                break
            except LimitExceededError as refused:
                assert time.monotonic() < deadline, f"still refused after 10 s: {refused}"
                time.sleep(0.2)
        admin.set_namespace_limits(namespace, max_message_bytes=3 << 20)
        time.sleep(2.5)
        with pytest.raises(LimitExceededError, match="max_message_bytes 3145728"):
            ray.get(segment.append.remote(make_batch([b"c" * (7 << 19)])))
    assert ray.get(segment.stats.remote())["records"] == 1
    admin.delete_scalable_topic(topic)


@given(st.lists(st.integers(0, 3), max_size=40))
def test_equal_runs_cover_every_row_once_in_maximal_runs(values: list[int]) -> None:
    runs = equal_runs(np.array(values, dtype=np.int64))
    assert [i for start, end in runs for i in range(start, end)] == list(range(len(values)))
    for start, end in runs:
        assert start < end and len(set(values[start:end])) == 1
    for (_, end), (start, _) in zip(runs, runs[1:], strict=False):
        assert values[end - 1] != values[start]  # maximal: neighbours differ


@pytest.mark.parametrize(
    ("value", "minimum", "maximum", "expected"),
    [
        (1, 1, None, True),
        (0, 1, None, False),
        (65535, 1, 65535, True),
        (65536, 1, 65535, False),
        (True, 0, None, False),  # a bool is no count, id or port
        (1.0, 1, None, False),
        ("1", 1, None, False),
    ],
)
def test_is_integer_takes_ints_in_range_and_never_a_bool(value, minimum, maximum, expected):
    assert is_integer(value, minimum, maximum) is expected
