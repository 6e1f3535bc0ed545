"""The official Python SDK (mcp==2.3.0) as an OAuth 2.1 client of agentd's authorization server
(issue 13, /work/notes/oauth-spec.md): discovery, dynamic registration, the authorization code
grant with PKCE, tools with the token, and a forced refresh. A Rust test drives it and does
the consent step in a browser (Playwright); this script never signs in or consents itself.

Usage:
    python oauth_sdk_client.py [options] <mcp_url>
      --write LABEL WORKFLOW PATH  write_file(PATH) in WORKFLOW (create: expected_revision
                                   "missing"); repeatable, e.g. `--write inside wf_1 a/x.md
                                   --write outside wf_1 b/y.md`
      --callback stdin|http|fetch  how the authorization response comes back (default stdin)
      --port N                     the loopback port of the redirect URI (default: a free one)
      --token-auth none|client_secret_basic|client_secret_post   what to register (default none)
      --client-name NAME           the client_name to register (default "agentworks SDK test")
      --pause                      after the refresh print PAUSE, wait for a line on stdin (the
                                   driver revokes the app meanwhile), then report the status /mcp
                                   answers the stored access token (`after-pause`)

Protocol (stdout is line-based; stdin is read only in --callback stdin):
  - Every step prints one JSON object on its own line: {"step": "...", ...}.
  - When the SDK wants the person to authorize it prints, after an `authorize` step line that
    describes the request (client_id, redirect_uri, scope, resource, PKCE method, prompt):
        AUTHORIZE <authorization URL>
    The driver opens that URL in the browser, signs in and consents, and captures the URL the
    browser is finally sent to, `http://127.0.0.1:PORT/callback?code=…&state=…&iss=…` (or
    `?error=access_denied&…`). With --callback stdin the driver writes that URL as one line on
    stdin. With --callback http the script takes it from the browser's request to its loopback
    listener (which answers every GET /callback with a plain page in both modes, so the
    browser's last navigation loads). With --callback fetch the script GETs the authorization
    URL itself and takes the redirect's Location: only for servers that answer at once (the
    conformance suite's fake authorization server), to test this script.
    AUTHORIZE can come again: after a failed refresh (full re-authorization) or on a 403
    insufficient_scope (the SDK's step-up); answer each the same way.
  - Steps, in order: `callback` (per authorization: where it came from, code present, state,
    iss), `registered` (client_id, auth method, secret issued?), `connected` (era),
    `discovery` (every authorization-related HTTP exchange so far: method, path, status, and
    for token requests the grant, resource and client authentication), `tools/list` (names),
    one `write_file` per --write (label, ok, revision or the tool error / HTTP refusal),
    `refresh` (after expiring the stored access token: the refresh_token grant's status,
    whether the access and refresh tokens changed, then tools/list works), and last the
    summary {"step": "done", "ok": true, ...}.
  - If the flow breaks (a denied consent, a refused token request, a mismatched iss...), the
    last line is {"step": "done", "ok": false, "failed_at": ..., "error": ...} and the exit
    status is 1. Tool outcomes (a refused write) are reported, not judged: the Rust test
    asserts them.
Tokens are never printed; only their presence, length and a 4-character prefix.

What the SDK does against the server (mcp/client/auth/oauth2.py and utils.py, 2.3.0), so the
driver knows what to expect:
  - On a 401 (or a 403 with error="insufficient_scope"): PRM from the challenge's
    resource_metadata, else /.well-known/oauth-protected-resource/mcp, else the root one; the
    PRM resource must share scheme, host and port with <mcp_url> (so give the URL with the
    issuer's spelling: 127.0.0.1, not localhost). Then /.well-known/oauth-authorization-server,
    whose issuer must equal authorization_servers[0] exactly.
  - Scope: the challenge's scope, else PRM then AS scopes_supported; offline_access only if the
    AS lists it. DCR (JSON POST to registration_endpoint; CIMD is not used: it needs an https
    client_metadata_url) with redirect_uris, token_endpoint_auth_method, grant_types,
    response_types, application_type "native", scope and client_name; the auth method used at
    the token endpoint is the one the registration response echoes.
  - Authorization: response_type=code, client_id, redirect_uri, state, code_challenge (S256),
    resource (the PRM resource), scope. The callback's state must match and its iss equal the
    metadata issuer (required when authorization_response_iss_parameter_supported is true).
  - Token and refresh requests are forms with client_id and resource; a refresh answered with
    anything but 200 drops the tokens and the next request re-authorizes (AUTHORIZE again).
"""

