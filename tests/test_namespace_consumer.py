"""Namespace subscriptions (``NamespaceConsumer``): one subscription on every topic of a
namespace whose properties match, the topics created after it subscribed included,
each topic's per-key order kept; on the session's Ray. The filter and the argument
checks are tested without Ray."""

from __future__ import annotations

import time
from collections import defaultdict

import pytest

from clients import NamespaceConsumer, Producer, ScalableTopicsAdmin
from clients.namespace_consumer import matches
from runtime.errors import InvalidArgumentError, InvalidNameError


def test_a_topic_matches_when_its_properties_hold_every_wanted_item() -> None:
    assert matches({"team": "a", "tier": "gold"}, {"team": "a"})
    assert matches({"team": "a"}, {})
    assert matches({}, {})
    assert not matches({"team": "b"}, {"team": "a"})
    assert not matches({}, {"team": "a"})
    assert not matches({"team": "a"}, {"team": "a", "tier": "gold"})


@pytest.mark.parametrize(
    ("kwargs", "error", "says"),
    [
        ({"kind": "shared"}, InvalidArgumentError, "kind must be 'stream' or 'queue'"),
        ({"consumer_name": None}, InvalidArgumentError, "needs a consumer_name"),
        ({"initial_position": "now"}, InvalidArgumentError, "initial_position"),
        ({"discovery_interval_s": 0}, InvalidArgumentError, "discovery_interval_s"),
        ({"properties": {"team": 1}}, InvalidArgumentError, "properties must map strings"),
        ({"namespace": "no-slash"}, InvalidNameError, "tenant/namespace"),
    ],
)
def test_bad_arguments_are_refused_before_anything_is_joined(kwargs, error, says) -> None:
    arguments = {"namespace": "t/ns", "subscription": "s", "consumer_name": "c"} | kwargs
    with pytest.raises(error, match=says):
        NamespaceConsumer(**arguments)


_SENT: dict[str, int] = defaultdict(int)  # per topic, how many were sent so far


def _produce(topic: str, count: int, keys: int = 7) -> list[tuple[str, str]]:
    """``count`` keyed messages whose values number them in sending order, per topic."""
    sent = []
    with Producer(topic) as producer:
        for _ in range(count):
            i = _SENT[topic]
            _SENT[topic] += 1
            key, value = f"k{i % keys}", f"{topic}|{i}"
            producer.send(value.encode(), key=key)
            sent.append((key, value))
    return sent


def _receive(consumer: NamespaceConsumer, count: int, timeout_s: float = 90.0) -> list:
    got = []
    deadline = time.monotonic() + timeout_s
    while len(got) < count and time.monotonic() < deadline:
        message = consumer.receive(timeout=1.0)
        if message is not None:
            got.append(message)
            consumer.acknowledge(message)
    return got


def test_a_namespace_subscription_reads_every_matching_topic_new_ones_included(
    ray_cluster, admin: ScalableTopicsAdmin, unique: str
) -> None:
    namespace = f"nsub/n-{unique}"
    first, second, other = (f"topic://{namespace}/{name}" for name in ("a1", "a2", "b1"))
    admin.create_scalable_topic(first, 2, {"team": "a"})
    admin.create_scalable_topic(second, 1, {"team": "a", "tier": "gold"})
    admin.create_scalable_topic(other, 1, {"team": "b"})
    sent = _produce(first, 300) + _produce(second, 200)
    _produce(other, 50)

    with NamespaceConsumer(
        namespace, "sub", "c1", properties={"team": "a"}, initial_position="earliest",
        discovery_interval_s=0.5,
    ) as consumer:  # fmt: skip
        assert consumer.topics == [first, second]
        got = _receive(consumer, 500)
        admin.split_segment(first, 0)
        sent += _produce(first, 200)
        late = f"topic://{namespace}/a3"  # created after the consumer subscribed
        admin.create_scalable_topic(late, 1, {"team": "a"})
        sent += _produce(late, 100)
        admin.create_scalable_topic(f"topic://{namespace}/b2", 1, {"team": "b"})
        got += _receive(consumer, 300)
        assert consumer.topics == [first, second, late]
        assert consumer.receive(timeout=1.0) is None  # nothing more: each once

    assert sorted(m.value.decode() for m in got) == sorted(v for _, v in sent)
    assert all(m.topic == m.value.decode().split("|")[0] for m in got), "topic of each message"
    last: dict[tuple[str, str], int] = defaultdict(lambda: -1)
    for message in got:  # per topic, each key's messages in the order they were sent
        index = int(message.value.decode().split("|")[1])
        assert index > last[(message.topic, message.key)], (message.topic, message.key, index)
        last[(message.topic, message.key)] = index
    assert admin.list_subscriptions(other) == [] and admin.list_subscriptions(late) == ["sub"]

    # a queue kind on the same namespace: each message once, a negative ack redelivers
    queue_sent = _produce(second, 120) + _produce(late, 80)
    everything = sorted(v for _, v in sent + queue_sent)
    with NamespaceConsumer(
        namespace, "work", kind="queue", properties={"team": "a"}, initial_position="earliest",
    ) as workers:  # fmt: skip
        handed_back = workers.receive(timeout=30)
        assert handed_back is not None
        workers.negative_acknowledge(handed_back, "not now")
        taken = _receive(workers, len(everything))
        assert workers.receive(timeout=1.0) is None
        with pytest.raises(InvalidArgumentError, match="not a message of a topic"):
            workers.acknowledge(handed_back._replace(topic="topic://else/where/x"))
    assert sorted(m.value.decode() for m in taken) == everything
    again = [m for m in taken if m.value == handed_back.value]
    assert len(again) == 1 and again[0].redelivery_count == 1
    with (
        NamespaceConsumer(namespace, "sub", "c1") as stream,
        pytest.raises(InvalidArgumentError, match="for queue consumers"),
    ):
        stream.negative_acknowledge(got[0])
