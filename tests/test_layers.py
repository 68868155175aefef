"""The package layers: ``runtime`` and ``storage`` below ``actors``, ``clients`` on top.

The server side must not depend on the client package: a server whose checks
or operations live in ``clients/`` can be bypassed by any process that skips
them, and an import circle (clients -> runtime -> actors -> clients) makes
every module load order-dependent. Imports inside functions count too: a lazy
import is still a dependency.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
# what each package may not import, at any depth of the module
FORBIDDEN = {
    "runtime": ("actors", "clients"),
    "storage": ("actors", "clients"),
    "actors": ("clients",),
}


def imported_modules(path: Path) -> set[str]:
    """Every absolute module ``path`` imports, at top level or inside functions."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
    return found


def _violations(package: str, forbidden: tuple[str, ...]) -> list[str]:
    return [
        f"{path.relative_to(ROOT)} imports {module}"
        for path in sorted((ROOT / package).rglob("*.py"))
        for module in sorted(imported_modules(path))
        if module.split(".")[0] in forbidden
    ]


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_no_package_imports_the_layers_above_it(package: str) -> None:
    assert _violations(package, FORBIDDEN[package]) == []


# the modules that read or write the metadata store: the cluster's actors do, on behalf
# of a client whose credential they checked; a client that read it would bypass them
METADATA_STORE = ("storage.catalog", "storage.metadata")


def test_clients_never_read_the_metadata_store() -> None:
    found = [
        f"{path.relative_to(ROOT)} imports {module}"
        for path in sorted((ROOT / "clients").glob("*.py"))
        for module in sorted(imported_modules(path))
        if module.startswith(METADATA_STORE)
    ]
    assert found == []


def test_no_helper_of_the_controller_receives_the_controller() -> None:
    """Helpers get the topic's parts (``actors.control.topic_parts``), never the controller class:
    what each may touch is spelled out, and each can be driven by parts of its own."""
    found = [
        f"{path.relative_to(ROOT)} imports {module}"
        for path in sorted((ROOT / "actors").rglob("*.py"))
        if path.name != "controller.py"
        for module in sorted(imported_modules(path))
        if module == "actors.control.controller.ScalableTopicController"
    ]
    assert found == []


def test_nothing_outside_storage_reaches_into_a_segments_log() -> None:
    """The segment actor and its appender use the store, whose log may be local, tiered or
    (next) replicated: ``storage.log.SegmentRecords`` is the seam."""
    found = [
        f"{path.relative_to(ROOT)}:{number}"
        for package in ("actors", "clients", "runtime")
        for path in sorted((ROOT / package).rglob("*.py"))
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        if re.search(r"store\.log\b", line)
    ]
    assert found == []


def test_the_gateway_and_connect_form_no_circle() -> None:
    gateway = set().union(*map(imported_modules, (ROOT / "actors" / "gateway").glob("*.py")))
    assert gateway and not {m for m in gateway if m.split(".")[0] == "clients"}
    assert not {m for m in imported_modules(ROOT / "runtime" / "connect.py") if "gateway" in m}


# The subsystems of ``actors/``, top to bottom: each may import those below it and the
# modules every subsystem shares (``actors/*.py``: guard, registry, metrics, capacity, and
# the controller directory, through which a segment's lookup reaches the controller that
# wakes it), never one above it. The gateway reaches the cluster through the admin
# service only.
SUBSYSTEMS = ("gateway", "admin", "control", "segment")


def test_the_actor_subsystems_point_down_only() -> None:
    found = []
    for rank, subsystem in enumerate(SUBSYSTEMS):
        above = SUBSYSTEMS[:rank]
        for path in sorted((ROOT / "actors" / subsystem).glob("*.py")):
            for module in sorted(imported_modules(path)):
                parts = module.split(".")
                if parts[0] == "actors" and len(parts) > 1 and parts[1] in above:
                    found.append(f"{path.relative_to(ROOT)} imports {module}")
    assert found == []
    gateway = set().union(*map(imported_modules, (ROOT / "actors" / "gateway").glob("*.py")))
    assert {m.split(".")[2] for m in gateway if m.startswith("actors.admin.")} == {"caller"}
    assert not {m for m in gateway if m.startswith(("actors.control", "actors.segment"))}
    shared = {path.stem for path in (ROOT / "actors").glob("*.py")} - {"__init__"}
    expected = {"guard", "registry", "metrics", "capacity", "controller_directory", "idle_exit"}
    assert shared == expected, "a module outside the shared six"


def test_the_check_sees_lazy_imports(tmp_path: Path) -> None:
    module = tmp_path / "lazy.py"
    module.write_text("def f():\n    from clients.admin import ScalableTopicsAdmin\n")
    assert "clients.admin" in imported_modules(module)


def test_the_rest_client_the_cli_the_producer_and_the_consumers_import_no_ray() -> None:
    """A program outside the cluster talks to it over REST (``AdminHttpClient``, ``raytopics
    --url``), produces and consumes through the gateway without Ray installed in its way:
    none of them imports it (``clients`` and ``runtime`` import their Ray-bound names when
    first used, the producer and the consumers their Ray side only when they join Ray)."""
    import subprocess
    import sys

    program = (
        "import sys\n"
        "from clients import AdminHttpClient, Message\n"
        "from clients import cli\n"
        "import runtime, runtime.admin_api\n"
        "from clients import Producer\n"
        "import clients._remote, clients._producer_core, clients._data_plane, clients._limits\n"
        "assert 'ray' not in sys.modules, 'ray imported'\n"
        "from clients import StreamConsumer, CheckpointConsumer\n"
        "import clients._group_consumer, clients._group_core, clients._group_access\n"
        "assert 'ray' not in sys.modules, 'ray imported by the stream consumer'\n"
        "from clients import QueueConsumer\n"
        "import clients.queue_consumer\n"
        "assert 'ray' not in sys.modules, 'ray imported by the queue consumer'\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", program], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-2000:]