import argparse
import asyncio
import json
import socket
import sys
import time
import uuid
from typing import Any
from urllib.parse import parse_qs, urlparse

import httpx2
from mcp.client import Client
from mcp.client.auth import OAuthClientProvider
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client
from mcp.shared.auth import AuthorizationCodeResult, OAuthClientInformationFull, OAuthClientMetadata, OAuthToken
from mcp.shared.exceptions import MCPError


def say(**fields: Any) -> None:
    print(json.dumps(fields), flush=True)


def leaf(error: BaseException) -> BaseException:
    """The first error inside (nested) exception groups: the one worth reporting."""
    while isinstance(error, BaseExceptionGroup) and error.exceptions:
        error = error.exceptions[0]
    return error


def token_shape(token: str | None) -> dict[str, Any] | None:
    return None if token is None else {"len": len(token), "prefix": token[:4]}


class Memory:
    """The SDK's TokenStorage, in memory; reports each registration."""

    def __init__(self) -> None:
        self.tokens: OAuthToken | None = None
        self.client: OAuthClientInformationFull | None = None

    async def get_tokens(self) -> OAuthToken | None:
        return self.tokens

    async def set_tokens(self, tokens: OAuthToken) -> None:
        self.tokens = tokens

    async def get_client_info(self) -> OAuthClientInformationFull | None:
        return self.client

    async def set_client_info(self, client_info: OAuthClientInformationFull) -> None:
        self.client = client_info
        say(step="registered", client_id=client_info.client_id,
            token_endpoint_auth_method=client_info.token_endpoint_auth_method,
            client_secret_issued=client_info.client_secret is not None,
            redirect_uris=[str(u) for u in client_info.redirect_uris or []])


class Wire:
    """Every HTTP exchange (the auth flow's own requests included); the discovery step shows
    those that are not MCP requests, and the MCP requests refused with 401 or 403."""

    def __init__(self, mcp_url: str) -> None:
        self.mcp_path = urlparse(mcp_url).path
        self.exchanges: list[dict[str, Any]] = []

    async def on_response(self, response: httpx2.Response) -> None:
        request = response.request
        entry: dict[str, Any] = {"method": request.method, "path": request.url.path,
                                 "status": response.status_code}
        if request.url.path.endswith("/token") or request.url.path.endswith("/register"):
            try:
                body = request.content.decode()
            except Exception:  # a streamed body: nothing to show
                body = ""
            if request.url.path.endswith("/token"):
                form = {k: v[0] for k, v in parse_qs(body).items()}
                entry.update(grant_type=form.get("grant_type"), resource=form.get("resource"),
                             scope=form.get("scope"), client_id_in_body="client_id" in form,
                             secret_in_body="client_secret" in form,
                             basic_auth=request.headers.get("authorization", "").startswith("Basic "),
                             content_type=request.headers.get("content-type"))
                if response.status_code != 200:
                    await response.aread()
                    entry["body"] = response.text[:300]
            else:
                entry["fields"] = sorted(json.loads(body)) if body else []
        if response.status_code in (401, 403):
            entry["www_authenticate"] = response.headers.get("www-authenticate")
        self.exchanges.append(entry)

    def auth_related(self) -> list[dict[str, Any]]:
        return [x for x in self.exchanges if x["path"] != self.mcp_path or x["status"] in (401, 403)]


