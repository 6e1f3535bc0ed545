"""The end-to-end scenario every era runs against the agentworks MCP endpoint.

Driven by src/mcp/tests.rs with the official Python SDK (mcp==2.3.0) as an independent client.
Usage (from the era scripts): `run(url, mode)`. Prints one JSON object per line; the last line
is the summary the Rust test asserts on. Any failed check raises, so the process exits non-zero.
"""

import asyncio
import json
import os
import sys
import uuid
from typing import Any

import httpx2
from mcp.client import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client
from mcp.shared.exceptions import MCPError


# The fake backend of src/mcp/tests.rs accepts the literal tokens "write" and "read" and serves
# workflow "wf1"; the end-to-end test against a real agentd passes real ones in the environment.
WRITE_TOKEN = os.environ.get("AW_WRITE_TOKEN", "write")
READ_TOKEN = os.environ.get("AW_READ_TOKEN", "read")
WORKFLOW = os.environ.get("AW_WORKFLOW", "wf1")


def say(**fields: Any) -> None:
    print(json.dumps(fields), flush=True)


def check(condition: bool, what: str, detail: Any = None) -> None:
    if not condition:
        raise AssertionError(f"{what}: {detail!r}")


class Wire:
    """Records what went over HTTP, to check the era's transport rules from the outside."""

    def __init__(self) -> None:
        self.exchanges: list[dict[str, Any]] = []

    async def on_response(self, response: httpx2.Response) -> None:
        request = response.request
        self.exchanges.append(
            {
                "method": request.method,
                "status": response.status_code,
                "rpc": request.headers.get("mcp-method"),
                "version_header": request.headers.get("mcp-protocol-version"),
                "sent_session": request.headers.get("mcp-session-id"),
                "got_session": response.headers.get("mcp-session-id"),
            }
        )


def connect(url: str, token: str, mode: str, wire: Wire) -> Client:
    http = create_mcp_http_client(headers={"Authorization": f"Bearer {token}"})
    http.event_hooks = {"request": [], "response": [wire.on_response]}
    return Client(streamable_http_client(url, http_client=http), mode=mode)


def structured(result: Any) -> Any:
    return result.structured_content


