// Stands in for the SDK's StdioServerTransport in server-filesystem (see hooks.mjs): the SDK's
// own StreamableHTTPServerTransport, one session (the SDK's stateless mode needs a new server
// per request, which server-filesystem cannot make), JSON responses (enableJsonResponse, the
// cheaper of the two reply forms), on http://127.0.0.1:$PORT/mcp.
import http from "node:http";
import { randomUUID } from "node:crypto";
import { StreamableHTTPServerTransport } from "@modelcontextprotocol/sdk/server/streamableHttp.js";

export class StdioServerTransport extends StreamableHTTPServerTransport {
  constructor() {
    super({ sessionIdGenerator: () => randomUUID(), enableJsonResponse: true });
  }

  async start() {
    await super.start();
    const server = http.createServer((req, res) => {
      if (!req.url.startsWith("/mcp")) {
        res.writeHead(404).end();
        return;
      }
      this.handleRequest(req, res).catch((error) => {
        console.error("handleRequest:", error);
        if (!res.headersSent) res.writeHead(500);
        res.end();
      });
    });
    server.keepAliveTimeout = 120_000;
    const port = Number(process.env.PORT);
    await new Promise((resolve) => server.listen(port, "127.0.0.1", resolve));
    console.error(`reference server on http://127.0.0.1:${port}/mcp`);
  }
}
