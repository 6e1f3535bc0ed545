"""agentd's file tools through the official Python SDK (mcp==2.3.0) against a real agentd and
workspaced: edit_file, move_file, delete_file, read_file ranges, read_files, list_files bounds,
get_file_info, annotations, get_api_spec and call_tool; for each change success, conflict
(stale revision), replay, reuse of a request id with another payload, forbidden (a read token,
a non-author), protected files and path traversal (`../`, absolute, a symlink out).

Driven by tests/suite/mcp_tools.rs, which lays out the workflow's files first (see there) and
checks the disk afterwards. Usage: python tools.py <url>; tokens and the workflow id come in
AW_WRITE_TOKEN, AW_READ_TOKEN, AW_RUNNER_TOKEN and AW_WORKFLOW. Prints one JSON object per
line; the last is the summary. Any failed check raises, so the process exits non-zero.
"""

import asyncio
import os
import sys
import uuid
from typing import Any

from mcp.shared.exceptions import MCPError

from scenario import Wire, check, connect, say, structured

WRITE_TOKEN = os.environ["AW_WRITE_TOKEN"]
READ_TOKEN = os.environ["AW_READ_TOKEN"]
RUNNER_TOKEN = os.environ["AW_RUNNER_TOKEN"]
WORKFLOW = os.environ["AW_WORKFLOW"]

NEW_TOOLS = ["edit_file", "move_file", "delete_file", "apply_patch", "read_files", "get_file_info"]
CHANGES = ["write_file", "edit_file", "move_file", "delete_file", "apply_patch"]


def rid() -> str:
    return str(uuid.uuid4())


async def ok(client: Any, tool: str, args: dict[str, Any]) -> dict[str, Any]:
    result = await client.call_tool(tool, {"workflow_id": WORKFLOW, **args})
    check(not result.is_error, f"{tool} succeeds", structured(result))
    return structured(result)


async def fails(client: Any, tool: str, args: dict[str, Any], code: str) -> dict[str, Any]:
    result = await client.call_tool(tool, {"workflow_id": WORKFLOW, **args})
    check(result.is_error, f"{tool} fails with {code}", structured(result))
    error = structured(result)["error"]
    check(error["code"] == code, f"{tool} error code is {code}", error)
    return error


async def revision_of(client: Any, path: str) -> str:
    return (await ok(client, "get_file_info", {"path": path}))["revision"]


async def catalog(client: Any) -> None:
    tools = {t.name: t for t in (await client.list_tools()).tools}
    for name in NEW_TOOLS + ["list_files", "read_file", "write_file"]:
        check(name in tools, "tool listed", name)
    for name, tool in tools.items():
        hints = tool.annotations
        check(hints is not None, "annotations on every tool", name)
        for hint in ["read_only_hint", "destructive_hint", "idempotent_hint", "open_world_hint"]:
            check(isinstance(getattr(hints, hint), bool), f"{name} has {hint}", hints)
        check(hints.open_world_hint is False, "closed world", name)
        if name in CHANGES:
            check(hints.read_only_hint is False and hints.destructive_hint is True, "a change", name)
            check(hints.idempotent_hint is True, "idempotent by request id", name)
        elif name not in ("call_tool",):
            check(hints.read_only_hint is True and hints.destructive_hint is False, "a read", name)
    edit = tools["edit_file"].input_schema
    check(set(edit["required"]) == {"workflow_id", "path", "edits", "expected_revision", "request_id"},
          "edit_file schema", edit)
    check(edit["properties"]["edits"]["items"]["properties"]["replace_all"]["type"] == "boolean",
          "edit items schema", edit)
    spec = structured(await client.call_tool("get_api_spec", {}))
    by_name = {op["name"]: op for op in spec["operations"]}
    for name in NEW_TOOLS:
        check(name in by_name, "in get_api_spec", name)
        check(by_name[name]["input_schema"] == tools[name].input_schema, "same schema in the spec", name)
        check("readOnlyHint" in by_name[name]["annotations"], "annotations in the spec", name)
    say(step="catalog", tools=sorted(tools))


