"""Shared fixtures: one real local Ray per test session, storage on real disk."""

from __future__ import annotations

import os
import tempfile
import uuid

import hypothesis  # noqa: F401 - see below
import pytest
import ray

# Imported now, not by hypothesis's pytest plugin at the terminal summary: a run that
# had no hypothesis test imported it there, with Ray's objects being collected, and
# CPython 3.11.7 failed compiling it ("AST constructor recursion depth mismatch").

_STORAGE = tempfile.mkdtemp(prefix="raytopics-test-")
os.environ.setdefault("RAYTOPICS_STORAGE_ROOT", _STORAGE)
os.environ.setdefault("RAYTOPICS_NAMESPACE", f"raytopics-test-{uuid.uuid4().hex[:8]}")
# Tiers the tests may use: one scratch directory, and the bucket of the S3 server a test
# starts (a fuzzer's made-up tier URIs are refused, never written to).
TIER_ROOT = tempfile.mkdtemp(prefix="raytopics-tiers-")
os.environ.setdefault("RAYTOPICS_TIER_URIS", f"file://{TIER_ROOT}/,s3://tier/")


@pytest.fixture(scope="session")
def ray_cluster():
    """A real local Ray shared by the tests that need one: the embedded Ray of this
    session's storage root (never a `ray start` cluster some other program left
    running), or the cluster at RAY_ADDRESS."""
    from runtime import connect, disconnect

    if not ray.is_initialized():
        address = None if os.environ.get("RAY_ADDRESS") else "local"
        connect(address, num_cpus=4, include_dashboard=False, log_to_driver=False)
    yield
    disconnect()


@pytest.fixture(scope="module")
def spark(ray_cluster):
    """A Spark session on Ray (RayDP, one small executor) for a module's tests, its
    streaming source and sink pointed at a gateway. Per module, not per session: RayDP
    names its app master actor alike in every session, so a Ray namespace holds one
    Spark at a time, and other modules start Spark drivers of their own."""
    from clients.spark import warm_up
    from clients.spark_streaming import enable_streaming
    from runtime.spark import spark_session, stop_spark

    session = spark_session(
        "raytopics-tests",
        num_executors=1,
        executor_memory="1g",
        configs={"spark.ui.enabled": "false"},
    )
    warm_up(session)
    enable_streaming(session)
    yield session
    stop_spark()


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
        return {key: internal_kv._internal_kv_get(key, namespace=namespace) for key in keys}

    return take


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):  # noqa: ARG001 - pytest's hook signature
    """Marks a test whose body failed (``item.failed_call``), for fixtures that keep
    evidence only then (the web console's screenshot)."""
    outcome = yield
    report = outcome.get_result()
    if report.when == "call" and report.failed:
        item.failed_call = True
