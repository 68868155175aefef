"""The CLI against the Admin Client API, without Ray: every method of the API is
reached by some ``raytopics`` command, the hand-written commands declare exactly the
methods they call, and the generated ones parse their arguments from the method's
signature into the same calls the Python API makes (a recording transport)."""

from __future__ import annotations

import argparse
import inspect
import json
import re
from datetime import UTC, datetime
from typing import Any

import pytest

from clients import cli, cli_commands
from clients.admin_calls import AdminCall, AdminCalls
from clients.cli_calls import PYTHON_ONLY, add_command, api_methods

SEGMENT = "segment://t/ns/x/0000-7fff-3"


class _Recorded(AdminCalls):
    def __init__(self, answer: Any = None) -> None:
        self.calls: list[AdminCall] = []
        self.answer = answer

    async def _run(self, call: AdminCall) -> Any:
        self.calls.append(call)
        return self.answer


def _commands() -> dict[tuple[str, ...], argparse.ArgumentParser]:
    found: dict[tuple[str, ...], argparse.ArgumentParser] = {}

    def walk(parser: argparse.ArgumentParser, path: tuple[str, ...]) -> None:
        subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
        if not subs and path:
            found[path] = parser
        for sub in subs:
            for name, child in sub.choices.items():
                walk(child, (*path, name))

    walk(cli.build_parser(), ())
    return found


def _run(argv: list[str], answer: Any = None) -> tuple[list[AdminCall], str]:
    args = cli.build_parser().parse_args(argv)
    admin = _Recorded(answer)
    return admin.calls, args.run(admin, args)


def test_every_method_of_the_api_is_a_command() -> None:
    methods = api_methods()
    assert len(methods) >= 25 and "split_segment" in methods
    claimed = cli_commands.claimed()
    assert claimed <= set(methods), claimed - set(methods)
    commands = {path[-1] for path in _commands()}
    assert not claimed & set(PYTHON_ONLY)
    assert set(PYTHON_ONLY.values()) <= commands
    generated = {m.replace("_", "-") for m in methods if m not in claimed | set(PYTHON_ONLY)}
    assert generated == {
        "position-at-time", "create-segment", "terminate-segment", "delete-segment",
        "get-transaction", "list-transactions", "commit-transaction", "abort-transaction",
        "transaction-acknowledge",
    }  # fmt: skip
    assert generated <= commands


def test_a_hand_written_command_declares_what_it_calls() -> None:
    """``@calls`` is what keeps a method from a generated twin: it must name exactly
    the methods the command's code calls on the admin."""
    declared = 0
    for name, command in vars(cli_commands).items():
        if not hasattr(command, "calls"):
            continue
        called = set(re.findall(r"\badmin\.(\w+)\(", inspect.getsource(command)))
        assert called == set(command.calls), name
        declared += 1
    assert declared >= 20


def test_generated_commands_make_the_calls_the_api_makes() -> None:
    calls, out = _run(["terminate-segment", SEGMENT, "--force"], answer=42)
    assert calls == [AdminCall("terminate_segment", {"segment": SEGMENT, "force": True})]
    assert out == "42"
    calls, out = _run(["delete-segment", SEGMENT])
    assert calls == [AdminCall("delete_segment", {"segment": SEGMENT, "force": False})]
    assert out == "done"
    calls, _ = _run(["create-segment", SEGMENT, "--subscriptions", "a", "--subscriptions", "b"])
    assert calls == [AdminCall("create_segment", {"segment": SEGMENT, "subscriptions": ["a", "b"]})]
    calls, _ = _run(["create-segment", SEGMENT])
    assert calls[0].args["subscriptions"] == []

    answer = {"position": {"next": {"0": 7}, "finished": [1]}}
    calls, out = _run(["position-at-time", "t/ns/x", "2026-11-26T10:00:00+00:00"], answer)
    moment = int(datetime(2026, 11, 26, 10, tzinfo=UTC).timestamp() * 1000)
    assert calls == [
        AdminCall("stream_initial", {"name": "topic://t/ns/x", "starting_time_ms": moment})
    ]
    assert json.loads(out) == {"next": {"0": 7}, "finished": [1]}
    calls, _ = _run(["position-at-time", "topic://t/ns/x", "1764000000000"], answer)
    assert calls[0].args["starting_time_ms"] == 1764000000000


def test_generated_commands_refuse_what_the_api_would(capsys: pytest.CaptureFixture) -> None:
    for argv, says in (
        (["position-at-time", "t/ns/x", "earliest"], "expected epoch milliseconds"),
        (["position-at-time", "t/ns/x"], "the following arguments are required: WHEN"),
        (["terminate-segment"], "the following arguments are required: SEGMENT_TOPIC"),
        (["terminate-segment", SEGMENT, "--force", "yes"], "unrecognized arguments: yes"),
    ):
        with pytest.raises(SystemExit) as exited:
            cli.build_parser().parse_args(argv)
        assert exited.value.code == 2
        assert says in capsys.readouterr().err, argv


def test_help_of_a_generated_command_is_the_methods_docstring() -> None:
    parser = _commands()[("terminate-segment",)]
    text = parser.format_help()
    assert "Seal a segment of the layout; returns its end offset." in text
    assert "Admin Client API: terminate_segment" in text
    assert "segment://tenant/namespace/topic/{start:04x}-{end:04x}-{id}" in text


def test_a_signature_the_generator_cannot_express_is_refused_at_build() -> None:
    commands = argparse.ArgumentParser().add_subparsers()
    with pytest.raises(TypeError, match="needs a hand-written command"):
        add_command(commands, "merge-segments", "merge_segments", str)
