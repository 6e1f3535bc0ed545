// The device-login approval page (`/v1/device/approve?user_code=…`, the link `agentworks
// login` prints): the signed-in person sees which computer asks, and approves or denies it
// once; then the page says what happened and links back to the console. Not signed in: off to
// the console's sign-in, which comes back here (`?next=`).
//
// The device's name and the code are shown side by side, each written exactly as `agentworks
// login` prints it (`Device: …`, `Code: …`), so the person compares them with their own
// terminal: a link sent by someone else carries that person's code and device, and approving
// it would give their laptop this account.

import { api, session } from './api.js';
import { h, fill, showStatus } from './dom.js';

const API = '/v1/console/device-login';
const main = () => document.getElementById('main');

// What went wrong, in words: this endpoint answers `{error, error_description}`.
function problem(answer) {
  const body = answer.body || {};
  if (answer.status === 404) return 'No pending login has this code: it is unknown, expired or already decided. Run agentworks login again.';
  if (answer.status === 409) return 'This login was already approved or denied.';
  if (answer.status === 429) return `Too many wrong codes. ${body.error_description || 'Try again later.'}`;
  if (typeof body.error_description === 'string') return body.error_description;
  if (body.error && typeof body.error.message === 'string') return body.error.message;
  return `The server answered ${answer.status}.`;
}

function codeForm() {
  const input = h('input', { id: 'user-code', name: 'user_code', autocomplete: 'off', autocapitalize: 'characters', spellcheck: 'false', required: true });
  fill(main(),
    h('h1', {}, 'Approve a device login'),
    h('p', {}, 'Type the code agentworks login shows on your computer.'),
    h('form', { method: 'get', action: '/v1/device/approve' },
      h('label', { for: 'user-code' }, 'Code'), ' ', input, ' ',
      h('button', { type: 'submit' }, 'Continue')));
  input.focus();
}

// Where the person goes from here: the console, or another code.
function wayBack() {
  return h('p', { class: 'actions' },
    h('a', { href: '/console/', id: 'back-to-console' }, 'Back to the console'),
    ' · ',
    h('a', { href: '/v1/device/approve' }, 'Approve another device'));
}

// The page once the login is decided (or cannot be): what happened, what to do next, and a
// way back. The code, the expiry and the buttons are gone: nothing is left to decide.
function decided(answer, login) {
  const body = answer.body || {};
  const device = body.device_name || login.device_name || 'the device';
  if (answer.status === 200 && body.approved) {
    document.title = 'Device login approved · agentworks';
    showStatus(`Approved: ${device} can now connect as ${body.user}.`);
    fill(main(),
      h('h1', {}, 'Device login approved'),
      h('p', { id: 'outcome' }, `${device} can now connect as your executor (as ${body.user}). `,
        'Go back to the terminal where agentworks login runs: it names your account and asks you to confirm. Then agentworks executor connect there shares a folder.'),
      h('p', {}, 'You can close this page.'),
      wayBack());
  } else if (answer.status === 200) {
    document.title = 'Device login denied · agentworks';
    showStatus('Denied: the login was refused.');
    fill(main(),
      h('h1', {}, 'Device login denied'),
      h('p', { id: 'outcome' }, `${device} was not given access: agentworks login on that computer stops and says the login was denied. `,
        'If it was your own login after all, run agentworks login again there.'),
      wayBack());
  } else {
    document.title = 'Device login not decided · agentworks';
    showStatus(problem(answer), 'error');
    fill(main(),
      h('h1', {}, 'Device login not decided here'),
      h('p', { id: 'outcome', role: 'alert' }, problem(answer)),
      wayBack());
  }
}

// The session ended meanwhile: sign in again and come back to this page.
function signIn() {
  const next = location.pathname + location.search;
  location.replace(`/console/sign-in?next=${encodeURIComponent(next)}`);
}

async function decide(login, approve, buttons) {
  for (const button of buttons) button.disabled = true;
  const answer = await api('POST', API, { user_code: login.user_code, approve });
  if (answer.status === 401) return signIn();
  if (answer.status === 429 || answer.status === 0 || answer.status >= 500) {
    // Nothing was decided: the person may try again.
    for (const button of buttons) button.disabled = false;
    return showStatus(problem(answer), 'error');
  }
  decided(answer, login);
}

async function pending(userCode, user) {
  const answer = await api('GET', `${API}?user_code=${encodeURIComponent(userCode)}`);
  if (answer.status === 401) return signIn();
  if (answer.status !== 200) {
    fill(main(), h('h1', {}, 'Approve a device login'), h('p', { role: 'alert' }, problem(answer)), wayBack());
    return showStatus(problem(answer), 'error');
  }
  const login = answer.body;
  const approve = h('button', { type: 'button' }, 'Approve');
  const deny = h('button', { type: 'button' }, 'Deny');
  const buttons = [approve, deny];
  approve.addEventListener('click', () => decide(login, true, buttons));
  deny.addEventListener('click', () => decide(login, false, buttons));
  const minutes = Math.max(1, Math.round(login.expires_in / 60));
  fill(main(),
    h('h1', {}, 'Approve a device login'),
    h('p', {}, 'Your terminal shows these two lines under agentworks login. Approve only if they are the same there:'),
    h('div', { id: 'compare', class: 'compare', role: 'group', 'aria-label': 'What agentworks login shows' },
      h('samp', { id: 'device-name' }, `Device: ${login.device_name || '(no name given)'}`),
      h('samp', { id: 'device-code' }, `Code: ${login.user_code}`)),
    h('p', {}, 'Approving grants ', h('code', {}, login.scopes.join(', ')),
      `: it lets that computer connect as your executor (as ${user}) and nothing else.`),
    h('p', {}, 'Only approve a login you started yourself.'),
    h('p', { id: 'expiry' }, `The code expires in about ${minutes} min.`),
    h('div', { id: 'decision' }, approve, ' ', deny));
}

async function start() {
  let person = null;
  try {
    person = await session();
  } catch (error) {
    return showStatus(`Cannot reach the server: ${error.message}`, 'error');
  }
  if (!person) return signIn();
  document.getElementById('who').textContent = `Signed in as ${person.user.name}`;
  const userCode = new URLSearchParams(location.search).get('user_code');
  if (!userCode || userCode.trim() === '') return codeForm();
  return pending(userCode.trim(), person.user.name);
}

start();
