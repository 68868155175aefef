"""Shared fixtures: one real local Ray per test session (per xdist worker in a parallel
run), storage on real disk; the tiers of the suite and the order of a parallel run."""

from __future__ import annotations

import os
import tempfile
import uuid
from collections.abc import Iterator
from typing import Any

import hypothesis  # noqa: F401 - see below
import object_store  # tests/ is on sys.path under pytest
import pytest
import ray

# Imported now, not by hypothesis's pytest plugin at the terminal summary: a run that
# had no hypothesis test imported it there, with Ray's objects being collected, and
# CPython 3.11.7 failed compiling it ("AST constructor recursion depth mismatch").

# What makes a session's Ray its own: its storage root (the embedded Ray of a root is
# shared by whoever joins it), its Ray namespace, and the tiers with the ports of its S3
# servers. xdist's workers inherit the environment of the process that started them, whose
# conftest chose these already: a worker choosing again gets a Ray of its own, where one
# worker's authentication policy or tier servers are never another's.
_WHO = os.environ.get("PYTEST_XDIST_WORKER", "controller")
_CHOSEN, _CHOSEN_BY = "RAYTOPICS_TEST_CHOSEN", "RAYTOPICS_TEST_CHOSEN_BY"
if os.environ.get(_CHOSEN_BY) not in (None, _WHO):
    for _name in os.environ.pop(_CHOSEN, "").split(","):
        os.environ.pop(_name, None)


def _choose(name: str, value: str) -> None:
    """``name`` as the session chose it, unless the environment already says."""
    if name not in os.environ:
        os.environ[name] = value
        chosen = [n for n in os.environ.get(_CHOSEN, "").split(",") if n]
        os.environ[_CHOSEN], os.environ[_CHOSEN_BY] = ",".join([*chosen, name]), _WHO


_choose("RAYTOPICS_STORAGE_ROOT", tempfile.mkdtemp(prefix="raytopics-test-"))
_choose("RAYTOPICS_NAMESPACE", f"raytopics-test-{uuid.uuid4().hex[:8]}")
# Tiers the tests may use, as an operator lists them: one scratch directory, and the
# buckets of the S3 servers on loopback with their endpoints (tests/object_store.py).
# A fuzzer's made-up tier URIs are refused, never written to.
TIER_ROOT = tempfile.mkdtemp(prefix="raytopics-tiers-")
_choose("RAYTOPICS_TIER_URIS", object_store.operator_tier_uris(TIER_ROOT))
# The session's Ray holds the topics of every module at once, and some tests keep dozens
# of sealed segments running (a subscription's backlog holds them): admission by CPU at
# its default (16 segments per CPU) is tested on Rays of their own (test_admission,
# test_schemathesis, the chaos harness), which do not inherit this.
os.environ.setdefault("RAYTOPICS_SEGMENTS_PER_CPU", "64")
# Most tests use a namespace of their own, each with a segment host: an idle host costs
# Ray's per-process floor every second and ~200 MB, so a namespace's host exits soon
# after its last topic is deleted (30 s by default), not at the end of the run.
os.environ.setdefault("RAYTOPICS_HOST_IDLE_EXIT_S", "3")
# Spark's JVMs (the driver's and the executors') run little code for a session's
# length: the client compiler and the serial collector cost them far less CPU on a
# small machine (tests/README.md).
os.environ.setdefault("JAVA_TOOL_OPTIONS", "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC")
# Ray's own background work in every Ray of the session (its own and those the tests
# start, which inherit this environment), which the suite never reads: the log monitor
# globs for new log files ten times a second while a session has fewer than 1,000 of
# them (every worker adds three), the dashboard agent samples every process's stats
# every 5 s, and each process keeps internal event-loop statistics. Worker logs still
# reach drivers, and the metrics the tests read are untouched (tests/README.md).
os.environ.setdefault("RAY_LOG_MONITOR_MANY_FILES_THRESHOLD", "0")
os.environ.setdefault("LOG_NAME_UPDATE_INTERVAL_S", "5")
os.environ.setdefault("REPORTER_UPDATE_INTERVAL_MS", "60000")
os.environ.setdefault("RAY_event_stats", "0")
# Every process exports its metrics to its node's agent every second on the embedded
# head (fresh backlog ages); at Ray's default of 10 s an idle Ray of a dozen processes
# used ~0.14 of a core here against ~0.21-0.27. The tests that read metrics poll for
# them; the one that checks how fresh a backlog age is at 1 s runs on a Ray of its own.
os.environ.setdefault("RAY_metrics_report_interval_ms", "10000")


_session_ray: list[str] = []  # the GCS address of the session's Ray, once started


