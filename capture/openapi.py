"""The OpenAPI 3 document of the ``/api/v2`` HTTP API, served at ``GET /api/v2/openapi.json``.

Hand-written so that it reads as documentation; ``tests/e2e/test_api.py`` checks that it lists exactly
the routes ``capture.api.ApiServer`` serves. Pure data: :func:`openapi_document` returns a new dict each
call (callers may modify it).
"""

from __future__ import annotations

import copy
from typing import Any

VERSION = "0.1.0"


def _ref(name: str) -> dict[str, str]:
    return {"$ref": f"#/components/schemas/{name}"}


def _json(schema: dict[str, Any], description: str) -> dict[str, Any]:
    return {"description": description, "content": {"application/json": {"schema": schema}}}


def _error(description: str) -> dict[str, Any]:
    return _json(_ref("Error"), description)


_CF_PARAM = {"name": "changefeed_id", "in": "path", "required": True, "description": "changefeed id",
             "schema": {"type": "string", "pattern": "^[a-zA-Z0-9]+(-[a-zA-Z0-9]+)*$"}}
_RUN_PARAM = {"name": "run_id", "in": "path", "required": True, "description": "verify run id",
              "schema": {"type": "string", "pattern": "^[a-f0-9]{1,32}$"}}
_CAPTURE_PARAM = {"name": "capture_id", "in": "path", "required": True, "description": "capture id",
                  "schema": {"type": "string", "pattern": "^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$"}}

_ERRORS_CF = {"404": _error("no such changefeed (CDC:ErrChangefeedNotFound)"),
              "503": _error("etcd unavailable (CDC:ErrEtcd)")}

