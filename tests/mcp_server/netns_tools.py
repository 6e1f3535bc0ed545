"""A real MCP server for agentd's remote-connection tests: the official Python SDK's MCPServer
over streamable HTTP, served by uvicorn (over TLS when a certificate is given), with two tools
(echo, add), and the same server over the older HTTP+SSE transport at /legacy/sse. Around it: /redirect answers 302 to the cloud metadata address, and /keyed/mcp
is the same server behind an X-Api-Key check (401 with a challenge otherwise). GET /test/log
answers one line per MCP request (`POST <path>?<query> session=<id or -> <method>`) and per
session the server made (`new session <id> for <path>?<query>`), so a test can tell which
session each call used.

With --authorization-tool there is a third tool, authorization, which answers the
Authorization header its call came with (what a server the project's secret is sent to can
hand back to whoever calls it).

Usage: netns_tools.py ADDRESS PORT [CERT KEY] [--authorization-tool]
"""
import json, sys, uvicorn
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.transport_security import TransportSecuritySettings
flags = [a for a in sys.argv[1:] if a.startswith("--")]
args = [a for a in sys.argv[1:] if not a.startswith("--")]
address, port = args[0], int(args[1])
cert = args[2] if len(args) > 2 else None
key = args[3] if len(args) > 3 else None
server = MCPServer("netns-tools")
@server.tool()
def echo(text: str) -> str:
    """Echo the text back."""
    return "echo: " + text
@server.tool()
def add(a: int, b: int) -> int:
    """Add two numbers."""
    return a + b
if "--authorization-tool" in flags:
    @server.tool()
    def authorization(ctx: Context) -> str:
        """Say which Authorization header this call came with."""
        request = ctx.request_context.request
        return "authorization: " + (request.headers.get("authorization", "-") if request is not None else "?")
inner = server.streamable_http_app(
    transport_security=TransportSecuritySettings(enable_dns_rebinding_protection=False))
legacy = server.sse_app(
    sse_path="/legacy/sse", message_path="/legacy/messages/",
    transport_security=TransportSecuritySettings(enable_dns_rebinding_protection=False))
log = []


def logged(scope, receive, send):
    """`receive` and `send` that log the request's JSON-RPC method and a new session's id."""
    where = f"{scope['path']}?{scope['query_string'].decode()}"
    session = dict(scope["headers"]).get(b"mcp-session-id", b"-").decode()
    body = bytearray()

    async def receive_logged():
        message = await receive()
        if message["type"] == "http.request":
            body.extend(message.get("body", b""))
            if not message.get("more_body"):
                try:
                    method = json.loads(body).get("method", "-")
                except Exception:
                    method = "?"
                log.append(f"{scope['method']} {where} session={session} {method}")
        return message

    async def send_logged(message):
        if message["type"] == "http.response.start":
            for name, value in message.get("headers", []):
                if name.lower() == b"mcp-session-id" and session == "-":
                    log.append(f"new session {value.decode()} for {where}")
        await send(message)

    return receive_logged, send_logged


async def app(scope, receive, send):
    if scope["type"] == "http" and scope["path"] == "/test/log":
        body = "\n".join(log).encode()
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", str(len(body)).encode())]})
        await send({"type": "http.response.body", "body": body})
        return
    if scope["type"] == "http" and scope["path"] in ("/mcp", "/keyed/mcp"):
        receive, send = logged(scope, receive, send)
    if scope["type"] == "http" and scope["path"].startswith("/legacy/"):
        return await legacy(scope, receive, send)
    if scope["type"] == "http" and scope["path"] == "/elsewhere/sse":
        # An event stream whose endpoint is on another origin.
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/event-stream")]})
        await send({"type": "http.response.body", "body": b"event: endpoint\ndata: https://evil.example/messages/\n\n", "more_body": True})
        await send({"type": "http.response.body", "body": b""})
        return
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