async def reads(client: Any) -> None:
    ranged = await ok(client, "read_file", {"path": "notes.md", "offset": 1, "limit": 1})
    check(ranged["content"] == "two\n" and ranged["total_lines"] == 3, "a range of lines", ranged)
    whole = await ok(client, "read_file", {"path": "notes.md"})
    check(whole["revision"] == ranged["revision"] and whole["total_lines"] == 3, "the whole revision", whole)
    past = await ok(client, "read_file", {"path": "notes.md", "offset": 10})
    check(past["content"] == "", "an offset past the end reads nothing", past)

    many = await ok(client, "read_files", {"paths": ["notes.md", "absent.md", "../outside/secret.txt",
                                                     "/etc/passwd", "link/secret.txt", "linkfile.md",
                                                     "workflow.json"]})
    files = many["files"]
    check([f["path"] for f in files][0] == "notes.md" and files[0]["content"] == "one\ntwo\nthree\n",
          "read_files reads the good path", files[0])
    check(files[0]["revision"] == whole["revision"] and files[0]["total_lines"] == 3, "with its revision", files[0])
    codes = [f.get("error", {}).get("code") for f in files]
    check(codes == [None, "not_found", "path_refused", "path_refused", "path_refused", "path_refused", None],
          "each failed path has its own error", files)
    check(many["read"] == 2 and many["failed"] == 5, "counts", many)
    check(all("outside" not in f.get("content", "") for f in files), "nothing from outside", files)

    info = await ok(client, "get_file_info", {"path": "notes.md"})
    check(info["kind"] == "file" and info["size"] == 14 and info["revision"] == whole["revision"], "file info", info)
    check(isinstance(info["modified_ms"], int) and info["modified_ms"] > 1_600_000_000_000, "mtime", info)
    folder = await ok(client, "get_file_info", {"path": "src"})
    check(folder["kind"] == "dir" and "revision" not in folder, "folder info", folder)
    for path in ["linkfile.md", "link", "../outside/secret.txt", "/etc/passwd"]:
        await fails(client, "get_file_info", {"path": path}, "path_refused")

    top = await ok(client, "list_files", {"depth": 1})
    paths = [e["path"] for e in top["entries"]]
    check("src" in paths and "src/a.rs" not in paths, "depth 1 lists the top level only", paths)
    kinds = {e["path"]: e for e in top["entries"]}
    check(kinds["src"]["kind"] == "dir" and kinds["notes.md"]["kind"] == "file"
          and kinds["notes.md"]["size"] == 14, "kinds and sizes", kinds)
    pruned = await ok(client, "list_files", {"exclude": ["node_modules", "*.log", "src/gen"]})
    paths = [e["path"] for e in pruned["entries"]]
    check("src/a.rs" in paths and not any(p.startswith("node_modules") or p.endswith(".log") or
                                          p.startswith("src/gen") for p in paths), "exclude", paths)
    bounded = await ok(client, "list_files", {"max_entries": 2})
    check(len(bounded["entries"]) == 2 and bounded["truncated"] is True, "max_entries bounds", bounded)
    bad = await client.call_tool("list_files", {"workflow_id": WORKFLOW, "depth": "2"})
    check(bad.is_error and structured(bad)["error"]["field"] == "depth", "a wrong type is refused", structured(bad))
    say(step="reads", codes=codes)


