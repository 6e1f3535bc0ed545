"""A real MCP server for agentd's remote-connection tests: the official Python SDK's MCPServer
over streamable HTTP, served by uvicorn (over TLS when a certificate is given), with two tools
(echo, add). Around it: /redirect answers 302 to the cloud metadata address, and /keyed/mcp
is the same server behind an X-Api-Key check (401 with a challenge otherwise).

Usage: netns_tools.py ADDRESS PORT [CERT KEY]
"""
import sys, uvicorn
from mcp.server.mcpserver import MCPServer
from mcp.server.transport_security import TransportSecuritySettings
address, port = sys.argv[1], int(sys.argv[2])
cert = sys.argv[3] if len(sys.argv) > 3 else None
key = sys.argv[4] if len(sys.argv) > 4 else None
server = MCPServer("netns-tools")
@server.tool()
def echo(text: str) -> str:
    """Echo the text back."""
    return "echo: " + text
@server.tool()
def add(a: int, b: int) -> int:
    """Add two numbers."""
    return a + b
inner = server.streamable_http_app(
    transport_security=TransportSecuritySettings(enable_dns_rebinding_protection=False))
async def app(scope, receive, send):
    if scope["type"] == "http" and scope["path"] == "/redirect":
        await send({"type": "http.response.start", "status": 302, "headers": [(b"location", b"http://169.254.169.254/latest/meta-data/"), (b"content-length", b"0")]})
        await send({"type": "http.response.body", "body": b""})
        return
    if scope["type"] == "http" and scope["path"] == "/keyed/mcp":
        headers = dict(scope["headers"])
        if headers.get(b"x-api-key") != b"k-42-7f3c9a1e55d0":
            await send({"type": "http.response.start", "status": 401, "headers": [(b"www-authenticate", b'Bearer realm="keyed"'), (b"content-length", b"0")]})
            await send({"type": "http.response.body", "body": b""})
            return
        scope = dict(scope, path="/mcp", raw_path=b"/mcp")
    await inner(scope, receive, send)
uvicorn.run(app, host=address, port=port, ssl_certfile=cert, ssl_keyfile=key, log_level="warning")
