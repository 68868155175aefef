"""Transactions survive ``ray stop --force`` and ``ray start --head`` (Ray's GCS on a real
Redis): the programs and checks that ``tests/test_head_restart.py`` runs on its head,
beside its own, so that one restart of all of Ray serves both.

Before the restart a program sends messages in three transactions and leaves them:
``later`` open, to be committed after the restart; ``decided`` committed in its record
but not finished, as a coordinator that crashed mid-commit leaves one; ``forgotten``
open with a short time-out, which nobody commits. Every process of the head is then
killed and the head started again. After it, with no client naming ``decided`` or
``forgotten``, the segments that opened holding them have the coordinator's sweeper
finish ``decided`` and abort ``forgotten`` at its deadline; ``later`` commits by its id.
Readers then get exactly the messages of ``later`` and ``decided`` and the plain ones.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a program

TOPIC = "topic://restart/txn/events"
DEADLINE_S = 150.0


def check(before: dict[str, Any], after: dict[str, Any]) -> None:
    """What the phases found holds what the docstring says."""
    assert after["statuses"] == {
        "later": "committed", "decided": "committed", "forgotten": "aborted",
    }  # fmt: skip
    expected = before["plain"] + before["later"] + before["decided"]
    assert sorted(after["read"]) == sorted(expected)


# --- the programs (run as subprocesses, joined to the head by RAY_ADDRESS) ------------


def before(out: Path) -> None:
    from clients import Producer, ScalableTopicsAdmin
    from runtime.transactions import Commit
    from storage.catalog import Catalog
    from storage.transactions import Transactions

    admin = ScalableTopicsAdmin()
    admin.create_scalable_topic(TOPIC, 2)
    admin.create_subscription(TOPIC, "s")
    txns = {
        "later": admin.new_transaction(timeout_s=600),
        "decided": admin.new_transaction(timeout_s=600),
        "forgotten": admin.new_transaction(timeout_s=5),
    }
    sent: dict[str, list[str]] = {"plain": []}
    with Producer(TOPIC) as producer:
        for name, txn in txns.items():
            sent[name] = [f"{name}-{i}" for i in range(10)]
            for i, value in enumerate(sent[name]):
                producer.send(value.encode(), key=f"k{i}", txn=txn).result()
        sent["plain"] = [f"plain-{i}" for i in range(10)]
        for i, value in enumerate(sent["plain"]):
            producer.send(value.encode(), key=f"k{i}").result()
    # The decision stored, nothing finished: a coordinator that crashed mid-commit.
    Transactions(Catalog().store).change(txns["decided"].id, Commit())
    ids = {name: txn.id for name, txn in txns.items()}
    out.write_text(json.dumps(sent | {"ids": ids}))


def after(out: Path) -> None:
    from clients import ScalableTopicsAdmin

    ids = json.loads((out.parent / "before.json").read_text())["ids"]
    admin = ScalableTopicsAdmin()
    admin.wait_until_ready(TOPIC, DEADLINE_S)
    deadline = time.monotonic() + DEADLINE_S
    statuses: dict[str, str] = {}
    while time.monotonic() < deadline:
        statuses = {n: admin.get_transaction(i)["status"] for n, i in ids.items() if n != "later"}
        if statuses == {"decided": "committed", "forgotten": "aborted"}:
            break
        time.sleep(0.5)
    statuses["later"] = admin.commit_transaction(ids["later"])["status"]
    out.write_text(json.dumps({"statuses": statuses, "read": _read_everything()}))


def _read_everything() -> list[str]:
    from clients import StreamConsumer

    got: list[str] = []
    with StreamConsumer(TOPIC, "s", "c1") as consumer:
        while True:
            message = consumer.receive(timeout=5)
            if message is None:
                return got
            got.append(message.value.decode())
            consumer.acknowledge_cumulative(message)


if __name__ == "__main__":
    {"before": before, "after": after}[sys.argv[1]](Path(sys.argv[2]))