async def edits(client: Any) -> dict[str, Any]:
    before = await revision_of(client, "notes.md")
    change = [{"old_text": "two\n", "new_text": "TWO\n"}]
    request_id = rid()
    args = {"path": "notes.md", "edits": change, "expected_revision": before, "request_id": request_id}
    preview = await ok(client, "edit_file", {**args, "dry_run": True})
    check(preview["dry_run"] is True and "-two" in preview["diff"] and "+TWO" in preview["diff"],
          "a dry run answers the diff", preview)
    check(preview["previous_revision"] == before and preview["revision"] != before, "and the revision", preview)
    check(await revision_of(client, "notes.md") == before, "a dry run writes nothing", preview)

    applied = await ok(client, "edit_file", args)
    check(applied["dry_run"] is False and applied["state"] == "applied" and not applied["replayed"], "applied", applied)
    check(applied["revision"] == preview["revision"] and applied["diff"] == preview["diff"],
          "the dry run predicted the edit", applied)
    check(applied["diff"].startswith("--- a/notes.md\n+++ b/notes.md\n"), "a unified diff", applied["diff"])
    replay = await ok(client, "edit_file", args)
    check(replay["replayed"] is True and replay["receipt_id"] == applied["receipt_id"]
          and replay["revision"] == applied["revision"] and replay["diff"] == applied["diff"],
          "a replay answers the recorded outcome", replay)
    await fails(client, "edit_file", {**args, "edits": [{"old_text": "one", "new_text": "1"}]}, "request_id_reused")
    stale = await fails(client, "edit_file", {**args, "request_id": rid()}, "revision_conflict")
    check(stale["current_revision"] == applied["revision"], "a conflict names the current revision", stale)

    dup = await revision_of(client, "dup.md")
    ambiguous = await fails(client, "edit_file", {"path": "dup.md", "edits": [{"old_text": "x", "new_text": "y"}],
                                                  "expected_revision": dup, "request_id": rid()}, "edit_not_unique")
    check(ambiguous["edit_index"] == 0 and ambiguous["matches"] == 2, "names the edit and the count", ambiguous)
    check("edit 0" in ambiguous["message"] and "2 times" in ambiguous["message"], "says so", ambiguous)
    missing = await fails(client, "edit_file", {"path": "dup.md", "expected_revision": dup, "request_id": rid(),
                                                "edits": [{"old_text": "x x", "new_text": "y"},
                                                          {"old_text": "zzz", "new_text": "q"}]}, "edit_no_match")
    check(missing["edit_index"] == 1 and missing["matches"] == 0, "names the second edit", missing)
    everywhere = await ok(client, "edit_file", {"path": "dup.md", "expected_revision": dup, "request_id": rid(),
                                                "edits": [{"old_text": "x", "new_text": "y", "replace_all": True}]})
    check(everywhere["state"] == "applied", "replace_all", everywhere)

    via = await client.call_tool("call_tool", {"name": "edit_file", "arguments": {
        "workflow_id": WORKFLOW, "path": "notes.md", "edits": [{"old_text": "one", "new_text": "ONE"}],
        "expected_revision": applied["revision"], "request_id": rid(), "dry_run": True}})
    check(not via.is_error and structured(via)["dry_run"] is True, "call_tool reaches edit_file", structured(via))
    say(step="edits", revision=applied["revision"])
    return applied


async def moves_and_deletes(client: Any) -> None:
    old = await revision_of(client, "old.md")
    args = {"path": "old.md", "to_path": "moved/new.md", "expected_revision": old, "request_id": rid()}
    moved = await ok(client, "move_file", args)
    check(moved["state"] == "applied" and moved["to_path"] == "moved/new.md" and moved["revision"] == old, "moved", moved)
    replay = await ok(client, "move_file", args)
    check(replay["replayed"] is True and replay["receipt_id"] == moved["receipt_id"], "move replay", replay)
    await fails(client, "move_file", {**args, "to_path": "elsewhere.md"}, "request_id_reused")
    await fails(client, "move_file", {**args, "path": "moved/new.md", "to_path": "back.md",
                                      "expected_revision": "sha256:" + "0" * 64, "request_id": rid()},
                "revision_conflict")
    via = await client.call_tool("call_tool", {"name": "get_file_info",
                                               "arguments": {"workflow_id": WORKFLOW, "path": "moved/new.md"}})
    check(not via.is_error and structured(via)["revision"] == old, "call_tool reaches get_file_info", structured(via))

    gone = await revision_of(client, "gone.md")
    args = {"path": "gone.md", "expected_revision": gone, "request_id": rid()}
    stale = await fails(client, "delete_file", {**args, "expected_revision": "sha256:" + "1" * 64,
                                                "request_id": rid()}, "revision_conflict")
    check(stale["current_revision"] == gone, "delete conflict names the revision", stale)
    deleted = await ok(client, "delete_file", args)
    check(deleted["state"] == "applied" and deleted["revision"] == "missing"
          and deleted["previous_revision"] == gone, "deleted", deleted)
    replay = await ok(client, "delete_file", args)
    check(replay["replayed"] is True and replay["receipt_id"] == deleted["receipt_id"], "delete replay", replay)
    await fails(client, "delete_file", {**args, "path": "notes.md"}, "request_id_reused")
    receipt = await ok(client, "get_write_receipt", {"request_id": args["request_id"]})
    check(receipt["receipt"]["operation"] == "delete" and receipt["receipt"]["state"] == "applied", "receipt", receipt)
    say(step="moves and deletes")