class Callback:
    """The loopback redirect URI and the three ways the authorization response comes back."""

    def __init__(self, mode: str, port: int) -> None:
        self.mode = mode
        self.port = port
        self.arrived: asyncio.Queue[str] = asyncio.Queue()
        self.pending_url = ""

    @property
    def redirect_uri(self) -> str:
        return f"http://127.0.0.1:{self.port}/callback"

    async def listen(self) -> asyncio.AbstractServer:
        server = await asyncio.start_server(self._serve, "127.0.0.1", self.port)
        self.port = server.sockets[0].getsockname()[1]
        return server

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            line = (await reader.readline()).decode("latin-1").split(" ")
            while (await reader.readline()) not in (b"\r\n", b"\n", b""):
                pass
            target = line[1] if len(line) > 1 else "/"
            found = line[0] == "GET" and urlparse(target).path == "/callback"
            page = b"agentworks test client: you can close this page.\n" if found else b"not found\n"
            writer.write(b"HTTP/1.1 %s\r\ncontent-type: text/plain\r\ncontent-length: %d\r\n"
                         b"connection: close\r\n\r\n" % (b"200 OK" if found else b"404 Not Found", len(page)) + page)
            await writer.drain()
            if found:
                await self.arrived.put(f"http://127.0.0.1:{self.port}{target}")
        finally:
            writer.close()

    async def redirect_handler(self, authorization_url: str) -> None:
        query = {k: v[0] for k, v in parse_qs(urlparse(authorization_url).query).items()}
        say(step="authorize", endpoint=authorization_url.split("?")[0],
            **{k: query.get(k) for k in ("client_id", "redirect_uri", "scope", "resource",
                                         "code_challenge_method", "response_type", "prompt")},
            state_sent="state" in query, code_challenge_sent="code_challenge" in query)
        self.pending_url = authorization_url
        if self.mode != "fetch":
            print(f"AUTHORIZE {authorization_url}", flush=True)

    async def callback_handler(self) -> AuthorizationCodeResult:
        if self.mode == "stdin":
            url = (await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)).strip()
            if not url:
                raise RuntimeError("stdin closed before the callback URL came")
        elif self.mode == "http":
            url = await self.arrived.get()
        else:
            async with httpx2.AsyncClient() as http:
                answer = await http.get(self.pending_url)
            url = answer.headers.get("location", "")
            if not answer.is_redirect or not url:
                raise RuntimeError(f"the authorization endpoint answered {answer.status_code}, not a redirect")
        query = {k: v for k, v in parse_qs(urlparse(url).query).items()}
        one = {k: v[0] for k, v in query.items()}
        say(step="callback", source=self.mode, redirect_uri_matches=url.split("?")[0] == self.redirect_uri,
            code=bool(one.get("code")), state=one.get("state") is not None, iss=one.get("iss"),
            error=one.get("error"), error_description=one.get("error_description"),
            repeated=sorted(k for k, v in query.items() if len(v) > 1))
        if "error" in one:
            raise RuntimeError(f"authorization refused: {one['error']}")
        return AuthorizationCodeResult(code=one.get("code", ""), state=one.get("state"), iss=one.get("iss"))


async def write(client: Client, label: str, workflow: str, path: str, wire: Wire) -> None:
    before = len(wire.exchanges)
    args = {"workflow_id": workflow, "path": path, "content": f"written by oauth_sdk_client ({label})\n",
            "expected_revision": "missing", "request_id": str(uuid.uuid4())}
    try:
        result = await client.call_tool("write_file", args)
    except MCPError as e:
        statuses = [x["status"] for x in wire.exchanges[before:]]
        say(step="write_file", label=label, workflow=workflow, path=path, ok=False, refused=str(e),
            http_statuses=statuses)
        return
    content = result.structured_content or {}
    text = next((c.text for c in result.content if c.type == "text"), None)
    if result.is_error:
        say(step="write_file", label=label, workflow=workflow, path=path, ok=False, error=content.get("error"),
            text=(text or "")[:300])
    else:
        say(step="write_file", label=label, workflow=workflow, path=path, ok=True, revision=content.get("revision"))


