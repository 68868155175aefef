"""Docs that match the code: every command block of the README and of ``docs/`` runs as
written on this machine, or says why not right above it
(``<!-- docs-test: not run: why -->``, naming the test that does run it instead).

Python blocks run in one scope per file, in order; shell blocks run with ``bash`` as
a user types them, their ``raytopics`` joining this session's cluster; JSON blocks
are parsed by the model they document. Names under ``acme/orders`` are given a
namespace of the test's own, so the blocks never meet another test's topics.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import pytest
from test_cli import cli_env  # noqa: F401 - the fixture: CLI processes join this session

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
PAGES = [README, *sorted((ROOT / "docs").glob("*.md"))]
BLOCK = re.compile(
    r"(?:<!-- docs-test: not run: (?P<why>.+?) -->\n)?^```(?P<lang>\w+)\n(?P<body>.*?)^```",
    re.S | re.M,
)
RUNS = ("python", "bash", "json")


@dataclass(frozen=True)
class Block:
    page: Path
    line: int
    lang: str
    body: str
    why_not: str | None

    def __str__(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line} ({self.lang})"


def blocks(page: Path) -> list[Block]:
    text = page.read_text()
    return [
        Block(page, text.count("\n", 0, m.start("lang")) + 1, m["lang"], m["body"], m["why"])
        for m in BLOCK.finditer(text)
    ]


def runnable(page: Path, lang: str) -> list[Block]:
    return [b for b in blocks(page) if b.lang == lang and b.why_not is None]


def own_names(text: str, unique: str) -> str:
    return text.replace("acme/orders", f"acme/docs-{unique}")


def test_every_block_runs_or_says_why_not() -> None:
    found = [b for page in PAGES for b in blocks(page)]
    assert len(found) >= 10, "the block pattern no longer finds the docs' blocks"
    run = Counter(b.lang for b in found if b.lang in RUNS and not b.why_not)
    assert run["python"] >= 2 and run["bash"] >= 3 and run["json"] >= 1, run
    unexplained = [str(b) for b in found if b.lang not in RUNS and not b.why_not]
    assert not unexplained, f"blocks no test runs and nothing explains: {unexplained}"
    for block in found:
        for named in re.findall(r"tests/[\w/]+\.py", block.why_not or ""):
            assert (ROOT / named).exists(), f"{block} names {named}, which does not exist"
    assert (ROOT / "docs").is_dir() and len(PAGES) >= 6
    links = re.findall(r"\]\((docs/[\w.]+\.md)\)", README.read_text())
    assert {ROOT / link for link in links} == set(PAGES[1:]), "README links every docs page"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_the_json_blocks_are_what_the_code_accepts(page: Path) -> None:
    from runtime.policy import TopicPolicy

    for block in runnable(page, "json"):
        document = json.loads(block.body)
        if {"autoscale", "retention", "tiering", "hibernation"} & document.keys():
            TopicPolicy.model_validate(document)  # raises naming what is wrong


def _with_spark(page: Path) -> pytest.param:
    """A page whose blocks use Spark runs beside the other Spark tests (``conftest``)."""
    uses = any("spark" in b.body for b in runnable(page, "python"))
    return pytest.param(page, marks=[pytest.mark.spark] if uses else [], id=page.name)


@pytest.mark.integration  # the blocks join this session's Ray or start their own
@pytest.mark.parametrize("page", [_with_spark(page) for page in PAGES])
def test_the_python_blocks_run(page: Path, request, unique: str) -> None:
    code = runnable(page, "python")
    if not code:
        return
    admin = request.getfixturevalue("admin")
    if any("spark" in b.body for b in code):
        request.getfixturevalue("spark")
    made = _topics_the_blocks_expect(admin, page, unique)
    scope: dict = {}
    for block in code:
        exec(compile(own_names(block.body, unique), str(block), "exec"), scope)  # noqa: S102
    if page == README:  # the quickstart: everything it sent was delivered and acked
        stats = admin.get_stats(scope["topic"])
        assert stats["records"] == 3 and stats["subscriptions"]["billing"]["backlog"] == 0
    for topic in made | {scope.get("topic")} - {None}:
        admin.delete_scalable_topic(topic)


def _topics_the_blocks_expect(admin, page: Path, unique: str) -> set[str]:  # noqa: ANN001
    """What a page's Python blocks read or write without making it first (the Spark
    page reads the events of the quickstart and writes a copy)."""
    from clients import Producer

    if page.name != "spark.md":
        return set()
    events, copy = (own_names(f"topic://acme/orders/{n}", unique) for n in ("events", "copy"))
    admin.create_scalable_topic(events, 2)
    admin.create_scalable_topic(copy, 2)
    with Producer(events) as producer:
        producer.send_batch([b"a", b"b", b"c"], keys=["k1", "k2", "k3"]).result()
    return {events, copy}


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_the_shell_blocks_run(page: Path, cli_env: dict[str, str], unique: str) -> None:  # noqa: F811
    env = cli_env | {"PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    for block in runnable(page, "bash"):
        done = subprocess.run(
            ["bash", "-euo", "pipefail", "-c", own_names(block.body, unique)],
            cwd=ROOT, env=env, capture_output=True, text=True, timeout=300,
        )  # fmt: skip
        assert done.returncode == 0, f"{block}:\n{done.stdout[-2000:]}\n{done.stderr[-3000:]}"
        assert "Traceback" not in done.stderr, f"{block}:\n{done.stderr[-3000:]}"
    _delete_what_is_left(unique)


def _delete_what_is_left(unique: str) -> None:
    """A page's blocks may leave their topic for the reader to look at."""
    from clients import ScalableTopicsAdmin

    admin = ScalableTopicsAdmin()
    for topic in admin.list_scalable_topics(f"acme/docs-{unique}"):
        admin.delete_scalable_topic(topic)


@pytest.mark.integration  # programs on an embedded Ray of their own
def test_the_quickstart_twice_as_two_programs_delivers_or_fails_loudly(unique, tmp_path):
    """Run as two programs in a row, the quickstart never exits 0 with messages lost:
    the first delivers all three, the second is refused loudly (the topic outlived the
    first program), not served the first one's files as its own."""
    (code,) = runnable(README, "python")
    topic = f"topic://acme/orders/twice-{unique}"
    program = tmp_path / "tour.py"
    program.write_text(code.body.replace("topic://acme/orders/events", topic))
    # As a newcomer runs it: no cluster named, so each program uses the embedded Ray
    # of the storage root (started by the first, stopped as it exits, started again).
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env["RAYTOPICS_STORAGE_ROOT"] = str(tmp_path / "root")
    runs = [
        subprocess.run([sys.executable, str(program)], env=env, capture_output=True, text=True,
                       timeout=300, check=False, cwd=ROOT)
        for _ in range(2)
    ]  # fmt: skip
    first, second = runs
    assert first.returncode == 0, first.stderr[-3000:]
    assert "'backlog': 0" in first.stdout, first.stdout
    assert second.returncode != 0, "the second program exited 0"
    assert "TopicAlreadyExistsError" in second.stderr, second.stderr[-3000:]