async def patches(client: Any) -> None:
    p1 = await revision_of(client, "p1.md")
    diff = ("--- a/p1.md\n+++ b/p1.md\n@@ -1,2 +1,2 @@\n alpha\n-beta\n+BETA\n"
            "--- /dev/null\n+++ b/patched/new.md\n@@ -0,0 +1 @@\n+new\n"
            "--- a/p2.md\n+++ /dev/null\n@@ -1 +0,0 @@\n-drop\n")
    args = {"diff": diff, "request_id": rid(), "expected_revisions": {"p1.md": p1}}
    applied = await ok(client, "apply_patch", args)
    check(applied["state"] == "applied" and not applied["replayed"], "a patch set applies", applied)
    check([(f["path"], f["action"], f["state"]) for f in applied["files"]] ==
          [("p1.md", "modified", "applied"), ("patched/new.md", "created", "applied"), ("p2.md", "deleted", "applied")],
          "one receipt per file", applied["files"])
    check(len({f["receipt"]["receipt_id"] for f in applied["files"]}) == 3, "three receipts", applied["files"])
    replay = await ok(client, "apply_patch", args)
    check(replay["replayed"] is True and replay["files"] == applied["files"], "a replay answers the recording", replay)
    await fails(client, "apply_patch", {**args, "diff": diff.replace("+BETA", "+OTHER")}, "request_id_reused")
    stale = await fails(client, "apply_patch", {**args, "request_id": rid()}, "revision_conflict")
    check(stale["path"] == "p1.md" and stale["file_index"] == 0, "a conflict names the file", stale)
    receipt = await ok(client, "get_write_receipt", {"request_id": args["request_id"]})
    check(receipt["receipt"]["state"] == "applied" and [r["path"] for r in receipt["files"]] ==
          ["p1.md", "patched/new.md", "p2.md"], "the receipt lists every file", receipt)

    # All or nothing: a hunk that does not apply in the second file leaves the first uncreated.
    bad = ("--- /dev/null\n+++ b/never.md\n@@ -0,0 +1 @@\n+never\n"
           "--- a/notes.md\n+++ b/notes.md\n@@ -1 +1 @@\n-not there\n+x\n")
    notes = await revision_of(client, "notes.md")
    result = await client.call_tool("apply_patch", {"workflow_id": WORKFLOW, "diff": bad, "request_id": rid(),
                                                    "expected_revisions": {"notes.md": notes}})
    error = structured(result).get("error", {})
    check(result.is_error and error.get("path") == "notes.md" and error.get("file_index") == 1,
          "the failing file is named", error)
    await fails(client, "get_file_info", {"path": "never.md"}, "not_found")
    protected = await revision_of(client, "workflow.json")
    error = await fails(client, "apply_patch", {
        "diff": "--- a/workflow.json\n+++ b/workflow.json\n@@ -1 +1 @@\n-{}\n\\ No newline at end of file\n+[]\n",
        "expected_revisions": {"workflow.json": protected}, "request_id": rid()}, "forbidden")
    check(error["reason"] == "protected" and error["path"] == "workflow.json", "a protected file in a patch", error)
    for target in ["../escape.md", "link/escape.md", "/tmp/escape.md"]:
        await fails(client, "apply_patch", {"diff": f"--- /dev/null\n+++ {target}\n@@ -0,0 +1 @@\n+x\n",
                                            "request_id": rid()}, "path_refused")
    say(step="patches")