async def refresh(client: Client, provider: OAuthClientProvider, storage: Memory, wire: Wire) -> None:
    old = storage.tokens
    before = len(wire.exchanges)
    # The SDK refreshes before a request when the stored token is past its expiry.
    provider.context.token_expiry_time = time.time() - 1
    tools = await client.list_tools()
    grants = [x for x in wire.exchanges[before:] if x.get("grant_type") == "refresh_token"]
    new = storage.tokens
    say(step="refresh", grant_status=grants[0]["status"] if grants else None, grant=grants[0] if grants else None,
        access_token_changed=bool(old and new and old.access_token != new.access_token),
        refresh_token_rotated=bool(old and new and old.refresh_token != new.refresh_token),
        scope=new.scope if new else None, expires_in=new.expires_in if new else None,
        tools_after=len(tools.tools),
        reauthorized=any(x.get("grant_type") == "authorization_code" for x in wire.exchanges[before:]))


async def run(options: argparse.Namespace) -> dict[str, Any]:
    callback = Callback(options.callback, options.port)
    listener = await callback.listen()
    storage = Memory()
    wire = Wire(options.url)
    metadata = OAuthClientMetadata(
        redirect_uris=[callback.redirect_uri],
        client_name=options.client_name,
        token_endpoint_auth_method=options.token_auth,
    )
    provider = OAuthClientProvider(options.url, metadata, storage,
                                   redirect_handler=callback.redirect_handler,
                                   callback_handler=callback.callback_handler)
    http = create_mcp_http_client(auth=provider)
    http.event_hooks = {"request": [], "response": [wire.on_response]}
    step = "connect"
    try:
        async with http, Client(streamable_http_client(options.url, http_client=http), mode="auto") as client:
            say(step="connected", era=client.protocol_version)
            say(step="discovery", exchanges=wire.auth_related())
            step = "tools/list"
            names = [t.name for t in (await client.list_tools()).tools]
            say(step="tools/list", names=names)
            for label, workflow, path in options.write or []:
                step = f"write_file {label}"
                await write(client, label, workflow, path, wire)
            step = "refresh"
            await refresh(client, provider, storage, wire)
            if options.pause:
                # The driver revokes the app meanwhile; then the stored token, sent as it is
                # (no SDK auth flow, which would re-authorize), must be refused.
                print("PAUSE", flush=True)
                await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
                step = "after-pause"
                token = storage.tokens.access_token if storage.tokens else ""
                async with httpx2.AsyncClient() as raw:
                    answer = await raw.post(options.url, content=b"{}", headers={
                        "authorization": f"Bearer {token}", "content-type": "application/json",
                        "accept": "application/json, text/event-stream"})
                say(step="after-pause", status=answer.status_code,
                    www_authenticate=answer.headers.get("www-authenticate"))
    except Exception as e:  # report where it broke; the exit status says it broke
        cause = leaf(e)
        return {"step": "done", "ok": False, "failed_at": step, "error": f"{type(cause).__name__}: {cause}",
                "exchanges": wire.auth_related()[-6:]}
    finally:
        listener.close()
    tokens = storage.tokens
    return {"step": "done", "ok": True, "client_id": storage.client.client_id if storage.client else None,
            "access_token": token_shape(tokens.access_token if tokens else None),
            "refresh_token": token_shape(tokens.refresh_token if tokens else None),
            "scope": tokens.scope if tokens else None}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("url")
    parser.add_argument("--write", nargs=3, action="append", metavar=("LABEL", "WORKFLOW", "PATH"))
    parser.add_argument("--callback", choices=["stdin", "http", "fetch"], default="stdin")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--token-auth", choices=["none", "client_secret_basic", "client_secret_post"], default="none")
    parser.add_argument("--client-name", default="agentworks SDK test")
    parser.add_argument("--pause", action="store_true",
                        help="after the refresh, print PAUSE, wait for a line on stdin, then report "
                             "the status /mcp answers the stored access token")
    options = parser.parse_args()
    if options.port == 0:
        with socket.socket() as s:  # a free port now, so the redirect URI is known before listening
            s.bind(("127.0.0.1", 0))
            options.port = s.getsockname()[1]
    summary = asyncio.run(run(options))
    say(**summary)
    sys.exit(0 if summary["ok"] else 1)


if __name__ == "__main__":
    main()
