"""The Admin API table (``runtime.admin_api``) against every side that serves or calls it:
the admin service's methods, the gateway's routes, both clients; and the one check
every operation of the service runs first (``actors.admin.permits``), on a real
``Guard`` over an in-memory metadata store. No Ray."""

from __future__ import annotations

import asyncio
import functools
import inspect
import re
from typing import Any

import pytest

from actors.admin.permits import admin_operation, is_admin_operation
from actors.admin.service import AdminService
from actors.gateway.routes import ROUTES
from actors.guard import Guard
from clients.admin import ScalableTopicsAdmin
from clients.admin_calls import AdminCall, AdminCalls
from clients.http import AdminHttpClient, _request_parts
from runtime.admin_api import ENDPOINTS, OPERATIONS, Scope, SegmentId, endpoint_for, operation
from runtime.auth import AuthPolicy, Permission
from runtime.errors import (
    InvalidArgumentError,
    InvalidNameError,
    NotFoundError,
    RequestTimeoutError,
    SegmentNotFoundError,
    TopicNotFoundError,
    UnauthenticatedError,
    UnauthorizedError,
)
from runtime.names import SegmentName, TopicName
from storage.catalog import Catalog
from storage.metadata import MemoryKeyValue, MetadataStore


def _service_methods() -> dict[str, Any]:
    return {
        name: member
        for name, member in inspect.getmembers(AdminService, inspect.iscoroutinefunction)
        if not name.startswith("_")
    }


def test_every_operation_is_a_checked_method_of_the_service_and_nothing_else_is() -> None:
    methods = _service_methods()
    assert set(methods) == set(OPERATIONS), "service methods and the table differ"
    for name, method in methods.items():
        assert is_admin_operation(method), f"AdminService.{name} skips the table's check"
        assert method.admin_operation is OPERATIONS[name]


def test_every_endpoint_has_one_route_and_the_route_follows_its_operation() -> None:
    by_id = {route.operation_id: route for route in ROUTES}
    assert len(by_id) == len(ROUTES)
    assert set(by_id) == set(ENDPOINTS)
    for operation_id, route in by_id.items():
        point = ENDPOINTS[operation_id]
        assert route.endpoint is point
        op = None if point.operation is None else OPERATIONS[point.operation]
        assert route.permission == (None if op is None else op.permission)
        assert route.idempotent == (op is not None and op.request_id)


def test_every_endpoints_path_names_what_its_operation_is_checked_on() -> None:
    """The gateway checks the permission on the namespace the path names, the service
    on the one its argument names: for both to check the same, they must agree."""
    expected = {
        Scope.TOPIC: {"tenant", "namespace", "topic"},
        Scope.NAMESPACE: {"tenant", "namespace"},
        Scope.SEGMENT: {"tenant", "namespace", "topic", "descriptor"},
        Scope.CLUSTER: set(),
        Scope.CALLER: set(),
    }
    for point in ENDPOINTS.values():
        if point.operation is None:
            continue
        fields = set(re.findall(r"{(\w+)}", point.path))
        scope = OPERATIONS[point.operation].scope
        assert expected[scope] <= fields, point.operation_id
        if scope in (Scope.CLUSTER, Scope.CALLER):
            assert not fields & {"tenant", "namespace"}, point.operation_id


def test_creates_rebuilds_splits_and_merges_take_a_request_id() -> None:
    """The mutations whose retry would otherwise be refused once the first attempt
    committed (the topic or subscription exists, the segment is no longer active)."""
    taking = {
        "create_scalable_topic",
        "create_subscription",
        "recover_topic",
        "split_segment",
        "merge_segments",
    }
    assert {op.name for op in OPERATIONS.values() if op.request_id} == taking
    for name in taking:
        parameters = inspect.signature(_service_methods()[name]).parameters
        assert "request_id" in parameters


def test_every_delete_says_which_errors_mean_its_first_attempt_did_it() -> None:
    """A delete sent again after its answer was lost is answered as done when it finds
    its thing gone (``Operation.gone``); nothing else is: a create, split or merge has a
    request id instead, and a not-found of anything else is an error still."""
    deletes = {name for name in OPERATIONS if name.startswith("delete_")}
    assert {name for name, op in OPERATIONS.items() if op.gone} == deletes
    assert OPERATIONS["delete_scalable_topic"].gone == (TopicNotFoundError,)
    for name in deletes:
        assert all(issubclass(error, NotFoundError) for error in OPERATIONS[name].gone)
        assert SegmentNotFoundError not in OPERATIONS[name].gone or name == "delete_segment"