async def refusals(client: Any, notes: str) -> None:
    protected = await revision_of(client, "workflow.json")
    for tool, args in [
        ("edit_file", {"path": "workflow.json", "edits": [{"old_text": "{}", "new_text": "{\"x\":1}"}],
                       "expected_revision": protected}),
        ("edit_file", {"path": "workflow.json", "edits": [{"old_text": "{}", "new_text": "[]"}],
                       "expected_revision": protected, "dry_run": True}),
        ("move_file", {"path": "workflow.json", "to_path": "w.json", "expected_revision": protected}),
        ("move_file", {"path": "notes.md", "to_path": "sub/product.json", "expected_revision": notes}),
        ("delete_file", {"path": "workflow.json", "expected_revision": protected}),
    ]:
        error = await fails(client, tool, {**args, "request_id": rid()}, "forbidden")
        check(error["reason"] == "protected", "a protected file", (tool, error))

    outside = "sha256:" + "2" * 64
    for tool, args in [
        ("edit_file", {"path": "../outside/secret.txt", "edits": [{"old_text": "outside", "new_text": "x"}],
                       "expected_revision": outside}),
        ("edit_file", {"path": "/etc/hostname", "edits": [{"old_text": "a", "new_text": "b"}],
                       "expected_revision": outside}),
        ("edit_file", {"path": "link/secret.txt", "edits": [{"old_text": "outside", "new_text": "x"}],
                       "expected_revision": outside}),
        ("edit_file", {"path": "linkfile.md", "edits": [{"old_text": "outside", "new_text": "x"}],
                       "expected_revision": outside}),
        ("move_file", {"path": "notes.md", "to_path": "../escape.md", "expected_revision": notes}),
        ("move_file", {"path": "notes.md", "to_path": "link/escape.md", "expected_revision": notes}),
        ("move_file", {"path": "link/secret.txt", "to_path": "stolen.md", "expected_revision": outside}),
        ("delete_file", {"path": "link/secret.txt", "expected_revision": outside}),
        ("delete_file", {"path": "/etc/hostname", "expected_revision": outside}),
        ("delete_file", {"path": "linkfile.md", "expected_revision": outside}),
    ]:
        await fails(client, tool, {**args, "request_id": rid()}, "path_refused")
    say(step="protected and traversal")


async def unknown_tool(client: Any) -> None:
    refused = None
    try:
        await client.call_tool("format_disk", {})
    except MCPError as e:
        refused = e
    check(refused is not None and refused.code == -32602, "an unknown tool is -32602", refused)
    via = await client.call_tool("call_tool", {"name": "format_disk"})
    check(via.is_error and structured(via)["error"]["code"] == "unknown_tool", "call_tool keeps a tool error",
          structured(via))
    say(step="unknown tool", code=refused.code)


async def forbidden(url: str, notes: str) -> None:
    change_args = {
        "edit_file": {"path": "notes.md", "edits": [{"old_text": "one", "new_text": "1"}], "expected_revision": notes},
        "move_file": {"path": "notes.md", "to_path": "n.md", "expected_revision": notes},
        "delete_file": {"path": "notes.md", "expected_revision": notes},
        "apply_patch": {"diff": "--- /dev/null\n+++ b/x.md\n@@ -0,0 +1 @@\n+x\n"},
    }
    # A read token: the changes are not listed, and calling one is an HTTP 403.
    wire = Wire()
    async with connect(url, READ_TOKEN, "auto", wire) as client:
        names = [t.name for t in (await client.list_tools()).tools]
        check(not any(n in names for n in change_args) and "read_files" in names, "read token catalog", names)
        await ok(client, "read_files", {"paths": ["notes.md"]})
        for tool, args in change_args.items():
            refused = None
            try:
                await client.call_tool(tool, {"workflow_id": WORKFLOW, **args, "request_id": rid()})
            except MCPError as e:
                refused = e
            check(refused is not None, "a read token cannot change", tool)
        check([x["status"] for x in wire.exchanges].count(403) == len(change_args), "each is a 403", wire.exchanges)
    # A write token of a runner (no author role): refused by the live role, as a tool error.
    async with connect(url, RUNNER_TOKEN, "auto", Wire()) as client:
        names = [t.name for t in (await client.list_tools()).tools]
        check(not any(n in names for n in change_args), "a runner's catalog has no changes", names)
        for tool, args in change_args.items():
            await fails(client, tool, {**args, "request_id": rid()}, "forbidden")
            via = await client.call_tool("call_tool", {"name": tool, "arguments": {
                "workflow_id": WORKFLOW, **args, "request_id": rid()}})
            check(via.is_error and structured(via)["error"]["code"] == "forbidden", "also through call_tool", tool)
    say(step="forbidden")


async def main(url: str) -> dict[str, Any]:
    async with connect(url, WRITE_TOKEN, "auto", Wire()) as client:
        await catalog(client)
        await reads(client)
        applied = await edits(client)
        await moves_and_deletes(client)
        await patches(client)
        await refusals(client, applied["revision"])
        await unknown_tool(client)
    await forbidden(url, applied["revision"])
    return {"ok": True, "notes_revision": applied["revision"]}


if __name__ == "__main__":
    say(**asyncio.run(main(sys.argv[1])))
