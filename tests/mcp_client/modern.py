"""Modern era: the SDK's default `auto` mode probes `server/discover` at 2026-07-28 and must
adopt it (no initialize, no session). Usage: python modern.py <url>"""

import sys

from scenario import check, run_checked

if __name__ == "__main__":
    summary = run_checked(sys.argv[1], "auto")
    check(summary["era"] == "2026-07-28", "auto mode negotiated the modern era", summary)
    check(summary["handshake"] == "server/discover", "no initialize handshake", summary)
    check(not summary["session_issued"], "no Mcp-Session-Id in the stateless era", summary)
