"""The reference pages (``docs/reference/``) name everything the code offers: every
public parameter of the documented classes and functions, every option of the
streaming connector, every ``raytopics`` command and flag, every ``RAYTOPICS_*``
variable the product reads and every error class with its code and HTTP status.

A page documents a callable either under a heading that names it in backticks (as
``Producer.send(value, ...)``), with a table row per parameter, or in one table row
whose first cell names it with its signature; a method either way below a heading
that names its class. Nothing here starts Ray: the modules are imported and
inspected, the CLI's parser is built, the sources are read.
"""

from __future__ import annotations

import argparse
import dataclasses
import inspect
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

import clients
import runtime
from clients import cli, ray_data, spark, spark_streaming
from clients import spark_session as session_module
from clients._group_core import ConsumerConfig
from clients.producer import ProducerConfig
from runtime import errors
from runtime.limits import Limits

ROOT = Path(__file__).resolve().parent.parent
REFERENCE = ROOT / "docs" / "reference"
PRODUCT = ("actors", "runtime", "storage", "clients")
HEADING = re.compile(r"^(#{1,6})\s+(.*)$")


# --- the pages, as headings and table rows ----------------------------------------------


@dataclass(frozen=True)
class Section:
    heading: str
    context: str  # this heading and those above it: which class a method belongs to
    text: str  # the heading's line and everything up to the next heading of its level


@dataclass(frozen=True)
class Row:
    first_cell: str
    line: str
    context: str


@dataclass(frozen=True)
class Page:
    path: Path
    text: str
    sections: tuple[Section, ...]
    rows: tuple[Row, ...]

    @classmethod
    def read(cls, name: str) -> Page:
        path = REFERENCE / name
        lines = path.read_text().splitlines()
        headings = [
            (i, len(m[1]), m[2]) for i, line in enumerate(lines) if (m := HEADING.match(line))
        ]
        sections, rows, stack = [], [], []
        for n, (start, level, title) in enumerate(headings):
            end = next((i for i, lv, _ in headings[n + 1 :] if lv <= level), len(lines))
            stack = [(lv, t) for lv, t in stack if lv < level] + [(level, title)]
            context = " / ".join(t for _, t in stack)
            sections.append(Section(title, context, "\n".join(lines[start:end])))
            stop = headings[n + 1][0] if n + 1 < len(headings) else len(lines)
            for line in lines[start + 1 : stop]:
                if line.startswith("|") and not line.startswith("|---"):
                    rows.append(Row(line.split("|")[1], line, context))
        return cls(path, "\n".join(lines), tuple(sections), tuple(rows))

    def __str__(self) -> str:
        return str(self.path.relative_to(ROOT))


def names(name: str) -> re.Pattern[str]:
    """``name`` in backticks, bare or qualified, as a signature or alone."""
    return re.compile(rf"`(?:[\w.]+\.)?{re.escape(name)}[`(]")


def mentions(owner: str | None, context: str) -> bool:
    """Whether headings ``context`` name class ``owner`` (a function has none)."""
    return owner is None or re.search(rf"`(?:[\w.]+\.)?{re.escape(owner)}\b", context) is not None


# --- what the code offers ---------------------------------------------------------------


# ``**kwargs`` whose keywords are another object's fields: the page lists those.
EXPANDED: dict[tuple[str, str], tuple[str, ...]] = {
    ("Producer", "config"): tuple(f.name for f in dataclasses.fields(ProducerConfig)),
    ("StreamConsumer", "config"): tuple(f.name for f in dataclasses.fields(ConsumerConfig)),
    ("CheckpointConsumer", "config"): tuple(f.name for f in dataclasses.fields(ConsumerConfig)),
    ("set_namespace_limits", "limits"): tuple(f.name for f in dataclasses.fields(Limits)),
    ("set_namespace_limits_async", "limits"): tuple(f.name for f in dataclasses.fields(Limits)),
    ("write_topic_dataset", "options"): tuple(inspect.signature(ray_data.TopicDatasink).parameters),
}


def parameters(label: str, target: Callable[..., Any]) -> list[tuple[str, bool]]:
    """The names a caller may pass, each with whether it stands in for a ``**kwargs``:
    ``self`` and ``*args`` aside, ``**kwargs`` as the keywords it takes."""
    found = []
    for p in inspect.signature(target).parameters.values():
        if p.name in ("self", "cls") or p.kind is p.VAR_POSITIONAL:
            continue
        if p.kind is p.VAR_KEYWORD and (label, p.name) in EXPANDED:
            found += [(name, True) for name in EXPANDED[label, p.name]]
        else:
            found.append((p.name, False))
    return found