async def scenario(url: str, mode: str) -> dict[str, Any]:
    wire = Wire()
    summary: dict[str, Any] = {"mode": mode}
    async with connect(url, WRITE_TOKEN, mode, wire) as client:
        era = client.protocol_version
        session = client.session
        summary["era"] = era
        summary["handshake"] = "initialize" if session.initialize_result is not None else "server/discover"
        say(step="connected", era=era, handshake=summary["handshake"])

        tools = await client.list_tools()
        names = [t.name for t in tools.tools]
        say(step="tools/list", names=names)
        for name in ["get_api_spec", "call_tool", "list_workflows", "read_file", "write_file", "get_write_receipt"]:
            check(name in names, "tool listed", name)
        write_tool = next(t for t in tools.tools if t.name == "write_file")
        check(write_tool.annotations is not None and write_tool.annotations.destructive_hint is True,
              "write_file is destructive", write_tool.annotations)
        check(set(write_tool.input_schema["required"]) ==
              {"workflow_id", "path", "content", "expected_revision", "request_id"},
              "write_file schema", write_tool.input_schema)

        read = await client.call_tool("read_file", {"workflow_id": WORKFLOW, "path": "notes.md"})
        check(not read.is_error, "read_file ok", read)
        first = structured(read)
        check(first["content"] == "hello\n", "read content", first)
        check(first["revision"].startswith("sha256:"), "revision shape", first)
        check(read.content and read.content[0].type == "text", "text rendering", read.content)
        say(step="read_file", revision=first["revision"])

        request_id = str(uuid.uuid4())
        write_args = {"workflow_id": WORKFLOW, "path": "notes.md", "content": "hello, world\n",
                      "expected_revision": first["revision"], "request_id": request_id}
        written = await client.call_tool("write_file", write_args)
        check(not written.is_error, "write_file ok", written)
        new_revision = structured(written)["revision"]
        check(new_revision != first["revision"], "revision changed", structured(written))
        say(step="write_file", revision=new_revision)

        retried = await client.call_tool("write_file", write_args)
        # The recorded outcome again; a server may flag that it is a replay.
        def outcome(result: Any) -> dict[str, Any]:
            return {k: v for k, v in structured(result).items() if k != "replayed"}
        check(not retried.is_error and outcome(retried) == outcome(written),
              "retry with the same request_id returns the same outcome", structured(retried))
        check(structured(retried).get("replayed", True) is True, "a retry is never a second write",
              structured(retried))
        say(step="write_file retry", same_outcome=True)

        conflict = await client.call_tool("write_file", {**write_args, "request_id": str(uuid.uuid4()),
                                                         "content": "stale\n"})
        check(conflict.is_error, "conflict is a tool error", conflict)
        error = structured(conflict)["error"]
        check(error["code"] == "revision_conflict", "conflict code", error)
        check(error["current_revision"] == new_revision, "conflict names the current revision", error)
        say(step="write_file conflict", code=error["code"])

        created = await client.call_tool("write_file", {"workflow_id": WORKFLOW, "path": "new.md", "content": "new\n",
                                                        "expected_revision": "missing",
                                                        "request_id": str(uuid.uuid4())})
        check(not created.is_error, "create with missing", created)
        again = await client.call_tool("write_file", {"workflow_id": WORKFLOW, "path": "new.md", "content": "other\n",
                                                      "expected_revision": "missing",
                                                      "request_id": str(uuid.uuid4())})
        check(again.is_error and structured(again)["error"]["code"] == "revision_conflict",
              "creating an existing file conflicts", structured(again))
        say(step="write_file create", revision=structured(created)["revision"])

        spec = await client.call_tool("get_api_spec", {})
        check(not spec.is_error, "get_api_spec ok", spec)
        operations = [op["name"] for op in structured(spec)["operations"]]
        check("write_file" in operations and "read_file" in operations, "spec lists operations", operations)
        say(step="get_api_spec", operations=operations)

        via = await client.call_tool("call_tool", {"name": "read_file",
                                                   "arguments": {"workflow_id": WORKFLOW, "path": "notes.md"}})
        check(not via.is_error and structured(via)["content"] == "hello, world\n", "call_tool read_file",
              structured(via))
        say(step="call_tool", content=structured(via)["content"])

        bad = await client.call_tool("read_file", {"workflow_id": WORKFLOW, "path": "notes.md", "mode": "x"})
        check(bad.is_error and structured(bad)["error"]["code"] == "invalid_arguments", "unknown argument",
              structured(bad))
        unknown = await client.call_tool("call_tool", {"name": "format_disk"})
        check(unknown.is_error and structured(unknown)["error"]["code"] == "unknown_tool", "unknown tool",
              structured(unknown))
        say(step="tool errors", codes=["invalid_arguments", "unknown_tool"])

    # A read token sees no write tools, and calling one is refused at the HTTP layer (403).
    read_wire = Wire()
    async with connect(url, READ_TOKEN, mode, read_wire) as client:
        names = [t.name for t in (await client.list_tools()).tools]
        check("write_file" not in names and "read_file" in names, "read token catalog", names)
        refused = None
        try:
            await client.call_tool("write_file", write_args)
        except MCPError as e:
            refused = e
        check(refused is not None, "write with a read token is refused")
        statuses = [x["status"] for x in read_wire.exchanges if x["rpc"] in (None, "tools/call")]
        check(403 in statuses, "the refusal is HTTP 403", read_wire.exchanges)
        say(step="read token", tools=names, write_refused=True)

    sessions = {x["got_session"] for x in wire.exchanges if x["got_session"]}
    summary["session_issued"] = bool(sessions)
    summary["methods"] = sorted({x["method"] for x in wire.exchanges})
    summary["statuses"] = sorted({x["status"] for x in wire.exchanges})
    deletes = [x for x in wire.exchanges if x["method"] == "DELETE"]
    summary["delete_status"] = deletes[0]["status"] if deletes else None
    summary["ok"] = True
    return summary


def run_checked(url: str, mode: str) -> dict[str, Any]:
    """Runs the scenario and prints its summary as the last line."""
    summary = asyncio.run(scenario(url, mode))
    say(**summary)
    return summary


if __name__ == "__main__":
    run_checked(sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else "auto")