def test_operations_that_start_processes_or_walk_storage_wait_longer_than_reads() -> None:
    """A read is answered within the gateway's time-out; an operation that starts, stops
    or wakes segment processes, or walks a topic's storage, has a longer one of its own;
    an operator's longer gateway time-out still wins for every operation."""
    reads = [op for op in OPERATIONS.values() if op.permission is Permission.LOOKUP]
    assert reads and all(op.timeout_s is None and op.rest_timeout_s(7) == 7 for op in reads)
    slow = {
        "create_scalable_topic", "delete_scalable_topic", "split_segment", "merge_segments",
        "recover_topic", "check_storage", "create_subscription", "delete_subscription",
        "reset_subscription", "create_segment", "terminate_segment", "delete_segment",
    }  # fmt: skip
    assert {n for n, op in OPERATIONS.items() if op.rest_timeout_s(30) > 30} >= slow
    split = OPERATIONS["split_segment"]
    assert split.rest_timeout_s(30) == split.timeout_s and split.rest_timeout_s(900) == 900
    assert OPERATIONS["recover_topic"].timeout_s > split.timeout_s  # it reads every segment


class _SlowAdminService:
    """Stands in for the Ray client's way to the admin service: answers after ``delay_s``."""

    def __init__(self, delay_s: float) -> None:
        self.delay_s = delay_s

    async def call(self, method: str, *args: Any, credential: str | None, **kwargs: Any) -> str:
        await asyncio.sleep(self.delay_s)
        return method


def test_the_ray_admin_client_waits_as_the_gateway_would_and_then_says_so() -> None:
    """No call of ``ScalableTopicsAdmin`` waits forever on a service that does not answer:
    a read for the client's ``request_timeout_s``, an operation with a longer time-out of
    its own (a create starts processes) that long; past it ``RequestTimeoutError``."""
    admin = object.__new__(ScalableTopicsAdmin)  # its calls, without joining a Ray
    admin._token, admin._request_timeout_s = None, 0.3
    admin._service = _SlowAdminService(delay_s=0.8)

    async def timed(method: str) -> tuple[Any, float]:
        started = asyncio.get_running_loop().time()
        try:
            outcome: Any = await admin._call(method, "topic://t/ns/x")
        except RequestTimeoutError as err:
            outcome = err
        return outcome, asyncio.get_running_loop().time() - started

    (read, read_s), (create, create_s) = [
        asyncio.run(timed(m)) for m in ("get_metadata", "create_scalable_topic")
    ]
    assert isinstance(read, RequestTimeoutError) and 0.25 < read_s < 0.7
    assert "within 0.3s" in str(read) and "may still complete" in str(read)
    assert create == "create_scalable_topic" and create_s >= 0.8  # its own 120 s


def test_blocking_twins_show_the_parameters_and_doc_of_their_async_methods() -> None:
    """``help(admin.split_segment)`` shows what it takes (the clients' parity with each
    other is ``test_gateway.test_http_client_has_the_admin_api``)."""
    for cls in (ScalableTopicsAdmin, AdminHttpClient):
        for name in ("split_segment", "merge_segments", "get_stats", "set_namespace_limits"):
            blocking, twin = getattr(cls, name), getattr(cls, f"{name}_async")
            assert inspect.signature(blocking) == inspect.signature(twin)
            assert blocking.__doc__ == twin.__doc__
            assert blocking.__name__ == name


# --- the Admin Client API (clients.admin_calls) against the table ---------------------

