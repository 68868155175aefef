"""Programs of two lines (an import and a call), each a fresh ``python -c`` with nothing
connected beforehand: what ``test_auto_connect.py`` runs on the embedded Ray and
``test_examples.py`` on a running cluster named by ``RAY_ADDRESS``. The topic is made by a
program of its own, which has left before the two-line ones start."""

from __future__ import annotations

import os
import subprocess
import sys

TOPIC = "topic://acme/first/hour"
MAKE_TOPIC = f"""
from clients import ScalableTopicsAdmin
admin = ScalableTopicsAdmin()
admin.create_scalable_topic({TOPIC!r}, 2)
admin.create_subscription({TOPIC!r}, "s")
"""
PRODUCE = f"""from clients import Producer
Producer({TOPIC!r}).send(b"x")
"""
CONSUME = f"""from clients import ScalableTopicsAdmin, StreamConsumer
print(StreamConsumer({TOPIC!r}, "s", "c").receive(timeout=60).value)
print(ScalableTopicsAdmin().get_stats({TOPIC!r})["records"])
"""


def run(code: str, env: dict[str, str], timeout: float = 240) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", code],
        cwd=os.getcwd(), env=env, capture_output=True, text=True, timeout=timeout,
    )  # fmt: skip


def two_line_programs_work(env: dict[str, str]) -> None:
    made = run(MAKE_TOPIC, env)
    assert made.returncode == 0, made.stderr[-3000:]
    for _ in range(2):
        produced = run(PRODUCE, env)
        assert produced.returncode == 0, produced.stderr[-3000:]
    consumed = run(CONSUME, env)
    assert consumed.returncode == 0, consumed.stderr[-3000:]
    # the message, and both sends stored
    assert consumed.stdout.strip().splitlines()[-2:] == ["b'x'", "2"], consumed.stdout
