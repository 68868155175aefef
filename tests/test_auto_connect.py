"""Every client joins Ray by itself: a program of two lines, an import and
``Producer(topic).send(b"x")``, stores its message, on the embedded Ray and on a
running cluster named by ``RAY_ADDRESS``; so does a stream consumer's receive. A
producer never closed is closed (flushed) at exit. An address where no Ray answers
fails at once, naming where it looked. (The same programs against a running cluster
are `test_examples.py`'s, on its `ray start` head.)

Each program is a fresh ``python -c`` with nothing connected beforehand; the topic
is made by a program of its own, which has left before the two-line ones start.
"""

from __future__ import annotations

import time

import pytest
from ports import free_ports  # tests/ is on sys.path under pytest
from test_embedded import Place, place  # noqa: F401
from two_lines import TOPIC, run, two_line_programs_work

from runtime.connect import REACH_TIMEOUT_S

pytestmark = pytest.mark.integration  # Rays of its own (own storage root and Ray temp dir)


def test_two_lines_on_the_embedded_ray(place: Place) -> None:  # noqa: F811
    two_line_programs_work(place.env)


@pytest.mark.parametrize("where", ["RAY_ADDRESS", "address="])
def test_no_ray_at_the_address_fails_at_once_saying_where(place: Place, where: str) -> None:  # noqa: F811
    (port,) = free_ports(1)
    address = f"127.0.0.1:{port}"
    if where == "RAY_ADDRESS":
        env, code = place.env | {"RAY_ADDRESS": address}, f"Producer({TOPIC!r})"
    else:
        env, code = place.env, f"StreamConsumer({TOPIC!r}, 's', 'c', address={address!r})"
    started = time.monotonic()
    done = run(
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