_SEGMENT = "segment://t/ns/x/0000-7fff-1"
# Each public method of the Admin Client API, called with arguments it accepts.
_CLIENT_CALLS: dict[str, tuple[tuple[Any, ...], dict[str, Any]]] = {
    "list_scalable_topics": (("t/ns",), {}),
    "get_metadata": (("topic://t/ns/x",), {}),
    "get_layout": (("topic://t/ns/x",), {}),
    "list_subscriptions": (("topic://t/ns/x",), {}),
    "get_stats": (("topic://t/ns/x",), {}),
    "get_status": (("topic://t/ns/x",), {}),
    "watch_layout": (("topic://t/ns/x", 4, 12.5), {}),
    "wait_until_ready": (("topic://t/ns/x", 5.0), {}),
    "create_scalable_topic": (("topic://t/ns/x", 3, {"team": "a"}), {}),
    "delete_scalable_topic": (("topic://t/ns/x",), {}),
    "create_subscription": (("topic://t/ns/x", "s", "latest", 9.0), {}),
    "delete_subscription": (("topic://t/ns/x", "s"), {}),
    "reset_subscription": (("topic://t/ns/x", "s", 1_700_000_000_000), {}),
    "position_at_time": (("topic://t/ns/x", 1_700_000_000_000), {}),
    "clear_backlog": (("topic://t/ns/x", "s"), {}),
    "split_segment": (("topic://t/ns/x", 1), {"at": [5, 9]}),
    "merge_segments": (("topic://t/ns/x", 4, 5, 6), {}),
    "get_policy": (("topic://t/ns/x",), {}),
    "set_policy": (("topic://t/ns/x", {"retention": {"timeS": 60}}), {}),
    "create_segment": ((_SEGMENT, ["s"]), {}),
    "terminate_segment": ((_SEGMENT,), {"force": True}),
    "delete_segment": ((_SEGMENT,), {}),
    "get_namespace_policy": (("t/ns",), {}),
    "set_namespace_policy": (("t/ns", {}), {}),
    "get_namespace_limits": (("t/ns",), {}),
    "set_namespace_limits": (("t/ns",), {"max_message_bytes": 1024}),
    "check_storage": ((), {"delete": True}),
    "recover_topic": (("topic://t/ns/x", "abc"), {}),
    "load_auth": (
        (
            {
                "tokens": [
                    {
                        "principal": "p",
                        "token": "x" * 16,
                        "grants": [{"namespace": "*", "actions": ["admin"]}],
                    }
                ]
            },
        ),
        {},
    ),  # fmt: skip
    "disable_auth": ((), {}),
    "auth_status": ((), {}),
    "new_transaction": ((30.0, "etl-1"), {}),
    "get_transaction": (("txn-1",), {}),
    "list_transactions": ((), {}),
    "commit_transaction": (("txn-1",), {}),
    "abort_transaction": (("txn-1",), {}),
    "transaction_acknowledge": (("txn-1", _SEGMENT, "s", 7), {"cumulative": True}),
}

# What a stand-in answers each operation with, for the methods that read the answer.
_ANSWERS: dict[str, Any] = {
    "get_metadata": None,
    "topic_status": {"state": "ready", "segments": 1, "running": 1, "notRunning": []},
    "stream_initial": {"position": {"next": {}, "finished": []}},
    "watch_layout": {"layout": None},
    "new_transaction": {"txnId": "txn-1", "deadlineMs": 0},
}


class _Recorded(AdminCalls):
    """The Admin Client API with a transport that records each call."""

    def __init__(self) -> None:
        self.calls: list[AdminCall] = []

    async def _run(self, call: AdminCall) -> Any:
        self.calls.append(call)
        return _ANSWERS.get(call.operation)


def _recorded_calls() -> dict[str, list[AdminCall]]:
    by_method = {}
    for method, (args, kwargs) in _CLIENT_CALLS.items():
        client = _Recorded()
        if method != "get_layout":  # parses a real layout: its call is get_metadata's
            getattr(client, method)(*args, **kwargs)
        by_method[method] = client.calls
    return by_method


def test_every_method_of_the_client_api_is_called_here() -> None:
    public = {
        name.removesuffix("_async")
        for name, member in inspect.getmembers(AdminCalls, inspect.iscoroutinefunction)
        if name.endswith("_async")
    }
    assert public == set(_CLIENT_CALLS)
    for cls in (ScalableTopicsAdmin, AdminHttpClient):  # both are exactly this API
        assert issubclass(cls, AdminCalls)
        for name in public:
            assert getattr(cls, f"{name}_async") is getattr(AdminCalls, f"{name}_async"), name


def test_every_client_call_binds_to_its_handler_and_reaches_a_rest_endpoint() -> None:
    """What the Ray client sends is what the service's handler takes, by name; and the
    REST client finds the endpoint for it and builds its request from the table."""
    service = _service_methods()
    for method, calls in _recorded_calls().items():
        for call in calls:
            handler = inspect.signature(service[call.operation])
            handler.bind(None, **call.args)  # raises TypeError when the names differ
            point = endpoint_for(call.operation, call.args)
            _request_parts(point, call.args)  # raises LookupError for an argument left
            assert point.operation == call.operation, method