def _ours(cls: type) -> bool:
    return cls.__module__.split(".")[0] in PRODUCT


def members(cls: type) -> Iterator[tuple[str, Any]]:
    """Public methods and properties of ``cls`` and its project bases, except those that
    implement a foreign base's interface (a Ray Data ``Datasink``'s hooks)."""
    foreign = {name for base in cls.__mro__ if not _ours(base) for name in vars(base)}
    seen: set[str] = set()
    for base in cls.__mro__:
        if not _ours(base):
            continue
        for name, value in vars(base).items():
            if name.startswith("_") or name in seen or name in foreign:
                continue
            if isinstance(value, classmethod | staticmethod):
                value = value.__func__
            if inspect.isfunction(value) or isinstance(value, property):
                seen.add(name)
                yield name, value


@dataclass(frozen=True)
class Documented:
    """One callable a page must document: ``name`` under ``owner``'s heading or row."""

    label: str
    name: str
    owner: str | None
    target: Any

    def required(self) -> list[tuple[str, bool]]:
        """Its parameters (a property has none)."""
        if isinstance(self.target, property):
            return []
        return parameters(self.name, self.target)


def documented(classes: list[type], functions: list[Callable[..., Any]]) -> list[Documented]:
    found = []
    for cls in classes:
        found.append(Documented(cls.__name__, cls.__name__, None, cls))
        found += [
            Documented(f"{cls.__name__}.{name}", name, cls.__name__, member)
            for name, member in members(cls)
        ]
    found += [Documented(f.__name__, f.__name__, None, f) for f in functions]
    return found


PAGES = {
    "producer.md": documented([clients.Producer, clients.MessageId, clients.BatchResult], []),
    "consumers.md": documented(
        [
            clients.StreamConsumer,
            clients.CheckpointConsumer,
            clients.QueueConsumer,
            clients.NamespaceConsumer,
            clients.Message,
            clients.Checkpoint,
            clients.DeadLetterPolicy,
            clients.RedeliveryBackoff,
        ],
        [],
    ),
    "admin.md": documented(
        [clients.ScalableTopicsAdmin, clients.AdminHttpClient],
        [clients.connect, runtime.disconnect, runtime.metadata_durability],
    ),
    "spark.md": documented(
        [spark.WriteResult, ray_data.TopicDatasink],
        [
            session_module.spark_session,
            session_module.stop_spark,
            session_module.connector_jar,
            spark.read_topic,
            spark.write_topic,
            spark.warm_up,
            ray_data.read_topic_dataset,
            ray_data.write_topic_dataset,
            spark_streaming.enable_streaming,
        ],
    ),
}


def undocumented(page: Page, item: Documented) -> list[str]:
    """What ``page`` lacks of ``item``: the item itself, or some of its parameters."""
    pattern = names(item.name)
    for section in page.sections:
        if pattern.search(section.heading) and mentions(item.owner, section.context):
            cells = set(re.findall(r"^\|([^|\n]*)\|", section.text, re.M))
            return [
                f"{item.label}: no table row for parameter `{p}`"
                for p, _ in item.required()
                if not any(re.search(rf"`\**{re.escape(p)}`", cell) for cell in cells)
            ]
    for row in page.rows:
        if pattern.search(row.first_cell) and mentions(item.owner, row.context):
            # A row's signature shows ``**limits``; the keywords it takes are listed apart.
            return [
                f"{item.label}: parameter `{p}` is not in its row"
                for p, expanded in item.required()
                if not re.search(rf"\b{re.escape(p)}\b", row.first_cell)
                and not (expanded and f"`{p}`" in page.text)
            ]
    return [f"{item.label}: no heading or table row names it"]


@pytest.mark.parametrize("name", sorted(PAGES))
def test_every_public_parameter_is_in_its_page(name: str) -> None:
    page = Page.read(name)
    assert len(PAGES[name]) >= 3, "the classes and functions to document were not found"
    missing = [gap for item in PAGES[name] for gap in undocumented(page, item)]
    assert not missing, f"{page} lacks:\n  " + "\n  ".join(missing)


def test_every_streaming_option_is_in_the_spark_page() -> None:
    """The connector reads its options by name (``options.get("startingOffsets")``) and its
    Spark settings by key: each must have its row."""
    sources = "\n".join(p.read_text() for p in (ROOT / "java" / "src" / "main").rglob("*.java"))
    options = set(re.findall(r'options\.(?:get|getOrDefault)\("(\w+)"', sources))
    options |= set(re.findall(r'\(options, "(\w+)"', sources))
    confs = set(re.findall(r'"(spark\.raytopics\.\w+)"', sources))
    assert {"topic", "url", "startingOffsets"} <= options and confs, (options, confs)
    page = Page.read("spark.md")
    cells = " ".join(row.first_cell for row in page.rows)
    missing = [f"option `{o}`" for o in sorted(options) if f"`{o}`" not in cells]
    missing += [f"Spark conf `{c}`" for c in sorted(confs) if f"`{c}`" not in page.text]
    assert not missing, f"{page} lacks:\n  " + "\n  ".join(missing)


