"""What the SDK raises when the endpoint refuses a connection at the HTTP layer: connects with
no token and with a token that is not accepted, in `auto` and `legacy` modes, and prints what
each raised (its type, and for an MCPError its code, message and data), so the Rust test can
check that our message reaches the user instead of "Server returned an error response".
Usage: python refusals.py <url>"""

import asyncio
import json
import sys
from typing import Any

from mcp.client import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client
from mcp.shared.exceptions import MCPError


def innermost(error: BaseException) -> BaseException:
    """The MCPError inside anyio's exception groups, if any (else the error itself)."""
    if isinstance(error, MCPError):
        return error
    for inner in getattr(error, "exceptions", ()):
        found = innermost(inner)
        if isinstance(found, MCPError):
            return found
    return error


async def attempt(url: str, token: str | None, mode: str) -> dict[str, Any]:
    headers = {"Authorization": f"Bearer {token}"} if token is not None else {}
    http = create_mcp_http_client(headers=headers)
    try:
        async with Client(streamable_http_client(url, http_client=http), mode=mode) as client:
            await client.list_tools()
    except BaseException as raised:  # noqa: BLE001 - reporting whatever the SDK raised
        error = innermost(raised)
        report: dict[str, Any] = {"type": type(error).__name__, "str": str(error)}
        if isinstance(error, MCPError):
            report.update(code=error.code, message=error.message, data=error.data)
        return report
    return {"type": None}


async def main(url: str) -> dict[str, Any]:
    results = {}
    for name, token in [("missing", None), ("wrong", "nonsense")]:
        for mode in ["auto", "legacy"]:
            results[f"{name}/{mode}"] = await attempt(url, token, mode)
            print(json.dumps({name: mode, **results[f"{name}/{mode}"]}), flush=True)
    return results


if __name__ == "__main__":
    print(json.dumps(asyncio.run(main(sys.argv[1]))), flush=True)