_SCHEMAS: dict[str, Any] = {
    "Error": {
        "type": "object", "required": ["error_code", "error_msg"],
        "description": "Every error answer. error_code is stable (CDC:ErrXxx); error_msg is for humans.",
        "properties": {"error_code": {"type": "string", "example": "CDC:ErrChangefeedNotFound"},
                       "error_msg": {"type": "string"}},
    },
    "RunningError": {
        "type": "object", "nullable": True,
        "properties": {"code": {"type": "string"}, "message": {"type": "string"}, "time": {"type": "number"},
                       "capture_id": {"type": "string"}, "span": {"type": "integer"},
                       "retryable": {"type": "boolean"},
                       "data_warning": {"type": "boolean",
                                        "description": "the changefeed is in warning because of an unacknowledged "
                                                       "divergence data warning (this is its code and message)"}},
    },
    "DataWarning": {
        "type": "object",
        "description": "Something that can make (or made) the target differ from the source, per table and "
                       "kind. divergence: rows may differ, the changefeed stays in warning until resumed "
                       "(resume acknowledges every warning shown); notice: repaired, shown and counted only.",
        "properties": {
            "code": {"type": "string", "example": "CDC:WarnUnreplicatedRows"},
            "table": {"type": "string", "description": "upstream table, schema.name"},
            "severity": {"type": "string", "enum": ["divergence", "notice"]},
            "count": {"type": "integer", "description": "rows (or events) concerned so far"},
            "keys": {"type": "array", "items": {"type": "string"}, "description": "the first few keys, as text"},
            "first_time": {"type": "number", "description": "unix time first raised"},
            "last_time": {"type": "number", "description": "unix time last raised"},
            "message": {"type": "string", "description": "what happened and what to do"},
        },
    },
    "Health": {"type": "object", "properties": {"status": {"type": "string", "enum": ["ok"]}}},
    "Status": {
        "type": "object", "description": "the answering capture",
        "properties": {"id": {"type": "string"}, "version": {"type": "string"}, "pid": {"type": "integer"},
                       "addr": {"type": "string"}, "cluster_id": {"type": "string"},
                       "is_owner": {"type": "boolean"},
                       "spans": {"type": "array", "items": {"type": "string"}, "description": "cf/span running here"}},
        "additionalProperties": True,
    },
    "CreateChangefeed": {
        "type": "object", "required": ["changefeed_id", "upstream_uri", "sink_uri"], "additionalProperties": False,
        "properties": {
            "changefeed_id": {"type": "string", "maxLength": 64, "pattern": "^[a-zA-Z0-9]+(-[a-zA-Z0-9]+)*$"},
            "upstream_uri": {"type": "string", "example": "postgresql://repl:secret@db1:5432/shop"},
            "sink_uri": {"type": "string", "example": "mysql://app:secret@db2:3306/shop"},
            "config": {"type": "string", "description": "changefeed TOML (span-count, [filter], [sink])"},
            "target_ts": {"type": "integer", "minimum": 0, "description": "finish at this Ts (0: never)"},
            "snapshot": {"type": "string", "enum": ["initial", "none"],
                         "description": "copy the existing rows first (initial, the default) or stream changes only; "
                                        "overrides [snapshot] mode of config"},
        },
    },
    "UpdateChangefeed": {
        "type": "object", "additionalProperties": False, "minProperties": 1,
        "description": "Only for a stopped changefeed. Omitted fields keep their value. span-count and the "
                       "upstream's host/port/database cannot change.",
        "properties": {
            "sink_uri": {"type": "string"},
            "upstream_uri": {"type": "string", "description": "same server and database; new credentials/options"},
            "config": {"type": "string", "description": "a whole changefeed TOML (replaces the config)"},
            "target_ts": {"type": "integer", "minimum": 0},
            "skip_ddl_ts": {"type": "integer", "minimum": 1,
                            "description": "skip the DDL of the upstream transaction committed at this Ts (named in "
                                           "the changefeed's CDC:ErrDdlRejected error), knowingly"},
        },
    },
    "SpanView": {
        "type": "object",
        "properties": {"index": {"type": "integer"}, "slot": {"type": "string"}, "publication": {"type": "string"},
                       "start_ts": {"type": "integer"}, "capture": {"type": "string", "nullable": True},
                       "checkpoint_ts": {"type": "integer", "nullable": True},
                       "checkpoint": {"type": "string", "nullable": True},
                       "resume_token": {"type": "string", "nullable": True,
                                        "description": "the upstream's own resume position after the checkpoint, "
                                                       "opaque (MySQL/MariaDB: JSON with the GTID state and the "
                                                       "binlog file/position); null: none"},
                       "resolved_ts": {"type": "integer", "nullable": True}, "running": {"type": "boolean"},
                       "rows": {"type": "integer"}, "error": _ref("RunningError"),
                       "warnings": {"type": "integer", "description": "data warnings stored by this span"},
                       "table_copy": {"type": "object", "nullable": True,
                                      "description": "the span's last table copy (joined table or resync)",
                                      "properties": {"tables": {"type": "array", "items": {"type": "string"}},
                                                     "phase": {"type": "string", "enum": ["copying", "done"]}}},
                       "watermark_hold_ts": {"type": "integer", "nullable": True,
                                             "description": "while a table copy runs: the span's watermarks "
                                                            "downstream stay at or below this Ts"}},
        "additionalProperties": True,
    },
    "Changefeed": {
        "type": "object",
        "properties": {
            "id": {"type": "string"},
            "state": {"type": "string", "enum": ["normal", "warning", "stopped", "failed", "finished", "removed"]},
            "upstream_uri": {"type": "string", "description": "password redacted"},
            "sink_uri": {"type": "string", "description": "password redacted"},
            "config": {"type": "object"}, "start_ts": {"type": "integer"}, "target_ts": {"type": "integer"},
            "create_time": {"type": "number"}, "checkpoint_ts": {"type": "integer"},
            "checkpoint": {"type": "string", "description": "checkpoint as an LSN, X/X"},
            "checkpoint_time": {"type": "number"},
            "checkpoint_lag": {"type": "number", "nullable": True, "description": "seconds"},
            "resolved_ts": {"type": "integer"}, "resolved_lag": {"type": "number", "nullable": True},
            "consistency": {
                "type": "object", "description": "what a reader of the target may see (docs/architecture.md)",
                "properties": {"mode": {"type": "string", "enum": ["transaction", "per-key"]},
                               "spans": {"type": "integer"}, "apply_workers": {"type": "integer"},
                               "detail": {"type": "string"}}},
            "published_checkpoint_hold_ts": {
                "type": "integer", "nullable": True,
                "description": "while a table copy runs: the checkpoint published to the sink (Kafka watermarks, "
                               "the storage sink's metadata) is held at this Ts, below the copy's rows"},
            "error": _ref("RunningError"),
            "warnings": {"type": "array", "items": _ref("DataWarning"),
                         "description": "unacknowledged data warnings of every span and of the owner's upstream "
                                        "watch, oldest first (at most 50)"},
            "spans": {"type": "array", "items": _ref("SpanView")},
            "table_copies": {"type": "array", "description": "table copies asked for and not yet taken up by their span",
                             "items": {"type": "object", "properties": {
                                 "table": {"type": "string"}, "span": {"type": "integer"},
                                 "reason": {"type": "string", "enum": ["joined", "resync"]},
                                 "requested_at": {"type": "number"}}}},
        },
        "additionalProperties": True,
    },
    "ResyncTables": {
        "type": "object", "required": ["tables"], "additionalProperties": False,
        "properties": {"tables": {"type": "array", "minItems": 1, "maxItems": 1000,
                                  "items": {"type": "string", "minLength": 1, "maxLength": 300},
                                  "description": "schema.name of replicated tables"}},
    },
    "VerifyRequest": {
        "type": "object", "additionalProperties": False,
        "properties": {"tables": {"type": "array", "minItems": 1, "maxItems": 1000,
                                  "items": {"type": "string", "minLength": 1, "maxLength": 300},
                                  "description": "schema.name of replicated tables (absent: every table)"},
                       "chunk_rows": {"type": "integer", "minimum": 1,
                                      "description": "rows per compared chunk (default: [snapshot] chunk-rows)"}},
    },
    "VerifyRun": {
        "type": "object",
        "description": "a changefeed verify job (docs/verify.md); report: per table rows each side, chunks compared "
                       "and differing, the differing keys (capped, with a count beyond the cap); exit_code in the "
                       "CLI: 0 equal, 1 differs, 2 could not run",
        "properties": {"id": {"type": "string"}, "state": {"type": "string", "enum": ["running", "done", "failed"]},
                       "started": {"type": "number"}, "finished": {"type": "number"},
                       "tables": {"type": "array", "items": {"type": "string"}}, "capture": {"type": "string"},
                       "chunks": {"type": "integer"}, "chunks_done": {"type": "integer"},
                       "report": {"type": "object", "nullable": True}, "error": {"type": "string"}},
        "additionalProperties": True,
    },
    "ChangefeedSummary": {
        "type": "object",
        "properties": {"id": {"type": "string"}, "state": {"type": "string"}, "checkpoint_ts": {"type": "integer"},
                       "checkpoint": {"type": "string"}, "checkpoint_lag": {"type": "number", "nullable": True},
                       "error": _ref("RunningError"),
                       "warnings": {"type": "integer", "description": "number of unacknowledged data warnings"}},
        "additionalProperties": True,
    },
    "ChangefeedList": {
        "type": "object",
        "properties": {"total": {"type": "integer"}, "items": {"type": "array", "items": _ref("ChangefeedSummary")}},
    },
    "UpdateResult": {
        "type": "object",
        "properties": {
            "changefeed": _ref("Changefeed"),
            "diff": {"type": "object", "description": "field -> {old, new}; config keys as config.section.key; "
                                                      "tables: the replicated table set when it changed",
                     "additionalProperties": {"type": "object", "properties": {"old": {}, "new": {}}}},
        },
    },
    "Capture": {
        "type": "object",
        "properties": {"id": {"type": "string"}, "address": {"type": "string"}, "is_owner": {"type": "boolean"},
                       "draining": {"type": "boolean"}, "version": {"type": "string"},
                       "start_time": {"type": "number"}, "pid": {"type": "integer"},
                       "spans": {"type": "integer", "description": "spans assigned to it"}},
    },
    "DrainResult": {
        "type": "object",
        "properties": {"id": {"type": "string"}, "draining": {"type": "boolean"},
                       "remaining_spans": {"type": "integer", "description": "still assigned when answering"}},
    },
    "ProcessorSpan": {
        "type": "object",
        "properties": {"index": {"type": "integer"}, "epoch": {"type": "integer"},
                       "stopping": {"type": "boolean", "description": "being moved off this capture"},
                       "checkpoint_ts": {"type": "integer", "nullable": True},
                       "checkpoint": {"type": "string", "nullable": True},
                       "checkpoint_lag": {"type": "number", "nullable": True},
                       "resolved_ts": {"type": "integer", "nullable": True},
                       "resolved_lag": {"type": "number", "nullable": True},
                       "running": {"type": "boolean"}, "rows": {"type": "integer"}, "error": _ref("RunningError")},
    },
    "Processor": {
        "type": "object", "description": "the spans of one changefeed assigned to one capture",
        "properties": {"changefeed_id": {"type": "string"}, "capture_id": {"type": "string"},
                       "address": {"type": "string", "nullable": True},
                       "checkpoint_ts": {"type": "integer", "nullable": True},
                       "checkpoint": {"type": "string", "nullable": True},
                       "resolved_ts": {"type": "integer", "nullable": True},
                       "spans": {"type": "array", "items": _ref("ProcessorSpan")},
                       "errors": {"type": "array", "items": {"type": "object"}}},
    },
    "ProcessorList": {
        "type": "object",
        "properties": {"total": {"type": "integer"}, "items": {"type": "array", "items": _ref("Processor")}},
    },
    "ResignResult": {
        "type": "object",
        "properties": {"resigned": {"type": "boolean"}, "previous_owner": {"type": "string"},
                       "owner": {"type": "string", "nullable": True, "description": "the owner elected next"},
                       "same_capture": {"type": "boolean"}, "message": {"type": "string"}},
    },
}

