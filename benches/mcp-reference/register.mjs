// `node --import register.mjs .../server-filesystem/dist/index.js DIR` with PORT set: the
// reference server, unchanged, over the TypeScript SDK's streamable HTTP transport instead of
// stdio (see http-transport.mjs). Without PORT this hook does nothing.
import { register } from "node:module";

if (process.env.PORT) {
  register("./hooks.mjs", import.meta.url);
}
