"""``raytopics produce``, ``consume`` and ``top``: the console tools Kafka users reach
for first. End to end through the real console script on the session's Ray (100,000
lines in, the same out, each key in order), and their pure parts alone."""

from __future__ import annotations

import io
import json
import subprocess
import time
from collections import defaultdict
from datetime import UTC, datetime

import pytest
import ray
from hypothesis import given
from hypothesis import strategies as st
from ray._private.utils import publish_error_to_driver
from test_cli import RAYTOPICS, assert_one_error_line, cli_env, raytopics  # noqa: F401

from clients.console import Pacer, TopicSample, as_json, chunks, key_of, rate, top_table
from clients.message import Message
from runtime.errors import InvalidArgumentError

LINES = 100_000
KEYS = 50


def test_produce_then_consume_a_hundred_thousand_lines_in_key_order(
    cli_env: dict[str, str],  # noqa: F811
    admin,
    unique: str,
) -> None:
    topic = f"console/ns/lines-{unique}"
    admin.create_scalable_topic(f"topic://{topic}", 4)
    lines = "".join(
        json.dumps({"user": f"u{i % KEYS}", "seq": i // KEYS}) + "\n" for i in range(LINES)
    )
    produced = subprocess.run(
        [RAYTOPICS, "produce", topic, "--key-field", "user"],
        input=lines, env=cli_env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert produced.returncode == 0, produced.stderr[-3000:]
    assert f"produced {LINES} messages" in produced.stderr

    consumed = subprocess.run(
        [RAYTOPICS, "consume", topic, "--from", "earliest", "--max", str(LINES), "--json"],
        env=cli_env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert consumed.returncode == 0, consumed.stderr[-3000:]
    got = [json.loads(line) for line in consumed.stdout.splitlines()]
    assert len(got) == LINES
    per_key: dict[str, list[int]] = defaultdict(list)
    for message in got:
        value = json.loads(message["value"])
        assert message["key"] == value["user"]
        assert {"segment", "offset", "publishTime", "properties"} <= message.keys()
        per_key[message["key"]].append(value["seq"])
    assert len(per_key) == KEYS
    assert all(seqs == list(range(LINES // KEYS)) for seqs in per_key.values())
    # The temporary subscription is gone; nothing was left behind.
    assert admin.list_subscriptions(f"topic://{topic}") == []

    table = raytopics(cli_env, "top", "console/ns", "--once")
    row = next(line for line in table.splitlines() if f"topic://{topic}" in line)
    assert row.split()[1:3] == ["4", "0"] and str(LINES) in row.split()
    admin.delete_scalable_topic(f"topic://{topic}")


def test_what_the_cluster_reports_to_drivers_stays_out_of_the_output(
    cli_env: dict[str, str],  # noqa: F811
    admin,
    unique: str,
) -> None:
    """A driver prints what Ray reports to every driver (a raylet's warning about the
    workers it started) on its stdout; the consumer's stdout is its messages only, and
    the report goes to stderr."""
    topic = f"console/ns/reports-{unique}"
    admin.create_scalable_topic(f"topic://{topic}", 1)
    done = subprocess.run(
        [RAYTOPICS, "produce", topic], input="a\nb\n", env=cli_env,
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    consumer = subprocess.Popen(
        [RAYTOPICS, "consume", topic, "--from", "earliest", "--json", "--timeout", "6"],
        env=cli_env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    report = f"a cluster's report {unique}"
    gcs = ray._private.worker.global_worker.gcs_client
    while consumer.poll() is None:
        publish_error_to_driver("test_report", report, gcs)  # to every driver
        time.sleep(0.2)
    out, err = consumer.communicate()
    assert consumer.returncode == 0, err[-3000:]
    assert all(line.startswith("{") for line in out.splitlines()), out
    assert [json.loads(line)["value"] for line in out.splitlines()] == ["a", "b"]
    assert report in err  # delivered, to stderr
    admin.delete_scalable_topic(f"topic://{topic}")


def test_a_named_subscription_resumes_and_bad_lines_are_refused_naming_them(
    cli_env: dict[str, str],  # noqa: F811
    admin,
    unique: str,
) -> None:
    topic = f"console/ns/named-{unique}"
    admin.create_scalable_topic(f"topic://{topic}", 2)

    def produce(text: str, *options: str, code: int = 0) -> subprocess.CompletedProcess:
        done = subprocess.run(
            [RAYTOPICS, "produce", topic, *options],
            input=text, env=cli_env, capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        assert done.returncode == code, done.stderr[-3000:]
        return done

    def consume(*options: str) -> list[str]:
        out = raytopics(cli_env, "consume", topic, "--subscription", "s", *options)
        return out.splitlines()

    produce("a\nb\n\nc\n", "--key", "k")  # the empty line is not a message
    assert consume("--from", "earliest", "--max", "3") == ["a", "b", "c"]
    produce("d\n", "--key", "k", "--rate", "100")
    assert consume("--timeout", "2") == ["d"]  # resumes after c; stops when idle
    assert admin.list_subscriptions(f"topic://{topic}") == ["s"]

    refused = produce('{"user": "u1"}\n{"other": 1}\n', "--key-field", "user", code=1)
    assert_one_error_line(refused.stderr, "line 2", "'user'")
    assert consume("--timeout", "2") == ['{"user": "u1"}']  # what came before is stored
    bad_rate = produce("x\n", "--rate", "0", code=2)
    assert "--rate" in bad_rate.stderr
    rest = subprocess.run(
        [RAYTOPICS, "--url", "http://127.0.0.1:1", "consume", topic],
        env=cli_env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert rest.returncode == 2 and "runs on Ray" in rest.stderr
    admin.delete_scalable_topic(f"topic://{topic}")


# --- pure parts --------------------------------------------------------------------------


def test_keys_come_from_a_fixed_key_a_json_field_or_nowhere() -> None:
    assert key_of("k", None)(1, b"anything") == "k"
    assert key_of(None, None)(1, b"anything") is None
    by_user = key_of(None, "user")
    assert by_user(1, b'{"user": "u7"}') == "u7"
    assert by_user(2, b'{"user": 7}') == "7"  # not a string: its JSON text
    with pytest.raises(InvalidArgumentError, match="line 3 has no field 'user'"):
        by_user(3, b'{"name": "x"}')
    with pytest.raises(InvalidArgumentError, match="line 4 is not a JSON object"):
        by_user(4, b"plain text")


@given(st.lists(st.binary(max_size=8).filter(lambda b: b"\n" not in b), max_size=50))
def test_chunks_number_lines_and_skip_empty_ones(values: list[bytes]) -> None:
    text = b"".join(v + b"\n" for v in values)
    got = [item for chunk in chunks(io.BytesIO(text), 7) for item in chunk]
    assert [line for _, line in got] == [v.rstrip(b"\r") for v in values if v.rstrip(b"\r")]
    assert all(values[number - 1].rstrip(b"\r") == line for number, line in got)


def test_the_pacer_holds_the_average_rate() -> None:
    now = [0.0]
    slept: list[float] = []

    def sleep(seconds: float) -> None:
        slept.append(seconds)
        now[0] += seconds

    pacer = Pacer(100.0, clock=lambda: now[0], sleep=sleep)
    for _ in range(10):
        pacer.sent(50)  # 500 messages at 100/s: 5 s
    assert now[0] == pytest.approx(5.0)
    unlimited = Pacer(None, clock=lambda: now[0], sleep=sleep)
    unlimited.sent(10**6)
    assert len(slept) == 10


def test_top_turns_two_samples_into_rates() -> None:
    def sample(records: int, backlog: int, at: float) -> TopicSample:
        stats = {
            "topic": "topic://t/n/x", "activeSegments": 2, "sealedSegments": 1,
            "records": records,
            "subscriptions": {"a": {"backlog": backlog, "consumers": 1}},
        }  # fmt: skip
        return TopicSample.of(stats, at)

    first, second = sample(1_000, 1_000, 10.0), sample(3_000, 1_000, 12.0)
    assert rate(second, first, "records") == 1_000.0
    assert rate(second, first, "acknowledged") == 1_000.0  # 0 → 2,000 acknowledged in 2 s
    assert rate(second, None, "records") is None
    assert rate(sample(10, 0, 13.0), second, "records") is None  # retention took records
    table = top_table([second], {first.topic: first})
    assert table.splitlines()[1].split() == [
        "topic://t/n/x", "2", "1", "1,000", "1,000", "3000", "1000", "1", "1",
    ]  # fmt: skip


def test_json_lines_carry_every_field_and_binary_values_as_base64() -> None:
    when = datetime(2026, 11, 27, tzinfo=UTC)
    text = json.loads(as_json(Message("k", b"hi", 3, 9, when, {"p": "1"})))
    assert text == {
        "key": "k", "value": "hi", "segment": 3, "offset": 9,
        "publishTime": "2026-11-27T00:00:00+00:00", "properties": {"p": "1"},
    }  # fmt: skip
    binary = json.loads(as_json(Message(None, b"\xff\x00", 0, 0, when, {})))
    assert binary["valueBase64"] == "/wA=" and "value" not in binary