# --- the CLI ------------------------------------------------------------------------------


def commands(parser: argparse.ArgumentParser, path: tuple[str, ...] = ()) -> Iterator[tuple]:
    """``(path, parser)`` of every command that runs (the leaves of the subcommand tree)."""
    subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    if not subs and path:
        yield path, parser
    for sub in subs:
        for name, child in sub.choices.items():
            yield from commands(child, (*path, name))


def arguments(parser: argparse.ArgumentParser) -> Iterator[argparse.Action]:
    skipped = (argparse._HelpAction, argparse._SubParsersAction)
    return (a for a in parser._actions if not isinstance(a, skipped))


def test_every_command_and_flag_is_in_the_cli_page() -> None:
    parser = cli.build_parser()
    page = Page.read("cli.md")
    missing = [
        f"global option {option}"
        for action in arguments(parser)
        for option in action.option_strings
        if not re.search(rf"`{re.escape(option)}[` ]", page.text)
    ]
    found = list(commands(parser))
    assert len(found) >= 20, "the parser's commands were not found"
    for path, command in found:
        title = re.compile(rf"`raytopics {re.escape(' '.join(path))}[` ]")
        section = next((s for s in page.sections if title.search(s.heading)), None)
        if section is None:
            missing.append(f"a heading for `raytopics {' '.join(path)}`")
            continue
        for action in arguments(command):
            shown = action.option_strings or [action.metavar or action.dest]
            missing += [
                f"`{option}` of `raytopics {' '.join(path)}`"
                for option in shown
                if not re.search(rf"(?<![\w-]){re.escape(option)}(?![\w-])", section.text)
            ]
    assert not missing, f"{page} lacks:\n  " + "\n  ".join(missing)


def test_every_exit_code_is_in_the_cli_page() -> None:
    """``main`` returns its codes; argparse exits 2 on a usage error."""
    codes = {int(c) for c in re.findall(r"return (\d+)", inspect.getsource(cli.main))} | {2}
    assert {0, 1} <= codes, codes
    page = Page.read("cli.md")
    missing = [
        code for code in sorted(codes) if not re.search(rf"^\| `{code}` \|", page.text, re.M)
    ]
    assert not missing, f"{page} lacks exit codes {missing}"


# --- configuration and errors -------------------------------------------------------------


def variables() -> set[str]:
    """Every ``RAYTOPICS_*`` name the product's code spells out. One ending in ``_`` is a
    prefix (``"RAYTOPICS_"``) or a family (``RAYTOPICS_MAX_*``), not a variable."""
    found: set[str] = set()
    for package in PRODUCT:
        for path in (ROOT / package).rglob("*.py"):
            found |= set(re.findall(r"RAYTOPICS_[A-Z0-9_]+", path.read_text()))
    return {name for name in found if not name.endswith("_")}


def test_every_variable_is_in_the_configuration_page() -> None:
    found = variables()
    assert {"RAYTOPICS_NAMESPACE", "RAYTOPICS_TIER_URIS"} <= found and len(found) >= 20, found
    page = Page.read("configuration.md")
    missing = [
        name for name in sorted(found) if not re.search(rf"^\| `{name}` \|", page.text, re.M)
    ]
    assert not missing, f"{page} has no row for {missing}"


def error_classes() -> list[type[errors.ScalableTopicsError]]:
    return [
        cls
        for cls in vars(errors).values()
        if inspect.isclass(cls)
        and issubclass(cls, errors.ScalableTopicsError)
        and cls.__module__ == errors.__name__
    ]


def test_every_error_is_in_the_errors_page_with_its_code_and_status() -> None:
    found = error_classes()
    assert len(found) >= 30, "the error classes were not found"
    page = Page.read("errors.md")
    missing = []
    for cls in found:
        row = next((r for r in page.rows if r.first_cell.strip() == f"`{cls.__name__}`"), None)
        if row is None:
            missing.append(f"{cls.__name__}: no row")
        elif f"`{cls.code}`" not in row.line or f" {cls.http_status} " not in row.line:
            missing.append(f"{cls.__name__}: its row lacks `{cls.code}` or {cls.http_status}")
    assert not missing, f"{page} lacks:\n  " + "\n  ".join(missing)
