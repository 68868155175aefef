"""The quick tier's end-to-end test: a topic on a real Ray is created, produced to,
split between two rounds of sends, and consumed whole, each key in order. The full
suite says the same of every path in depth; this says in seconds that the whole
route still holds after an edit."""

from __future__ import annotations

import pytest

from clients import Producer, ScalableTopicsAdmin, StreamConsumer

KEYS = 20
PER_ROUND = 500


@pytest.mark.smoke
def test_create_produce_split_consume(admin: ScalableTopicsAdmin, unique: str) -> None:
    topic = f"topic://smoke/ns/t-{unique}"
    admin.create_scalable_topic(topic, 2)
    admin.create_subscription(topic, "s")
    sent: dict[str, list[int]] = {f"k{i}": [] for i in range(KEYS)}
    with Producer(topic) as producer:
        for seq in range(2 * PER_ROUND):
            if seq == PER_ROUND:
                producer.flush()
                children = admin.split_segment(topic, 0)["children"]
                assert len(children) == 2
            key = f"k{seq % KEYS}"
            producer.send(f"{key}:{seq}".encode(), key=key)
            sent[key].append(seq)
    assert len(admin.get_layout(topic).active_segments) == 3

    got: dict[str, list[int]] = {key: [] for key in sent}
    consumer = StreamConsumer(topic, "s", "c1")
    try:
        while sum(map(len, got.values())) < 2 * PER_ROUND:
            message = consumer.receive(timeout=30)
            assert message is not None, f"only {sum(map(len, got.values()))} arrived"
            key, seq = message.value.decode().split(":")
            got[key].append(int(seq))
            consumer.acknowledge_cumulative(message)
    finally:
        consumer.close()
    assert got == sent  # every message once, each key in the order it was sent
    admin.delete_scalable_topic(topic)