def test_rest_requests_are_built_from_the_declared_fields() -> None:
    def request(method: str) -> tuple[str, str, Any, Any]:
        (call,) = [c for c in _recorded_calls()[method] if c.operation != "get_metadata"]
        point = endpoint_for(call.operation, call.args)
        return (point.operation_id, *_request_parts(point, call.args))

    assert request("create_scalable_topic") == (
        "createScalableTopic", "/admin/v2/scalable/t/ns/x",
        {"numSegments": 3, "properties": {"team": "a"}}, None,
    )  # fmt: skip
    assert request("split_segment") == (
        "splitSegment",
        "/admin/v2/scalable/t/ns/x/split/1",
        {"at": [5, 9]},
        None,
    )
    assert request("merge_segments") == (
        "mergeSegments",
        "/admin/v2/scalable/t/ns/x/merge/4/5",
        {"moreSegmentIds": [6]},
        None,
    )
    assert request("terminate_segment") == (
        "terminateSegment", "/admin/v2/segments/t/ns/x/0000-7fff-1/terminate", None,
        {"force": "true"},
    )  # fmt: skip
    # the endpoint fixing the call's argument is chosen over the general one
    assert request("check_storage")[:2] == ("deleteOrphanedStorage", "/admin/v2/storage/orphaned")
    assert request("clear_backlog")[0] == "clearBacklog"
    assert request("reset_subscription")[2] == {"to": 1_700_000_000_000}
    assert request("set_namespace_limits")[2] == {"max_message_bytes": 1024}
    with pytest.raises(InvalidNameError):  # checked before any I/O, as the cluster would
        _request_parts(ENDPOINTS["getMetadata"], {"name": "topic://t/ns/a b"})


def test_every_endpoint_carries_what_its_handler_needs_in_the_routes_fields() -> None:
    """Each endpoint's declared path, body and query parameters are its handler's, its
    body and query field names are those its route accepts, and every parameter the
    handler needs a value for is carried (or the route's own action supplies it)."""
    service = _service_methods()
    for route in ROUTES:
        point = route.endpoint
        if point.operation is None:
            continue
        handler = inspect.signature(service[point.operation]).parameters
        assert point.carries() <= set(handler), point.operation_id
        body_names = {f.alias or n for n, f in route.body.model_fields.items()}
        query_names = {f.alias or n for n, f in route.query.model_fields.items()}
        assert set(point.body) <= body_names, point.operation_id
        assert set(point.query) <= query_names, point.operation_id
        declared = isinstance(route.action, functools.partial)  # the table's own action
        needed = {
            name
            for name, parameter in list(handler.items())[1:]
            if parameter.default is inspect.Parameter.empty
            and parameter.kind is not inspect.Parameter.KEYWORD_ONLY
        }
        if declared:
            assert needed <= point.carries(), point.operation_id


def test_an_undeclared_operation_cannot_be_defined() -> None:
    with pytest.raises(LookupError, match="not an Admin API operation"):

        @admin_operation
        async def rename_topic(self: Any, name: TopicName, *, credential: str | None = None):
            return name

    assert operation("split_segment").permission is Permission.ADMIN


# --- the check every operation runs first ------------------------------------------------

ADMIN_TOKEN, READER_TOKEN = "admin-token-" * 3, "reader-token-" * 3


class Service:
    """What ``admin_operation`` needs of the admin service: the cluster's policy."""

    def __init__(self, guard: Guard) -> None:
        self._guard = guard
        self.calls: list[tuple[str, Any]] = []

    @admin_operation
    async def get_metadata(self, name: TopicName, *, credential: str | None = None) -> Any:
        self.calls.append(("get_metadata", name))
        return name

    @admin_operation
    async def split_segment(
        self,
        name: TopicName,
        segment_id: SegmentId,
        *,
        request_id: str | None = None,
        credential: str | None = None,
    ) -> Any:
        self.calls.append(("split_segment", (name, segment_id, request_id)))
        return name

    @admin_operation
    async def delete_segment(
        self, segment: SegmentName, force: bool = False, *, credential: str | None = None
    ) -> Any:
        self.calls.append(("delete_segment", segment))
        return segment

    @admin_operation
    async def auth_status(self, *, credential: str | None = None) -> Any:
        self.calls.append(("auth_status", None))
        return "status"


@pytest.fixture
def service() -> Service:
    catalog = Catalog(store=MetadataStore(kv=MemoryKeyValue()))
    grants = [
        ("ops", ADMIN_TOKEN, "*", "admin"),
        ("reader", READER_TOKEN, "t/ns", "lookup"),
    ]
    document = {
        "tokens": [
            {"principal": p, "token": t, "grants": [{"namespace": ns, "actions": [a]}]}
            for p, t, ns, a in grants
        ]
    }
    catalog.replace_auth(AuthPolicy.from_config(document))
    return Service(Guard(catalog))


def run(coro: Any) -> Any:
    return asyncio.run(coro)