_PATHS: dict[str, Any] = {
    "/api/v2/health": {"get": {
        "summary": "liveness of this capture (registered in etcd)", "operationId": "health",
        "responses": {"200": _json(_ref("Health"), "registered"),
                      "500": _error("not registered (session lost or starting)")}}},
    "/api/v2/status": {"get": {
        "summary": "the answering capture: id, address, owner or not, spans it runs", "operationId": "status",
        "responses": {"200": _json(_ref("Status"), "status")}}},
    "/api/v2/openapi.json": {"get": {
        "summary": "this document", "operationId": "openapi",
        "responses": {"200": {"description": "OpenAPI 3 document", "content": {"application/json": {}}}}}},
    "/api/v2/changefeeds": {
        "get": {"summary": "list changefeeds", "operationId": "listChangefeeds",
                "responses": {"200": _json(_ref("ChangefeedList"), "changefeeds sorted by id"),
                              "503": _error("etcd unavailable")}},
        "post": {"summary": "create a changefeed (validates everything, creates a slot + publication per span)",
                 "operationId": "createChangefeed",
                 "requestBody": {"required": True, "content": {"application/json": {"schema": _ref("CreateChangefeed")}}},
                 "responses": {"201": _json(_ref("Changefeed"), "created"),
                               "400": _error("invalid id, URI, config, filter, ineligible table, target conflict"),
                               "409": _error("the id exists (CDC:ErrChangefeedAlreadyExists)"),
                               "503": _error("upstream, sink or etcd unreachable")}},
    },
    "/api/v2/changefeeds/{changefeed_id}": {
        "parameters": [_CF_PARAM],
        "get": {"summary": "query a changefeed: state, watermarks and lags, spans", "operationId": "getChangefeed",
                "responses": {"200": _json(_ref("Changefeed"), "the changefeed"), **_ERRORS_CF}},
        "put": {"summary": "update a stopped changefeed (sink URI, config, target Ts, upstream credentials)",
                "operationId": "updateChangefeed",
                "requestBody": {"required": True, "content": {"application/json": {"schema": _ref("UpdateChangefeed")}}},
                "responses": {"200": _json(_ref("UpdateResult"), "updated; the diff lists what changed"),
                              "400": _error("invalid input, span-count change, other upstream server/database"),
                              "409": _error("not stopped (CDC:ErrChangefeedStateConflict): pause it first"),
                              **_ERRORS_CF}},
        "delete": {"summary": "remove a changefeed: marks it removed; the owner drops its slots, publications "
                              "and keys shortly after", "operationId": "removeChangefeed",
                   "responses": {"202": _json(_ref("Changefeed"), "marked removed"), **_ERRORS_CF}},
    },
    "/api/v2/changefeeds/{changefeed_id}/pause": {
        "parameters": [_CF_PARAM],
        "post": {"summary": "pause (state stopped); its processors stop, the slots keep the changes",
                 "operationId": "pauseChangefeed",
                 "responses": {"200": _json(_ref("Changefeed"), "stopped"),
                               "409": _error("cannot be paused in its state"), **_ERRORS_CF}}},
    "/api/v2/changefeeds/{changefeed_id}/snapshot": {
        "parameters": [_CF_PARAM],
        "post": {"summary": "copy tables again (a resync) while the changefeed streams: each table is emptied "
                            "downstream and copied under a new snapshot; only its own changes wait meanwhile",
                 "operationId": "resyncTables",
                 "requestBody": {"required": True, "content": {"application/json": {"schema": _ref("ResyncTables")}}},
                 "responses": {"202": _json(_ref("Changefeed"), "the copies are asked for"),
                               "400": _error("no table, or a table the changefeed does not replicate"),
                               "409": _error("the changefeed is being removed"), **_ERRORS_CF}}},
    "/api/v2/changefeeds/{changefeed_id}/verify": {
        "parameters": [_CF_PARAM],
        "post": {"summary": "start a verify job: the target compared with the upstream at one consistent point, "
                            "chunk by chunk on Spark (the changefeed is held at that point for as short as it can)",
                 "operationId": "verifyChangefeed",
                 "requestBody": {"required": False,
                                 "content": {"application/json": {"schema": _ref("VerifyRequest")}}},
                 "responses": {"202": _json(_ref("VerifyRun"), "started: poll it by its id"),
                               "400": _error("a table the changefeed does not replicate, or not a SQL target"),
                               "409": _error("the changefeed is being removed"), **_ERRORS_CF}}},
    "/api/v2/changefeeds/{changefeed_id}/verify/{run_id}": {
        "parameters": [_CF_PARAM, _RUN_PARAM],
        "get": {"summary": "a verify job: running, done (with its report) or failed", "operationId": "getVerifyRun",
                "responses": {"200": _json(_ref("VerifyRun"), "the job"),
                              "404": _error("no such run (CDC:ErrVerifyRunNotFound)")}},
        "delete": {"summary": "stop a running verify job of this capture (it releases its hold first)",
                   "operationId": "stopVerifyRun",
                   "responses": {"202": _json(_ref("VerifyRun"), "asked to stop"),
                                 "404": _error("not a running job of this capture (CDC:ErrVerifyRunNotFound)")}}},
    "/api/v2/changefeeds/{changefeed_id}/resume": {
        "parameters": [_CF_PARAM],
        "post": {"summary": "resume (state normal), also from failed once the cause is gone; acknowledges every "
                            "error and data warning raised so far (also on a running changefeed)",
                 "operationId": "resumeChangefeed",
                 "responses": {"200": _json(_ref("Changefeed"), "normal"),
                               "409": _error("cannot be resumed in its state"), **_ERRORS_CF}}},
    "/api/v2/captures": {"get": {
        "summary": "live captures (a bare array, for compatibility)", "operationId": "listCaptures",
        "responses": {"200": _json({"type": "array", "items": _ref("Capture")}, "captures sorted by id"),
                      "503": _error("etcd unavailable")}}},
    "/api/v2/captures/{capture_id}/drain": {
        "parameters": [_CAPTURE_PARAM],
        "post": {"summary": "mark a capture draining: the owner moves its spans to the other captures",
                 "operationId": "drainCapture",
                 "responses": {"202": _json(_ref("DrainResult"), "marked draining"),
                               "404": _error("no such capture (CDC:ErrCaptureNotFound)"),
                               "409": _error("it is the only capture not draining (CDC:ErrCaptureStateConflict)")}}},
    "/api/v2/processors": {"get": {
        "summary": "one item per (changefeed, capture) with spans assigned", "operationId": "listProcessors",
        "responses": {"200": _json(_ref("ProcessorList"), "processors"), "503": _error("etcd unavailable")}}},
    "/api/v2/processors/{changefeed_id}/{capture_id}": {
        "parameters": [_CF_PARAM, _CAPTURE_PARAM],
        "get": {"summary": "the spans of one changefeed on one capture", "operationId": "getProcessor",
                "responses": {"200": _json(_ref("Processor"), "processor"),
                              "404": _error("no such changefeed, capture, or no span of it there "
                                            "(CDC:ErrChangefeedNotFound, CDC:ErrCaptureNotFound, "
                                            "CDC:ErrProcessorNotFound)")}}},
    "/api/v2/owner/resign": {"post": {
        "summary": "make the owner resign and campaign again (any capture forwards it to the owner)",
        "operationId": "resignOwner",
        "requestBody": {"required": False, "content": {"application/json": {"schema": {"type": "object"}}}},
        "responses": {"200": _json(_ref("ResignResult"), "resigned; names the next owner"),
                      "501": _error("the capture has no resign hook (CDC:ErrNotImplemented)"),
                      "502": _error("the owner did not answer the forwarded request (CDC:ErrOwnerUnreachable)"),
                      "503": _error("no owner right now, or ownership changed meanwhile (CDC:ErrNotOwner)")}}},
}