@pytest.fixture(scope="session")
def ray_cluster():
    """A real local Ray shared by the tests that need one: the embedded Ray of this
    session's storage root (never a `ray start` cluster some other program left
    running), or the cluster at RAY_ADDRESS."""
    from runtime import connect, disconnect

    if not ray.is_initialized():
        address = None if os.environ.get("RAY_ADDRESS") else "local"
        connect(address, num_cpus=4, include_dashboard=False, log_to_driver=False)
    _session_ray[:] = [ray.get_runtime_context().gcs_address]
    yield
    disconnect()


@pytest.fixture(autouse=True)
def _topics_deleted_after_test() -> Iterator[None]:
    """Deletes the topics a test created on the session's Ray when the test ends (those
    of module fixtures, made before it started, when the module ends).

    Every topic keeps a controller and a coordinator host running, each a process that
    costs Ray's per-process floor for as long as it lives, reports metrics to the node's
    agent every second and runs its maintenance round: left running, the topics of
    earlier tests were a steady share of the whole suite's CPU. The product's own delete
    stops them."""
    yield from _delete_topics_made_meanwhile()


@pytest.fixture(scope="module", autouse=True)
def _topics_deleted_after_module() -> Iterator[None]:
    yield from _delete_topics_made_meanwhile()
    if session_topics() is not None:  # Ray's own get_actor would start a Ray otherwise
        _stop_ray_data_actors()


def _delete_topics_made_meanwhile() -> Iterator[None]:
    before = session_topics()
    yield
    after = session_topics()
    if after is None:
        return
    from clients import ScalableTopicsAdmin
    from runtime.errors import UnauthenticatedError

    try:
        admin = ScalableTopicsAdmin(controller_restart_timeout_s=10)
    except UnauthenticatedError:  # a module's policy asks for tokens: its own end deletes
        return
    for topic in sorted(after - (before or set())):
        try:
            admin.delete_scalable_topic(topic)
        except Exception as err:  # noqa: BLE001 - a topic a test left broken on purpose
            print(f"\nleft {topic} running: {type(err).__name__}: {err}")


# Detached actors Ray Data starts on first use and never stops: left running, they cost
# the rest of the session's run (tests/README.md); the next Ray Data use starts them again.
_RAY_DATA_ACTORS = (
    ("datasets_stats_actor", "_dataset_stats_actor"),
    ("AutoscalingCoordinator", "AutoscalingCoordinator"),
)


def _stop_ray_data_actors() -> None:
    for name, namespace in _RAY_DATA_ACTORS:
        try:
            ray.kill(ray.get_actor(name, namespace=namespace), no_restart=True)
        except ValueError:  # not started by this module
            continue


def session_topics() -> set[str] | None:
    """The topics on the session's Ray (None: this process is not connected to it)."""
    if not (_session_ray and ray.is_initialized()):
        return None
    if ray.get_runtime_context().gcs_address != _session_ray[0]:
        return None
    from storage.catalog import Catalog

    return {str(topic) for topic in Catalog().all_topics()}


_session_spark: list[Any] = []  # the session's Spark, while it runs


@pytest.fixture
def spark(ray_cluster):
    """One Spark session on Ray (RayDP, one small executor) for every test that asks,
    as ``spark_session`` makes it: its streaming source and sink ready; started by the
    first. A parallel run gives all of them to one worker (``SPARK_GROUP``), so only one
    worker starts Spark's JVMs, and it stops them after the group's last test
    (``pytest_runtest_teardown``) rather than let them idle through the rest of the run."""
    if not _session_spark:
        from clients.spark import warm_up
        from clients.spark_session import spark_session

        session = spark_session(
            "raytopics-tests",
            num_executors=1,
            executor_memory="1g",
            configs={"spark.ui.enabled": "false"},
        )
        warm_up(session)  # its streaming source and sink need no other call
        _session_spark.append(session)
    return _session_spark[0]


def _uses_spark(item: pytest.Item | None) -> bool:
    if item is None:
        return False
    return "spark" in item.fixturenames or item.get_closest_marker("spark") is not None


def _stop_session_spark() -> None:
    if _session_spark:
        from clients.spark_session import stop_spark

        stop_spark()
        _session_spark.clear()


@pytest.hookimpl(tryfirst=True)  # before the session's fixtures (its Ray) are torn down
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> None:
    """Stops the session's Spark after the last test. In a parallel run, the Spark group's
    tests come to a worker together and in a row: after the last of them no test of this
    worker asks for Spark again."""
    in_group = os.environ.get("PYTEST_XDIST_WORKER") and _uses_spark(item)
    if nextitem is None or (in_group and not _uses_spark(nextitem)):
        _stop_session_spark()


@pytest.fixture(scope="session")
def s3_endpoint() -> Iterator[str]:
    """The session's S3 server: the ``tier`` bucket of the operator's tiers."""
    with object_store.s3_server(port=object_store.PORTS["tier"]) as endpoint:
        yield endpoint