def test_the_method_gets_the_checked_name_however_it_was_passed(service: Service) -> None:
    topic = "topic://t/ns/orders"
    by_position = run(service.get_metadata(topic, credential=READER_TOKEN))
    by_keyword = run(service.get_metadata(name=topic, credential=READER_TOKEN))
    assert by_position == by_keyword == TopicName.parse(topic)
    segment = run(
        service.delete_segment("segment://t/ns/orders/0000-7fff-1", credential=ADMIN_TOKEN)
    )
    assert segment == SegmentName.parse("segment://t/ns/orders/0000-7fff-1")


def test_who_asks_comes_first_then_the_name_then_the_grant(service: Service) -> None:
    with pytest.raises(UnauthenticatedError):
        run(service.get_metadata("not a topic", credential=None))
    with pytest.raises(InvalidNameError):
        run(service.get_metadata("not a topic", credential=READER_TOKEN))
    with pytest.raises(UnauthorizedError):
        run(service.get_metadata("topic://other/ns/orders", credential=READER_TOKEN))
    with pytest.raises(UnauthorizedError):  # by keyword: no way around the check
        run(service.get_metadata(name="topic://other/ns/orders", credential=READER_TOKEN))
    with pytest.raises(UnauthorizedError):  # lookup is not admin
        run(service.split_segment("topic://t/ns/orders", 0, credential=READER_TOKEN))
    with pytest.raises(UnauthorizedError):  # the cluster's operations need admin on "*"
        run(service.auth_status(credential=READER_TOKEN))
    assert service.calls == []  # nothing refused ran
    assert run(service.auth_status(credential=ADMIN_TOKEN)) == "status"


def test_arguments_that_do_not_fit_are_a_typed_error(service: Service) -> None:
    with pytest.raises(InvalidArgumentError, match="split_segment"):
        run(service.split_segment("topic://t/ns/orders", credential=ADMIN_TOKEN))
    with pytest.raises(InvalidArgumentError, match="split_segment"):
        run(service.split_segment("topic://t/ns/orders", 0, 1, credential=ADMIN_TOKEN))
    assert service.calls == []


def test_each_argument_is_checked_against_its_parameters_type(service: Service) -> None:
    topic, segment = "topic://t/ns/orders", "segment://t/ns/orders/0000-7fff-1"
    for bad in ("0", True, 0.0, None, -1):
        with pytest.raises(InvalidArgumentError, match=r"split_segment: segment_id: "):
            run(service.split_segment(topic, bad, credential=ADMIN_TOKEN))
    with pytest.raises(InvalidArgumentError, match=r"delete_segment: force: .*boolean"):
        run(service.delete_segment(segment, "yes", credential=ADMIN_TOKEN))
    with pytest.raises(InvalidArgumentError, match=r"request_id: .*string"):
        run(service.split_segment(topic, 0, request_id=7, credential=ADMIN_TOKEN))
    assert service.calls == []  # nothing refused ran
    run(service.split_segment(topic, 2, request_id="r-1", credential=ADMIN_TOKEN))
    assert service.calls == [("split_segment", (TopicName.parse(topic), 2, "r-1"))]


def test_the_real_services_parameters_are_typed_and_refuse_what_does_not_fit() -> None:
    """Every handler's annotations resolve (pydantic built each check when the service
    was imported), and a constrained one refuses out-of-range values before running."""
    catalog = Catalog(store=MetadataStore(kv=MemoryKeyValue()))
    service = AdminService.__new__(AdminService)  # its checks need only the policy
    service._guard, service._catalog = Guard(catalog), catalog
    topic = "topic://t/ns/orders"
    refused = [
        ("create_scalable_topic", (topic, 0), "num_segments"),
        ("create_scalable_topic", (topic, 2, {"k": 1}), "properties.k"),
        ("topic_status", (topic, 61.0), "wait_s"),
        ("topic_status", (topic, float("nan")), "wait_s"),
        ("merge_segments", (topic, 0, -3), "segment_id2"),
        ("set_namespace_limits", ("t/ns", {"max_batch_bytes": "10"}), "limits.max_batch_bytes"),
        ("plan_snapshot", (topic, "earliest", "latest", None, -1), "unavailable_timeout_s"),
        ("sink_open", (topic, "q", 0, -1, 0, []), "chunk"),
        ("stream_write", (topic, "q", 0, 0, 0, [["k", b"v", None]]), "records.0"),
    ]
    for name, args, parameter in refused:
        method = getattr(service, name)
        with pytest.raises(InvalidArgumentError, match=rf"{name}: {re.escape(parameter)}"):
            run(method(*args))
