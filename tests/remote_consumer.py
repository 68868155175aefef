"""A program that consumes through the REST gateway and never imports Ray
(``tests/test_remote_clients.py`` runs it with ``RAYTOPICS_URL`` and its token, if any,
in its environment).

    python tests/remote_consumer.py TOPIC SUBSCRIPTION EXPECTED [queue NAME]

It joins SUBSCRIPTION as a stream consumer and says so, receives until EXPECTED
messages came (``k{key}:{round}``, keyed ``k{key}``, as ``remote_producer.py`` sends
them), acknowledging each batch, then waits a second more for a duplicate. It prints
each key's rounds in the order they arrived, and whether Ray was imported; a refused
start prints the error. With ``queue NAME`` it is queue consumer NAME instead, one of
several sharing the subscription: it acknowledges each message, and stops once the
subscription's EXPECTED messages were all received by someone (it is told on stdin).
"""

from __future__ import annotations

import json
import sys
import threading
import time
from typing import Any

WAIT_S = 240.0  # for all of EXPECTED; a hang shows as fewer received


def say(**line: object) -> None:
    print(json.dumps(line), flush=True)


def main() -> None:
    from clients import QueueConsumer, StreamConsumer
    from runtime.errors import ScalableTopicsError

    topic, subscription, expected = sys.argv[1], sys.argv[2], int(sys.argv[3])
    try:
        if sys.argv[4:5] == ["queue"]:
            share(QueueConsumer(topic, subscription, sys.argv[5]))
            return
        consumer = StreamConsumer(topic, subscription, "remote-consumer")
    except ScalableTopicsError as err:
        say(refused=type(err).__name__, message=str(err), ray="ray" in sys.modules)
        return
    say(started=True)
    seen: dict[str, list[int]] = {}
    received, mismatched = 0, 0
    deadline = time.monotonic() + WAIT_S
    with consumer:
        while received < expected and time.monotonic() < deadline:
            batch = consumer.receive_batch(5_000, timeout=1.0)
            for message in batch:
                key, round_ = message.value.decode().split(":")
                mismatched += key != message.key
                seen.setdefault(key, []).append(int(round_))
            received += len(batch)
            if batch:  # a sealed segment's children come once it is acknowledged whole
                consumer.acknowledge_cumulative(batch)
        extra = len(consumer.receive_batch(1_000, timeout=1.0))
    say(received=received, extra=extra, mismatched=mismatched, seen=seen,
        ray="ray" in sys.modules)  # fmt: skip


def share(consumer: Any) -> None:
    """Receive and acknowledge each message, and say which, until told to stop."""
    say(started=True)
    stop = threading.Event()
    threading.Thread(target=lambda: (sys.stdin.readline(), stop.set()), daemon=True).start()
    deadline = time.monotonic() + WAIT_S
    with consumer:
        while not stop.is_set() and time.monotonic() < deadline:
            message = consumer.receive(timeout=0.2)
            if message is not None:
                consumer.acknowledge(message)
                say(got=message.value.decode(), segment=message.segment_id)
    say(done=True, ray="ray" in sys.modules)


if __name__ == "__main__":
    main()
