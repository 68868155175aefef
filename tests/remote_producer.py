"""A program that produces through the REST gateway and never imports Ray
(``tests/test_remote_clients.py`` runs it with ``RAYTOPICS_URL`` and its token, if any,
in its environment).

    python tests/remote_producer.py TOPIC ROUNDS KEYS PAUSE...

Each round sends one message per key (``k{key}:{round}``, keyed ``k{key}``). Before the
rounds named by PAUSE it says so and reads a line from stdin, with that round's sends
still in flight, so the test changes the layout while they are (the first round is
stored before any: the connection is up by then). It prints one JSON line
per round, then what it sent and to which segments; a refused start prints the error.
"""

from __future__ import annotations

import json
import sys


def say(**line: object) -> None:
    print(json.dumps(line), flush=True)


def main() -> None:
    from clients import Producer
    from runtime.errors import ScalableTopicsError

    topic, rounds, keys = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    pauses = {int(r) for r in sys.argv[4:]}
    try:
        producer = Producer(topic)
    except ScalableTopicsError as err:
        say(refused=type(err).__name__, message=str(err), ray="ray" in sys.modules)
        return
    futures = []
    with producer:
        for r in range(rounds):
            if r in pauses:
                say(paused=r)
                sys.stdin.readline()
            futures += [producer.send(f"k{k}:{r}".encode(), key=f"k{k}") for k in range(keys)]
            if r == 0:
                producer.flush()  # connected: later rounds are in flight when a change comes
            say(round=r)
    segments = sorted({future.result().segment_id for future in futures})
    say(sent=len(futures), segments=segments, ray="ray" in sys.modules)


if __name__ == "__main__":
    main()
