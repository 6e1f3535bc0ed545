// Module resolution hook: server-filesystem's import of the SDK's stdio transport resolves to
// http-transport.mjs instead. Nothing else changes.
const shim = new URL("./http-transport.mjs", import.meta.url).href;

export async function resolve(specifier, context, next) {
  if (
    specifier === "@modelcontextprotocol/sdk/server/stdio.js" &&
    context.parentURL?.includes("/server-filesystem/")
  ) {
    return { url: shim, shortCircuit: true };
  }
  return next(specifier, context);
}
