"""Every client joins Ray by itself: a program of two lines, an import and
``Producer(topic).send(b"x")``, stores its message, on the embedded Ray and on a
running cluster named by ``RAY_ADDRESS``; so does a stream consumer's receive. A
producer never closed is closed (flushed) at exit. An address where no Ray answers
fails at once, naming where it looked.

Each program is a fresh ``python -c`` with nothing connected beforehand; the topic
is made by a program of its own, which has left before the two-line ones start.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest
from test_embedded import Place, place  # noqa: F401 - tests/ is on sys.path under pytest
from test_examples import free_ports, head  # noqa: F401 - the module's head fixture

from runtime.connect import REACH_TIMEOUT_S

pytestmark = pytest.mark.integration  # Rays of its own (own storage root and Ray temp dir)

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


def _run(code: str, env: dict[str, str], timeout: float = 240) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", code],
        cwd=os.getcwd(), env=env, capture_output=True, text=True, timeout=timeout,
    )  # fmt: skip


def _two_line_programs_work(env: dict[str, str]) -> None:
    made = _run(MAKE_TOPIC, env)
    assert made.returncode == 0, made.stderr[-3000:]
    for _ in range(2):
        produced = _run(PRODUCE, env)
        assert produced.returncode == 0, produced.stderr[-3000:]
    consumed = _run(CONSUME, env)
    assert consumed.returncode == 0, consumed.stderr[-3000:]
    # the message, and both sends stored
    assert consumed.stdout.strip().splitlines()[-2:] == ["b'x'", "2"], consumed.stdout


def test_two_lines_on_the_embedded_ray(place: Place) -> None:  # noqa: F811
    _two_line_programs_work(place.env)


def test_two_lines_on_the_cluster_at_ray_address(head: dict) -> None:  # noqa: F811
    _two_line_programs_work(head["env"] | {"RAY_ADDRESS": head["gcs"]})


def test_a_program_that_calls_ray_init_first_sees_the_topics(head: dict) -> None:  # noqa: F811
    """Ray users call ``ray.init()`` before using a library: the job's namespace is then
    an anonymous one of its own, and the topics another program made must still be
    there. A job that names its namespace is told that it works in it."""
    env = head["env"] | {"RAY_ADDRESS": head["gcs"]}
    topic = "topic://acme/init-first/events"
    made = _run(MAKE_TOPIC.replace(TOPIC, topic), env)
    assert made.returncode == 0, made.stderr[-3000:]
    listing = "import ray\n{init}\nfrom clients import ScalableTopicsAdmin\n" + (
        "print(ScalableTopicsAdmin().list_scalable_topics('acme/init-first'))"
    )
    seen = _run(listing.format(init="ray.init()"), env)
    assert seen.returncode == 0, seen.stderr[-3000:]
    assert topic in seen.stdout.strip().splitlines()[-1], seen.stdout
    own = _run(listing.format(init="ray.init(namespace='mine')"), env)
    assert own.returncode == 0, own.stderr[-3000:]
    assert own.stdout.strip().splitlines()[-1] == "[]", own.stdout  # its own namespace...
    assert "using this program's Ray namespace 'mine'" in own.stderr, own.stderr[-3000:]


@pytest.mark.parametrize("where", ["RAY_ADDRESS", "address="])
def test_no_ray_at_the_address_fails_at_once_saying_where(place: Place, where: str) -> None:  # noqa: F811
    (port,) = free_ports(1)
    address = f"127.0.0.1:{port}"
    if where == "RAY_ADDRESS":
        env, code = place.env | {"RAY_ADDRESS": address}, f"Producer({TOPIC!r})"
    else:
        env, code = place.env, f"StreamConsumer({TOPIC!r}, 's', 'c', address={address!r})"
    started = time.monotonic()
    done = _run(
        "from clients import Producer, StreamConsumer\n"
        "from runtime.errors import RayUnreachableError\n"
        f"try:\n    {code}\nexcept RayUnreachableError as err:\n    print('REFUSED', err)\n",
        env,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    refused = [line for line in done.stdout.splitlines() if line.startswith("REFUSED")]
    assert refused, done.stdout + done.stderr[-3000:]
    assert address in refused[0] and where.rstrip("=") in refused[0], refused[0]
    assert time.monotonic() - started < REACH_TIMEOUT_S + 20  # not Ray's minutes of retries
    assert not place.ray_processes(), "a Ray was started although the address was wrong"
