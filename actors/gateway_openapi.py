"""The gateway's OpenAPI 3.1 document (``GET /openapi.json``), generated from its route
table (``actors.gateway_routes.ROUTES``) and the pydantic models each route accepts and
answers (``actors.gateway_documents``), and path parameters described by the
same regexes that validate them (``runtime.names``), so the document cannot
drift from what the gateway does.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel
from pydantic.json_schema import models_json_schema

from actors.gateway_documents import ID_PARAMS, MAX_SEGMENT_ID, ErrorBody
from runtime.names import _DESCRIPTOR, _PART

if TYPE_CHECKING:
    from actors.gateway_routes import Route

_REF = "#/components/schemas/{model}"
_STATUS_TEXT = {
    200: "OK",
    401: "No valid bearer token (only while the cluster has an authentication policy)",
    403: "The token's principal lacks the permission on this namespace",
    201: "Created",
    204: "No Content",
    400: "Malformed request: bad JSON, wrong types, unknown fields, invalid names",
    404: "Topic, segment or subscription not found",
    405: "Method not allowed on this path",
    409: "Conflicts with the current state (exists, sealed, not adjacent, in progress)",
    500: "Unexpected internal error",
    503: "A controller or segment is unavailable",
    504: "Not finished within the gateway's time-out (RAYTOPICS_REST_TIMEOUT_S, 30 s by "
    "default); a change asked for may still complete: read the resource to see its state",
}


def _param_schema(name: str) -> dict[str, Any]:
    """The same regexes that validate names describe them, so they cannot drift."""
    if name in ID_PARAMS:
        return {"type": "integer", "minimum": 0, "maximum": MAX_SEGMENT_ID}
    if name == "descriptor":
        return {"type": "string", "pattern": _DESCRIPTOR.pattern, "example": "0000-7fff-1"}
    return {"type": "string", "pattern": _PART.pattern}


def build_openapi(routes: Sequence[Route], secured: bool = True) -> dict[str, Any]:
    """An OpenAPI 3.1 document of ``routes``, schemas generated from their models.

    ``secured``: the cluster has an authentication policy, so operations need a
    bearer token and may answer 401/403; without one the document says neither,
    and a client generated from it sends no ``Authorization`` header."""
    models = {(ErrorBody, "serialization"): None}  # a model can be a body and a reply
    for route in routes:
        if route.body.model_fields:
            models[(route.body, "validation")] = None
        if isinstance(route.returns, type):
            models[(route.returns, "serialization")] = None
    keys, defs = models_json_schema(list(models), ref_template=_REF)
    paths: dict[str, dict[str, Any]] = {}
    for route in routes:
        paths.setdefault(route.path, {})[route.method.lower()] = _operation(route, keys, secured)
    components: dict[str, Any] = {"schemas": defs.get("$defs", {})}
    if secured:
        components["securitySchemes"] = {"bearerAuth": {"type": "http", "scheme": "bearer"}}
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "Scalable Topics on Ray: Admin API",
            "version": "2",
            "description": "Scalable topics (segment DAGs that split and merge) and "
            "segments. Every request is answered within the gateway's time-out "
            "(RAYTOPICS_REST_TIMEOUT_S, 30 s by default), with 504 once it has passed.",
        },
        "paths": paths,
        "components": components,
    }


def _operation(
    route: Route, keys: Mapping[tuple[type, str], dict[str, Any]], secured: bool
) -> dict[str, Any]:
    def ref(model: type[BaseModel], mode: str) -> dict[str, Any]:
        return keys[(model, mode)]

    parameters = [
        {"name": name, "in": "path", "required": True, "schema": _param_schema(name)}
        for name in re.findall(r"{(\w+)}", route.path)
    ]
    query = route.query.model_json_schema()
    for name, schema in query.get("properties", {}).items():
        required = name in query.get("required", ())
        description = schema.pop("description", "")
        parameters.append(
            {"name": name, "in": "query", "required": required, "schema": schema}
            | {"description": description}
        )
    success: dict[str, Any] = {"description": _STATUS_TEXT[route.status]}
    if route.returns is not None:
        returns = route.returns
        schema = ref(returns, "serialization") if isinstance(returns, type) else returns
        success["content"] = {"application/json": {"schema": schema}}
    error = {"application/json": {"schema": ref(ErrorBody, "serialization")}}
    responses = {str(route.status): success}
    guarded = secured and route.permission is not None
    # The policy's own operations may answer 401/403 while authentication is off too:
    # a load there turns it on, for the calls that follow it.
    refusable = guarded or (route.permission is not None and route.tag == "auth")
    timeout = (504,) if route.permission is not None else ()  # every call into the cluster
    for status in (*route.errors, *((401, 403) if refusable else ()), 405, 500, *timeout):
        responses[str(status)] = {"description": _STATUS_TEXT[status], "content": error}
    operation: dict[str, Any] = {
        "operationId": route.operation_id,
        "summary": route.summary,
        "tags": [route.tag],
        "parameters": parameters,
        "responses": responses,
    }
    if route.permission is not None:
        operation["x-permission"] = route.permission.value
    if guarded:
        operation["security"] = [{"bearerAuth": []}]
    if route.body.model_fields:
        operation["requestBody"] = {
            "required": route.body_required,
            "content": {"application/json": {"schema": ref(route.body, "validation")}},
        }
    return operation
