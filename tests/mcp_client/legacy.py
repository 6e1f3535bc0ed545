"""Handshake era: the SDK's `legacy` mode (the initialize handshake), offering a given
handshake version. The SDK always offers its newest handshake version
(`mcp.client.session.LATEST_HANDSHAKE_VERSION`, read at call time), so offering an older one
means pointing that constant at it, as an older client would have it.
Usage: python legacy.py <url> <2025-11-25|2025-06-18>"""

import sys

import mcp.client.session as client_session

from scenario import check, run_checked

if __name__ == "__main__":
    url, version = sys.argv[1], sys.argv[2]
    client_session.LATEST_HANDSHAKE_VERSION = version
    summary = run_checked(url, "legacy")
    check(summary["era"] == version, "the server answered the offered version", summary)
    check(summary["handshake"] == "initialize", "initialize handshake", summary)
    check(summary["session_issued"], "an Mcp-Session-Id was issued", summary)
    check(summary["delete_status"] == 204, "closing the client ended the session", summary)
