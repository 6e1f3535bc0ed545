// Preload for the conformance suite, which has no option to send a token: adds
// `Authorization: Bearer $MCP_BEARER_TOKEN` to every HTTP request it makes (global fetch, the
// SDK transport and undici.request share undici's global dispatcher; the raw header checks use
// node:http). Used to run the scenarios that apply to agentd itself. Usage:
//   MCP_BEARER_TOKEN=awt_... node --import ./inject-auth.mjs <suite> server --url ...
import { createRequire } from 'node:module';
const require = createRequire(new URL('./node_modules/@modelcontextprotocol/conformance/dist/index.js', import.meta.url));
const { Agent, setGlobalDispatcher } = require('undici');
const token = process.env.MCP_BEARER_TOKEN;
if (!token) throw new Error('MCP_BEARER_TOKEN is not set');
const addAuth = (dispatch) => (opts, handler) => {
  const headers = opts.headers ?? {};
  let h;
  if (Array.isArray(headers)) {
    h = [];
    for (let i = 0; i < headers.length; i += 2) {
      if (String(headers[i]).toLowerCase() !== 'authorization') h.push(headers[i], headers[i + 1]);
    }
    h.push('authorization', `Bearer ${token}`);
  } else {
    h = Object.fromEntries(Object.entries(headers).filter(([k]) => k.toLowerCase() !== 'authorization'));
    h.authorization = `Bearer ${token}`;
  }
  return dispatch({ ...opts, headers: h }, handler);
};
setGlobalDispatcher(new Agent().compose(addAuth));
// http-header-validation sends its raw-header cases with node:http (to keep exact casing).
import http from 'node:http';
const origRequest = http.request;
http.request = function (...args) {
  const req = origRequest.apply(this, args);
  if (!req.getHeader('authorization')) req.setHeader('Authorization', `Bearer ${token}`);
  return req;
};
