"""Redelivery backoff and dead-letter topics: the pure policies, then a real queue
subscription with poison messages (always negatively acknowledged) among good ones."""

from __future__ import annotations

import time
from collections import Counter

import pytest

from clients import (
    DeadLetterPolicy,
    Producer,
    QueueConsumer,
    RedeliveryBackoff,
    ScalableTopicsAdmin,
)
from runtime.errors import InvalidArgumentError, InvalidNameError, TopicNotFoundError
from runtime.redelivery import dead_letter_properties


def test_the_backoff_grows_by_its_multiplier_up_to_its_maximum() -> None:
    backoff = RedeliveryBackoff(initial_s=0.5, max_s=3.0, multiplier=2.0)
    assert [backoff.delay_s(n) for n in range(6)] == [0.5, 1.0, 2.0, 3.0, 3.0, 3.0]
    assert RedeliveryBackoff().delay_s(10**6) == 60.0  # no overflow


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"initial_s": 0}, "initial_s must be > 0"),
        ({"initial_s": 2, "max_s": 1}, "max_s must be between"),
        ({"multiplier": 0.5}, "multiplier must be >= 1"),
        ({"max_s": float("inf")}, "max_s must be > 0"),
    ],
)
def test_a_backoff_that_makes_no_sense_is_refused(kwargs: dict, match: str) -> None:
    with pytest.raises(InvalidArgumentError, match=match):
        RedeliveryBackoff(**kwargs)


def test_a_dead_letter_policy_needs_one_delivery_at_least_and_a_topic_name() -> None:
    for bad in (0, -1, 1.5, True):
        with pytest.raises(InvalidArgumentError, match="max_deliveries must be an integer >= 1"):
            DeadLetterPolicy(bad, "topic://t/ns/dlq")
    with pytest.raises(InvalidNameError, match="expected topic://tenant/namespace/topic"):
        DeadLetterPolicy(3, "not a topic")
    policy = DeadLetterPolicy(3, "topic://t/ns/dlq")
    assert [policy.is_dead(n) for n in range(5)] == [False, False, False, True, True]


def test_a_dead_letter_keeps_its_properties_and_says_where_it_came_from() -> None:
    props = dead_letter_properties({"a": "1"}, "topic://t/ns/x", "s", 4, 17, 4, "bad json")
    assert props == {
        "a": "1",
        "origin.topic": "topic://t/ns/x",
        "origin.subscription": "s",
        "origin.segment": "4",
        "origin.offset": "17",
        "origin.deliveries": "4",
        "origin.error": "bad json",
    }


def test_poison_messages_end_in_the_dead_letter_topic_once_and_the_rest_once_acked(
    admin: ScalableTopicsAdmin, unique: str
) -> None:
    topic, dlq = f"topic://redeliver/ns/t-{unique}", f"topic://redeliver/ns/dlq-{unique}"
    admin.create_scalable_topic(topic, 2)
    admin.create_scalable_topic(dlq, 1)
    admin.create_subscription(topic, "work")
    admin.create_subscription(dlq, "inspect")
    with pytest.raises(TopicNotFoundError):  # a missing dead-letter topic: said at once
        QueueConsumer(topic, "work", dead_letter=DeadLetterPolicy(3, f"{dlq}-missing"))
    with Producer(topic) as producer:
        for i in range(1000):
            producer.send(f"{i}".encode(), key=f"k{i}")
    poison = {i for i in range(1000) if i % 20 == 7}  # 50
    consumer = QueueConsumer(
        topic,
        "work",
        dead_letter=DeadLetterPolicy(max_deliveries=3, dead_letter_topic=dlq),
        negative_ack_backoff=RedeliveryBackoff(initial_s=0.05, max_s=0.2),
    )
    acked: Counter[int] = Counter()
    deliveries: Counter[int] = Counter()
    deadline = time.monotonic() + 120

    def done() -> bool:
        return len(acked) == 950 and all(deliveries[n] == 3 for n in poison)

    while not done() and time.monotonic() < deadline:
        message = consumer.receive(timeout=1)
        if message is None:
            continue
        number = int(message.value)
        deliveries[number] += 1
        assert message.redelivery_count == deliveries[number] - 1
        if number in poison:
            consumer.negative_acknowledge(message, error=f"cannot handle {number}")
        else:
            consumer.acknowledge(message)
            acked[number] += 1
    assert consumer.receive(timeout=3) is None  # the poison went to the dead letters
    consumer.close()
    assert set(acked) == set(range(1000)) - poison and set(acked.values()) == {1}
    assert {deliveries[n] for n in poison} == {3}  # each handed to the app 3 times

    letters = QueueConsumer(dlq, "inspect")
    dead = []
    while (message := letters.receive(timeout=3)) is not None:
        dead.append(message)
        letters.acknowledge(message)
    letters.close()
    assert sorted(int(m.value) for m in dead) == sorted(poison)  # each exactly once
    for message in dead:
        origin = message.properties
        assert origin["origin.topic"] == topic and origin["origin.subscription"] == "work"
        assert origin["origin.deliveries"] == "4"
        assert origin["origin.error"] == f"cannot handle {int(message.value)}"
        assert int(origin["origin.offset"]) >= 0 and origin["origin.segment"] in ("0", "1")
    deadline = time.monotonic() + 10
    while admin.get_stats(topic)["subscriptions"]["work"]["backlog"] != 0:
        assert time.monotonic() < deadline, admin.get_stats(topic)["subscriptions"]
        time.sleep(0.2)
    for name in (topic, dlq):
        admin.delete_scalable_topic(name)


def test_negative_acknowledgements_come_back_after_the_backoff(
    admin: ScalableTopicsAdmin, unique: str
) -> None:
    topic = f"topic://redeliver/ns/b-{unique}"
    admin.create_scalable_topic(topic, 1)
    admin.create_subscription(topic, "work")
    with Producer(topic) as producer:
        producer.send(b"again", key="k")
    backoff = RedeliveryBackoff(initial_s=0.4, max_s=1.6, multiplier=2.0)
    consumer = QueueConsumer(topic, "work", negative_ack_backoff=backoff)
    message = consumer.receive(timeout=10)
    measured = []
    for _ in range(5):
        expected = backoff.delay_s(message.redelivery_count)
        nacked = time.monotonic()
        consumer.negative_acknowledge(message)
        message = consumer.receive(timeout=10)
        assert message is not None
        measured.append((expected, time.monotonic() - nacked))
    consumer.acknowledge(message)
    consumer.close()
    assert [e for e, _ in measured] == [0.4, 0.8, 1.6, 1.6, 1.6]
    # Never early; late by at most the scheduling of a loaded machine (the redelivery and the
    # receive that sees it are each an actor call away).
    for expected, took in measured:
        assert expected * 0.95 <= took <= expected * 1.2 + 0.4, measured
    admin.delete_scalable_topic(topic)
