// The console's calls to agentd: JSON in and out, the session cookie sent with every call
// (`credentials: 'same-origin'`), and the session's CSRF token on every state-changing one.

let current = null; // the session as the server last answered it: {user, csrf_token, expires_at_ms}

const SAFE_METHODS = ['GET', 'HEAD'];

// The signed-in person and the session's CSRF token, or null when not signed in.
export async function session() {
  const response = await fetch('/v1/console/session', {
    credentials: 'same-origin',
    headers: { Accept: 'application/json' },
  });
  if (response.status !== 200) {
    current = null;
    return null;
  }
  const body = await response.json();
  current = body;
  return { user: body.user, csrf_token: body.csrf_token };
}

// Keeps the session a sign-in (or invite) answered with, so the next calls carry its token.
export function remember(signedIn) {
  current = signedIn;
}

export function forget() {
  current = null;
}

// The fetch of one call, unread: for the turn's event stream, which is read as it arrives.
export async function request(method, path, body, accept = 'application/json') {
  const headers = { Accept: accept };
  const init = { method, headers, credentials: 'same-origin', cache: 'no-store' };
  if (body !== undefined) {
    headers['Content-Type'] = 'application/json';
    init.body = JSON.stringify(body);
  }
  if (!SAFE_METHODS.includes(method)) {
    if (current === null) await session();
    if (current !== null) headers['X-CSRF-Token'] = current.csrf_token;
  }
  return fetch(path, init);
}

// One JSON call: {status, body, headers}; `body` is the parsed JSON (null when empty), or an
// error envelope of our own when the answer is not JSON.
export async function api(method, path, body) {
  let response;
  try {
    response = await request(method, path, body);
  } catch (error) {
    return { status: 0, body: envelope('network_error', `cannot reach the server: ${error.message}`), headers: new Headers() };
  }
  return answerOf(response);
}

// Uploads a file's bytes as the body of a POST (an attachment), answered like `api`. The
// server sniffs the type from the bytes: the browser's idea of it is not sent.
export async function upload(path, file) {
  const headers = { Accept: 'application/json', 'Content-Type': 'application/octet-stream' };
  if (current === null) await session();
  if (current !== null) headers['X-CSRF-Token'] = current.csrf_token;
  let response;
  try {
    response = await fetch(path, { method: 'POST', headers, body: file, credentials: 'same-origin', cache: 'no-store' });
  } catch (error) {
    return { status: 0, body: envelope('network_error', `cannot reach the server: ${error.message}`), headers: new Headers() };
  }
  return answerOf(response);
}

async function answerOf(response) {
  const text = await response.text();
  let parsed = null;
  if (text !== '') {
    try {
      parsed = JSON.parse(text);
    } catch {
      parsed = envelope('not_json', `the server answered ${response.status} with something that is not JSON`);
    }
  }
  return { status: response.status, body: parsed, headers: response.headers };
}

function envelope(code, message) {
  return { error: { code, message } };
}

// The sentence to show for a failed call: the server's own message, and when to retry.
export function errorMessage(answer) {
  const error = answer.body && answer.body.error;
  let message = error && typeof error.message === 'string'
    ? error.message
    : `the request failed (HTTP ${answer.status})`;
  const retry = answer.headers && answer.headers.get('Retry-After');
  if (answer.status === 429 && retry && /^\d+$/.test(retry)) {
    message += ` (try again in ${retry} s)`;
  }
  return message;
}

// The error code of a failed call, or '' for none.
export function errorCode(answer) {
  const error = answer.body && answer.body.error;
  return error && typeof error.code === 'string' ? error.code : '';
}
