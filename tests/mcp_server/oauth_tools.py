"""A real OAuth-protected MCP server for agentd's connection sign-in tests: the official Python
SDK's MCPServer as both the authorization server (metadata, dynamic registration, PKCE code
grant, rotating refresh tokens) and the resource server (/mcp needs a bearer token it issued),
served by uvicorn over TLS. The authorization step approves at once (a test stands in for the
person there), redirecting back with the code and the state.

A trap for the sign-in's discovery: /trap/mcp answers 401 naming its metadata at /trap/prm,
which answers 302 to the cloud metadata address.

Test controls: POST /test/expire makes every access token expire now (so the next call needs a
refresh); GET /test/log answers one line per issued token and per /mcp bearer seen, so a test can
check which tokens were used.

Every token request's form (client_secret included) is logged too, as `token-request <form>`,
so a test can tell where a client secret was sent.

Usage: oauth_tools.py ADDRESS PORT CERT KEY [--preregistered CLIENT_ID CLIENT_SECRET REDIRECT_URI]
       [--name HOST]
With --preregistered the server offers no dynamic registration and knows only that one
confidential client (as a provider such as Google does). With --name the server calls itself
https://HOST:PORT (its issuer and resource), listening on ADDRESS all the same.
"""
import secrets, sys, time
import uvicorn
from mcp.server.mcpserver import MCPServer
from mcp.server.auth.provider import (
    AccessToken, AuthorizationCode, RefreshToken, construct_redirect_uri)
from mcp.server.auth.settings import AuthSettings, ClientRegistrationOptions, RevocationOptions
from mcp.server.transport_security import TransportSecuritySettings
from mcp.shared.auth import OAuthClientInformationFull, OAuthToken

args = sys.argv[1:]
name = None
if "--name" in args:
    at = args.index("--name")
    name = args[at + 1]
    del args[at:at + 2]
address, port, cert, key = args[0], int(args[1]), args[2], args[3]
preregistered = args[5:8] if len(args) >= 8 and args[4] == "--preregistered" else None
base = f"https://{name or address}:{port}"
LIFETIME = 3600
log = []


class Provider:
    def __init__(self):
        self.clients, self.codes, self.refresh, self.access = {}, {}, {}, {}

    async def get_client(self, client_id):
        return self.clients.get(client_id)

    async def register_client(self, info):
        self.clients[info.client_id] = info
        log.append(f"registered {info.client_id} {' '.join(str(u) for u in info.redirect_uris or [])}")

    async def authorize(self, client, params):
        code = secrets.token_urlsafe(24)
        self.codes[code] = AuthorizationCode(
            code=code, scopes=params.scopes or ["tools"], expires_at=time.time() + 300,
            client_id=client.client_id, code_challenge=params.code_challenge,
            redirect_uri=params.redirect_uri,
            redirect_uri_provided_explicitly=params.redirect_uri_provided_explicitly,
            resource=params.resource)
        log.append(f"authorized {client.client_id} resource={params.resource}")
        return construct_redirect_uri(str(params.redirect_uri), code=code, state=params.state)

    async def load_authorization_code(self, client, code):
        found = self.codes.get(code)
        return found if found and found.client_id == client.client_id else None

    def issue(self, client_id, scopes, resource):
        access, refresh = "at_" + secrets.token_urlsafe(24), "rt_" + secrets.token_urlsafe(24)
        self.access[access] = AccessToken(
            token=access, client_id=client_id, scopes=scopes,
            expires_at=int(time.time()) + LIFETIME, resource=resource)
        self.refresh[refresh] = RefreshToken(
            token=refresh, client_id=client_id, scopes=scopes, resource=resource)
        log.append(f"issued {access} {refresh}")
        return OAuthToken(access_token=access, token_type="Bearer", expires_in=LIFETIME,
                          refresh_token=refresh, scope=" ".join(scopes))

    async def exchange_authorization_code(self, client, code):
        del self.codes[code.code]
        return self.issue(client.client_id, code.scopes, code.resource)

    async def load_refresh_token(self, client, refresh_token):
        found = self.refresh.get(refresh_token)
        return found if found and found.client_id == client.client_id else None

    async def exchange_refresh_token(self, client, refresh_token, scopes):
        # Rotation: the refresh token is spent.
        del self.refresh[refresh_token.token]
        log.append(f"refreshed {refresh_token.token}")
        return self.issue(client.client_id, scopes or refresh_token.scopes, refresh_token.resource)

    async def load_access_token(self, token):
        found = self.access.get(token)
        if found is None or (found.expires_at and found.expires_at < time.time()):
            return None
        return found

    async def revoke_token(self, token):
        self.access.pop(token.token, None)
        self.refresh.pop(token.token, None)


provider = Provider()
if preregistered:
    client_id, client_secret, redirect_uri = preregistered
    provider.clients[client_id] = OAuthClientInformationFull(
        client_id=client_id, client_secret=client_secret, redirect_uris=[redirect_uri],
        token_endpoint_auth_method="client_secret_post", scope="tools",
        grant_types=["authorization_code", "refresh_token"], response_types=["code"])
server = MCPServer(
    "oauth-tools",
    auth_server_provider=provider,
    auth=AuthSettings(
        issuer_url=base,
        resource_server_url=f"{base}/mcp",
        client_registration_options=ClientRegistrationOptions(
            enabled=preregistered is None, valid_scopes=["tools"], default_scopes=["tools"]),
        revocation_options=RevocationOptions(enabled=True),
        required_scopes=["tools"],
        validate_token_resource=True),
)


@server.tool()
def whoami() -> str:
    """Say that the caller signed in."""
    return "signed in to oauth-tools"


inner = server.streamable_http_app(
    transport_security=TransportSecuritySettings(enable_dns_rebinding_protection=False))


async def respond(send, status, body=b""):
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"text/plain"), (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})


async def app(scope, receive, send):
    if scope["type"] == "http":
        if scope["path"] == "/test/expire":
            for token in provider.access.values():
                token.expires_at = int(time.time()) - 1
            return await respond(send, 200, b"expired")
        if scope["path"] == "/trap/mcp":
            challenge = f'Bearer resource_metadata="{base}/trap/prm"'.encode()
            await send({"type": "http.response.start", "status": 401,
                        "headers": [(b"www-authenticate", challenge), (b"content-length", b"0")]})
            return await send({"type": "http.response.body", "body": b""})
        if scope["path"] == "/trap/prm":
            await send({"type": "http.response.start", "status": 302,
                        "headers": [(b"location", b"http://169.254.169.254/latest/meta-data/"), (b"content-length", b"0")]})
            return await send({"type": "http.response.body", "body": b""})
        if scope["path"] == "/test/log":
            return await respond(send, 200, "\n".join(log).encode())
        if scope["path"] == "/mcp":
            auth = dict(scope["headers"]).get(b"authorization", b"").decode()
            log.append(f"mcp {auth.removeprefix('Bearer ') or '-'}")
        if scope["path"] == "/token":
            body = b""
            while True:
                message = await receive()
                body += message.get("body", b"")
                if not message.get("more_body"):
                    break
            log.append("token-request " + body.decode(errors="replace"))
            replayed = False

            async def replay():
                nonlocal replayed
                if not replayed:
                    replayed = True
                    return {"type": "http.request", "body": body, "more_body": False}
                return await receive()

            return await inner(scope, replay, send)
    await inner(scope, receive, send)


uvicorn.run(app, host=address, port=port, ssl_certfile=cert, ssl_keyfile=key, log_level="warning")