_COMMON_ERRORS = {"400": _error("request body is not a JSON object or has unknown fields (CDC:ErrInvalidArgument)"),
                  "405": _error("known path, other method (CDC:ErrMethodNotAllowed)"),
                  "500": _error("internal error (CDC:ErrInternal)")}

# what any request can be refused with before its route runs (docs/api.md, "Security")
_GUARD_ERRORS = {"401": _error("no or a wrong API token (CDC:ErrUnauthorized); mutating routes always need one "
                               "when the server has tokens, GET routes with auth-read = protected"),
                 "408": _error("the request did not arrive within request-timeout (CDC:ErrRequestTimeout)"),
                 "413": _error("body over max-body-bytes, refused unread (CDC:ErrRequestTooLarge)")}


def _with_guard_errors(paths: dict[str, Any]) -> dict[str, Any]:
    for path, item in paths.items():
        for method, op in item.items():
            if method in ("get", "put", "post", "delete") and path != "/api/v2/health":
                for code, answer in _GUARD_ERRORS.items():
                    op["responses"].setdefault(code, answer)
    return paths


_DOCUMENT: dict[str, Any] = {
    "openapi": "3.0.3",
    "info": {"title": "Tidewater HTTP API", "version": VERSION,
             "description": "Served by every capture under /api/v2. Errors are JSON objects "
                            "{error_code, error_msg}. Passwords in URIs are always redacted in answers. "
                            "With API tokens configured, send 'Authorization: Bearer TOKEN' (or basic auth with "
                            "the token as password)."},
    "paths": _with_guard_errors(_PATHS),
    "security": [{}, {"bearerAuth": []}, {"basicAuth": []}],
    "components": {"schemas": _SCHEMAS, "responses": {k: v for k, v in _COMMON_ERRORS.items()},
                   "securitySchemes": {"bearerAuth": {"type": "http", "scheme": "bearer"},
                                       "basicAuth": {"type": "http", "scheme": "basic"}}},
}


def openapi_document() -> dict[str, Any]:
    """A fresh copy of the OpenAPI 3 document (every route, request body and the error schema)."""
    return copy.deepcopy(_DOCUMENT)


def documented_routes() -> set[tuple[str, str]]:
    """``(METHOD, path template)`` of every documented operation."""
    methods = {"get", "put", "post", "delete", "patch"}
    return {(m.upper(), path) for path, item in _PATHS.items() for m in item if m in methods}
