// The app's routes, the `?next=` rule and fragment codes: pure functions (no DOM).

// What a path under /console/ shows:
// {name: 'home'|'chat'|'invite'|'sign-in'|'apps'|'settings'|'unknown', chatId?, projectId?}.
export function parseRoute(pathname) {
  const rest = pathname.replace(/^\/console\/?/, '').replace(/\/+$/, '');
  if (rest === '') return { name: 'home' };
  if (rest === 'invite') return { name: 'invite' };
  if (rest === 'sign-in') return { name: 'sign-in' };
  if (rest === 'apps') return { name: 'apps' };
  const chat = /^chats\/([A-Za-z0-9_-]+)$/.exec(rest);
  if (chat) return { name: 'chat', chatId: chat[1] };
  const settings = /^projects\/([A-Za-z0-9_-]+)\/settings$/.exec(rest);
  if (settings) return { name: 'settings', projectId: settings[1] };
  return { name: 'unknown' };
}

// `next` if it is a path on this origin (starts with one `/`, not `//` nor `/\`, no control
// characters), else null: a sign-in never sends the person to another site. The device-login
// approval page with its query (`/v1/device/approve?user_code=…`) and the OAuth consent page with
// its (`/oauth/consent?request=…`) are such paths.
export function safeNext(next) {
  if (typeof next !== 'string' || !next.startsWith('/')) return null;
  if (next.startsWith('//') || next.startsWith('/\\')) return null;
  // Browsers drop tabs and newlines from URLs, so "/\t/evil" would become "//evil".
  if (/[\u0000-\u001f\u007f]/.test(next)) return null;
  return next;
}

// The `code` of a fragment `#code=…` (URL-encoded), or null.
export function fragmentCode(hash) {
  const params = new URLSearchParams(hash.replace(/^#/, ''));
  const code = params.get('code');
  return code ? code : null;
}
