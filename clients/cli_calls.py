"""The ``raytopics`` commands that the Admin Client API gives without a word of CLI code.

``clients.cli`` writes a command by hand where people want more than the answer (a
tree, a table, a sentence, a wait); each such command names the Admin Client API
methods it calls (``claims``). Every other public method of ``AdminCalls`` becomes a
command here, named like the method with dashes (``terminate_segment`` is
``raytopics terminate-segment``), its arguments read from the method's signature and
type hints, its help from the docstring, and its answer printed as JSON. So an
operation added to the API (``runtime.admin_api``, its handler, one ``AdminCalls``
method) is in the CLI at once, over Ray and over ``--url`` alike, and
``tests/test_cli_calls.py`` checks that every method is reachable from some command.
"""

from __future__ import annotations

import argparse
import inspect
import json
import types
import typing
from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Any

from clients import cli_commands
from clients.admin_calls import AdminCalls
from clients.cli_commands import Command, reset_to
from runtime.subscription import ResetTo

Converter = Callable[[str], Any]

# Methods that answer with a Python object a shell has no use for, and the command
# that prints the same (a transaction begun from a shell could take no message: its
# listing shows what programs began).
PYTHON_ONLY = {
    "get_layout": "describe",
    "watch_layout": "describe",
    "new_transaction": "list-transactions",
}


def api_methods() -> list[str]:
    """The Admin Client API's public methods by their blocking names, in declared order."""
    return [
        name.removesuffix("_async")
        for name, member in vars(AdminCalls).items()
        if name.endswith("_async") and not name.startswith("_") and callable(member)
    ]


def add_generated(commands: Any, topic: Converter) -> list[str]:
    """Add a command for every API method no hand-written command calls
    (``clients.cli_commands.claimed``); returns their names. ``topic`` parses a
    ``TOPIC`` argument as the other commands do."""
    claimed, added = cli_commands.claimed(), []
    for method in api_methods():
        if method in claimed or method in PYTHON_ONLY:
            continue
        name = method.replace("_", "-")
        add_command(commands, name, method, topic)
        added.append(name)
    return added


def add_command(commands: Any, name: str, method: str, topic: Converter) -> None:
    function = getattr(AdminCalls, f"{method}_async")
    summary = _summary(function)
    parser = commands.add_parser(
        name,
        help=summary,
        description=f"{inspect.getdoc(function)}\n\n(Admin Client API: {method}; "
        "the answer is printed as JSON.)",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    hints = typing.get_type_hints(function)
    for parameter in list(inspect.signature(function).parameters.values())[1:]:
        if parameter.kind in (parameter.VAR_POSITIONAL, parameter.VAR_KEYWORD):
            raise TypeError(f"{method}: *{parameter.name} needs a hand-written command")
        _add_argument(parser, parameter, hints.get(parameter.name, str), topic)
    parser.set_defaults(run=_runner(method))


def _add_argument(
    parser: argparse.ArgumentParser, parameter: inspect.Parameter, hint: Any, topic: Converter
) -> None:
    required = parameter.default is inspect.Parameter.empty
    hint, optional = _unwrap_optional(hint)
    if hint is bool:
        parser.add_argument(
            _flag(parameter.name), dest=parameter.name, action="store_true",
            help=_describe(parameter.name, hint) + " (default off)",
        )  # fmt: skip
        return
    element = _element(hint)
    convert = topic if parameter.name == "topic" else _converter(element or hint)
    metavar = parameter.name.upper() if element is None else parameter.name.upper().rstrip("S")
    described = _describe(parameter.name, element or hint)
    if required and element is None:
        parser.add_argument(parameter.name, type=convert, metavar=metavar, help=described)
        return
    default = None if required or optional else parameter.default
    parser.add_argument(
        _flag(parameter.name), dest=parameter.name, type=convert, metavar=metavar,
        default=default, required=required,
        action="append" if element is not None else "store",
        help=described + ("; repeatable" if element is not None else "")
        + ("" if default is None else f" (default {default})"),
    )  # fmt: skip


def _runner(method: str) -> Command:
    def run(admin: Any, args: argparse.Namespace) -> str:
        function = getattr(AdminCalls, f"{method}_async")
        names = list(inspect.signature(function).parameters)[1:]
        answer = getattr(admin, method)(**{name: getattr(args, name) for name in names})
        return "done" if answer is None else json.dumps(answer, indent=2, default=str)

    return run


def _summary(function: Callable[..., Any]) -> str:
    """The docstring's first clause, for the command list."""
    text = " ".join((inspect.getdoc(function) or "").split()).replace("``", "")
    ends = [i for i in (text.find(". "), text.find(": "), text.find(" (")) if i > 0]
    return text[: min(ends, default=len(text))].rstrip(".")


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def _unwrap_optional(hint: Any) -> tuple[Any, bool]:
    if isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union:
        members = [m for m in typing.get_args(hint) if m is not type(None)]
        if len(members) < len(typing.get_args(hint)) and len(members) == 1:
            return members[0], True
    return hint, False


def _element(hint: Any) -> Any | None:
    """The element type of a list argument (given once per element), else ``None``."""
    if typing.get_origin(hint) in (list, Sequence):
        (element,) = typing.get_args(hint) or (str,)
        return element
    return None


def _moment(text: str) -> datetime | int:
    value = reset_to(text)
    if isinstance(value, str):
        raise argparse.ArgumentTypeError(
            f"{text!r}: expected epoch milliseconds or an ISO 8601 time with a zone"
        )
    return value


# How a value of each type is written on the command line, and what help says of it.
_TYPES: list[tuple[Any, Converter, str]] = [
    (ResetTo, reset_to, "earliest, latest, epoch milliseconds or an ISO 8601 time with a zone"),
    (datetime | int, _moment, "epoch milliseconds or an ISO 8601 time with a zone"),
    (int, int, "an integer"),
    (float, float, "a number"),
    (str, str, "text"),
]

# What the API's parameter names mean wherever they occur.
_PARAMETERS = {
    "topic": "tenant/namespace/topic (topic:// optional)",
    "segment_topic": "segment://tenant/namespace/topic/{start:04x}-{end:04x}-{id}",
    "subscriptions": "a subscription to create with it",
    "namespace": "tenant/namespace",
    "force": "also an ACTIVE segment (see above)",
}


def _converter(hint: Any) -> Converter:
    for known, convert, _ in _TYPES:
        if hint == known:
            return convert
    if typing.get_origin(hint) is dict or hint is dict:
        return json_object
    return _json_value


def _describe(name: str, hint: Any) -> str:
    if name in _PARAMETERS:
        return _PARAMETERS[name]
    return next((text for known, _, text in _TYPES if hint == known), "JSON")


def json_object(text: str) -> dict[str, Any]:
    value = _json_value(text)
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError("must be a JSON object")
    return value


def _json_value(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(f"not JSON: {err}") from None