@pytest.fixture(scope="module")
def admin(ray_cluster):
    """A Ray admin client (modules that need another flavour define their own)."""
    from clients import ScalableTopicsAdmin

    return ScalableTopicsAdmin()


@pytest.fixture
def unique() -> str:
    return uuid.uuid4().hex[:8]


@pytest.fixture
def kv_snapshot(ray_cluster):
    """A callable returning every raw GCS KV entry of this session's namespace: what a
    refused request must leave exactly as it was."""
    from ray.experimental import internal_kv

    def take() -> dict[bytes, bytes | None]:
        namespace = ray.get_runtime_context().namespace
        keys = internal_kv._internal_kv_list(b"", namespace=namespace)
        found = {key: internal_kv._internal_kv_get(key, namespace=namespace) for key in keys}
        return _without_transactions(_live_slots(found))

    return take


def _live_slots(entries: dict[bytes, bytes | None]) -> dict[bytes, bytes | None]:
    """``entries`` without the superseded version slots of each chain
    (``{path}#g{generation}#v{seq}``, ``storage.metadata``): a later write compacts those in
    place at any time, which changes no value anybody reads."""
    latest: dict[bytes, bytes] = {}
    for key in entries:
        chain, versioned, seq = key.rpartition(b"#v")
        if versioned:
            latest[chain] = max(latest.get(chain, b""), seq)
    return {
        key: value
        for key, value in entries.items()
        if not (parts := key.rpartition(b"#v"))[1] or latest[parts[0]] == parts[2]
    }


def _without_transactions(entries: dict[bytes, bytes | None]) -> dict[bytes, bytes | None]:
    """``entries`` without transactions' records: the coordinator's sweeper changes them
    on its own time, whatever test runs then (it aborts one past its deadline, finishes
    a decided one, forgets a finished one). That a refused request leaves a transaction
    as it was is checked by the transaction operations' own tests, reading it back."""
    from storage.metadata_paths import TRANSACTIONS_ROOT

    root = TRANSACTIONS_ROOT.encode()
    return {key: value for key, value in entries.items() if not key.startswith(root)}


# --- tiers and the order of a parallel run -------------------------------------------

# Modules whose tests are each a program of its own (own storage root, own Ray temp
# dir, own ports): a parallel run hands their tests out one by one. Every other
# module runs whole on one worker, so its module fixtures start once.
SPREAD = frozenset({"tests/test_embedded.py", "tests/test_readme.py", "tests/chaos/test_chaos.py"})
SPARK_GROUP = "spark"  # the modules using the session's Spark share a worker


@pytest.hookimpl(tryfirst=True)  # before xdist names the groups in the node ids
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Marks the tests that need a Ray (the ``ray_cluster`` fixture, or a module marked
    ``integration`` for Rays of its own): ``./dev.sh test --quick`` runs the others and
    the ``smoke`` test. In a parallel run, groups each module's tests for one worker and
    puts the longest work first (``tests/weights.py``)."""
    for item in items:
        if "ray_cluster" in item.fixturenames:
            item.add_marker(pytest.mark.integration)
    if os.environ.get("PYTEST_XDIST_WORKER") and config.getvalue("loadgroup"):
        _group_and_order(items)


def _group_and_order(items: list[pytest.Item]) -> None:
    from tests import weights

    spark_modules = {_module(i) for i in items if "spark" in i.fixturenames}
    spark_tests = {i.nodeid for i in items if i.get_closest_marker("spark")}
    units: dict[str, float] = {}
    unit_of: dict[str, str] = {}
    seconds = weights.load()
    for item in items:
        module = _module(item)
        if module in spark_modules or item.nodeid in spark_tests:
            unit = SPARK_GROUP
        elif module in SPREAD:
            unit = item.nodeid
        else:
            unit = module
        if unit != item.nodeid:
            item.add_marker(pytest.mark.xdist_group(unit))
        unit_of[item.nodeid] = unit
        units[unit] = units.get(unit, 0.0) + seconds.get(item.nodeid, weights.UNKNOWN_S)
    first = {unit: index for index, unit in enumerate(dict.fromkeys(unit_of.values()))}
    items.sort(key=lambda i: (-units[unit_of[i.nodeid]], first[unit_of[i.nodeid]]))


def _module(item: pytest.Item) -> str:
    return item.nodeid.split("::", 1)[0]


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):  # noqa: ARG001 - pytest's hook signature
    """Marks a test whose body failed (``item.failed_call``), for fixtures that keep
    evidence only then (the web console's screenshot)."""
    outcome = yield
    report = outcome.get_result()
    if report.when == "call" and report.failed:
        item.failed_call = True
