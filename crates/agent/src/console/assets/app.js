// The console's entry: routes on location.pathname (home, a chat, the invite page, the one-time
// sign-in link, Connected apps, a project's settings), signs in and out, and shows the person's
// projects and chats.

import { api, session, remember, forget, errorMessage } from './api.js';
import { h, fill, uid, showStatus, clearStatus } from './dom.js';
import { parseRoute, safeNext, fragmentCode } from './paths.js';
import { chatView, chatName } from './chat.js';
import { appsView } from './apps.js';
import { settingsView } from './settings.js';

const main = () => document.getElementById('main');

// Where to go once signed in: `?next=` when it is a path here, else the chat or Connected apps
// this page shows, else home.
function nextPath() {
  const next = safeNext(new URLSearchParams(location.search).get('next'));
  if (next) return next;
  return ['chat', 'apps', 'settings'].includes(parseRoute(location.pathname).name) ? location.pathname : '/console/';
}

function signedIn(answer) {
  remember(answer.body);
  location.assign(nextPath());
}

// The header's person, Connected apps link and Sign out button.
function showPerson(person) {
  const who = document.getElementById('who');
  who.textContent = person ? `Signed in as ${person.user.name}` : '';
  document.getElementById('apps-link').hidden = !person;
  document.getElementById('sign-out').hidden = !person;
}

async function signOut() {
  const answer = await api('POST', '/v1/console/sign-out');
  if (answer.status !== 204 && answer.status !== 200 && answer.status !== 401) {
    showStatus(`Signing out failed: ${errorMessage(answer)}`, 'error');
    return;
  }
  forget();
  location.assign('/console/');
}

function field(label, props) {
  const id = uid('field');
  return h('p', { class: 'field' }, h('label', { for: id }, label), h('input', { id, ...props }));
}

// The sign-in form; `notice` is shown above it (why it is shown, e.g. a link that failed).
function signInView(notice) {
  document.title = 'Sign in · agentworks';
  const error = h('p', { class: 'error', role: 'alert', hidden: true });
  const submit = h('button', { type: 'submit' }, 'Sign in');
  const form = h('form', { class: 'card', 'aria-labelledby': 'sign-in-title' },
    h('h1', { id: 'sign-in-title' }, 'Sign in'),
    notice ? h('p', {}, notice) : null,
    field('Username', { name: 'username', type: 'text', autocomplete: 'username', required: true, autofocus: true }),
    field('Password', { name: 'password', type: 'password', autocomplete: 'current-password', required: true }),
    error,
    submit);
  form.addEventListener('submit', async (event) => {
    event.preventDefault();
    submit.disabled = true;
    error.hidden = true;
    const answer = await api('POST', '/v1/console/sign-in', {
      username: form.elements.username.value,
      password: form.elements.password.value,
    });
    submit.disabled = false;
    if (answer.status === 200) return signedIn(answer);
    error.textContent = errorMessage(answer);
    error.hidden = false;
    showStatus(`Sign-in failed: ${errorMessage(answer)}`, 'error');
    form.elements.password.select();
  });
  fill(main(), form);
}

// /console/invite#code=…: set a password from a one-time invite, which also signs in.
function inviteView() {
  document.title = 'Set your password · agentworks';
  const code = fragmentCode(location.hash);
  if (!code) {
    fill(main(), h('section', { class: 'card' }, h('h1', {}, 'Set your password'),
      h('p', { class: 'error', role: 'alert' }, 'This invite link has no code. Open the whole link you were given, or ask your operator for a new one (agentworksctl user invite NAME).')));
    return;
  }
  const error = h('p', { class: 'error', role: 'alert', hidden: true });
  const submit = h('button', { type: 'submit' }, 'Set password');
  const form = h('form', { class: 'card', 'aria-labelledby': 'invite-title' },
    h('h1', { id: 'invite-title' }, 'Set your password'),
    h('p', {}, 'Choose the password you will sign in with.'),
    field('New password', { name: 'password', type: 'password', autocomplete: 'new-password', required: true, autofocus: true }),
    field('Repeat the password', { name: 'again', type: 'password', autocomplete: 'new-password', required: true }),
    error,
    submit);
  form.addEventListener('submit', async (event) => {
    event.preventDefault();
    const password = form.elements.password.value;
    if (password !== form.elements.again.value) {
      error.textContent = 'The two passwords differ.';
      error.hidden = false;
      return;
    }
    submit.disabled = true;
    const answer = await api('POST', '/v1/console/invite', { code, password });
    submit.disabled = false;
    if (answer.status === 200) {
      history.replaceState(null, '', location.pathname + location.search);
      return signedIn(answer);
    }
    error.textContent = errorMessage(answer);
    error.hidden = false;
    showStatus(`Setting the password failed: ${errorMessage(answer)}`, 'error');
  });
  fill(main(), form);
}

// /console/sign-in#code=…: the one-time link signs in at once; the code leaves the address bar
// (and the history) whatever the answer, since it can be used only once anyway.
async function linkView() {
  const code = fragmentCode(location.hash);
  history.replaceState(null, '', location.pathname + location.search);
  if (!code) return signInView();
  fill(main(), h('p', { class: 'card' }, 'Signing in…'));
  const answer = await api('POST', '/v1/console/sign-in', { link_code: code });
  if (answer.status === 200) return signedIn(answer);
  if (answer.status === 401) return usedLinkView();
  // Not the link's fault (too many attempts, the server unreachable): the link may still work.
  showStatus(`Signing in with the link failed: ${errorMessage(answer)}`, 'error');
  fill(main(), h('section', { class: 'card' },
    h('h1', {}, 'Signing in failed'),
    h('p', { role: 'alert' }, errorMessage(answer)),
    h('p', {}, 'Open the link again in a moment; it still works if it was not used.')));
}

// A sign-in link that was used already, has expired or is unknown: say so, and how to get a
// new one (an operator makes it; on a quickstart, that is the person who started it).
function usedLinkView() {
  document.title = 'Sign-in link used or expired · agentworks';
  fill(main(), h('section', { class: 'card', 'aria-labelledby': 'link-title' },
    h('h1', { id: 'link-title' }, 'This sign-in link no longer works'),
    h('p', { role: 'alert' }, 'It was used already or has expired: a sign-in link works once, within 15 minutes of being made.'),
    h('p', {}, 'To get a new one, ask your operator to run this on the server and send you the link it prints:'),
    h('pre', {}, h('code', { id: 'new-link-command' }, 'agentworksctl user sign-in-link YOUR-USER-NAME')),
    h('p', { class: 'muted' }, 'If you started agentworksctl quickstart yourself, run ',
      h('code', {}, 'agentworksctl user sign-in-link demo'), ' in another terminal.'),
    h('p', {}, h('a', { href: '/console/sign-in' }, 'Sign in with a password instead'))));
}

// Home: the person's projects, each code project's chats and its New chat button.
async function homeView() {
  document.title = 'agentworks';
  const list = h('div', { class: 'projects' }, h('p', {}, 'Loading your projects…'));
  fill(main(), h('h1', {}, 'Your projects'), list);
  const answer = await api('GET', '/v1/projects');
  if (answer.status === 401) return signInView();
  if (answer.status !== 200) {
    fill(list, h('p', { class: 'error' }, `Your projects could not be loaded: ${errorMessage(answer)}`));
    showStatus(errorMessage(answer), 'error');
    return;
  }
  const projects = answer.body.projects || [];
  if (projects.length === 0) {
    fill(list, h('p', {}, 'You are not a member of any project yet. An operator adds you to one (agentworksctl).'));
    return;
  }
  // The agents a new chat may have (`api`, and runnerd's coding CLIs when it runs): asked once.
  const agents = api('GET', '/v1/agents');
  fill(list, projects.map((project) => projectSection(project, agents)));
}

// The roles that may start a Builder chat (its coding CLI writes the project).
const AUTHORING_ROLES = new Set(['owner', 'co-owner', 'editor']);

// What a chat runs on, in a few words: `api · Run` or `codex · Builder`.
function agentLabel(chat) {
  const mode = chat.mode === 'builder' ? 'Builder' : 'Run';
  return `${chat.agent || 'api'} · ${mode}`;
}

function projectSection(project, agentsAnswer) {
  const title = uid('project');
  const section = h('section', { class: 'project', 'aria-labelledby': title },
    h('h2', { id: title }, project.name, ' ', h('span', { class: 'kind' }, `${project.kind} project · ${project.role}`)));
  if (project.kind !== 'code') {
    section.append(h('p', { class: 'muted' }, 'Chats are for code projects; this is a workflow project.'));
    return section;
  }
  const chats = h('ul', { class: 'chats', 'aria-label': `Chats in ${project.name}` });
  const button = h('button', { type: 'button', 'aria-describedby': title, 'aria-expanded': 'false' }, 'New chat');
  const dialog = newChatForm(project, agentsAnswer);
  button.addEventListener('click', async () => {
    const open = dialog.element.hidden;
    dialog.element.hidden = !open;
    button.setAttribute('aria-expanded', String(open));
    if (open) await dialog.load();
  });
  const settings = h('a', { href: `/console/projects/${encodeURIComponent(project.id)}/settings`, 'aria-describedby': title },
    'MCP connections and secrets');
  section.append(button, ' ', settings, dialog.element, chats);
  loadChats(project, chats);
  return section;
}

// New chat's questions: which agent (from GET /v1/agents) and which mode (Builder only for a
// coding CLI and an authoring role), then the chat is created and opened.
function newChatForm(project, agentsAnswer) {
  const id = uid('new-chat');
  const agent = h('select', { id: `${id}-agent`, name: 'agent' });
  const mode = h('select', { id: `${id}-mode`, name: 'mode' });
  const note = h('p', { class: 'hint', id: `${id}-note` });
  const start = h('button', { type: 'submit' }, 'Start chat');
  const element = h('form', { class: 'new-chat', hidden: true, 'aria-label': `New chat in ${project.name}` },
    h('label', { for: agent.id }, 'Agent'), ' ', agent, ' ',
    h('label', { for: mode.id }, 'Mode'), ' ', mode, ' ', start, note);
  let agents = [];
  const canAuthor = AUTHORING_ROLES.has(project.role);

  function showModes() {
    const chosen = agents.find((a) => a.name === agent.value);
    const modes = (chosen && chosen.modes) || ['run'];
    const options = [h('option', { value: 'run' }, 'Run (reads the project)')];
    if (modes.includes('builder') && canAuthor) options.push(h('option', { value: 'builder' }, 'Builder (writes the project)'));
    fill(mode, options);
    mode.disabled = options.length === 1;
    if (chosen && !chosen.available) note.textContent = `${chosen.name} cannot run: ${chosen.unavailable || 'unavailable'}`;
    else if (modes.includes('builder') && !canAuthor) note.textContent = `Builder needs an authoring role; yours is ${project.role}.`;
    else note.textContent = '';
  }

  async function load() {
    if (agents.length > 0) return;
    const answer = await agentsAnswer;
    agents = answer.status === 200 ? answer.body.agents || [] : [];
    if (agents.length === 0) agents = [{ name: 'api', kind: 'api', available: true, modes: ['run'] }];
    fill(agent, agents.map((a) => h('option', { value: a.name, disabled: a.kind !== 'api' && !a.available },
      a.kind === 'api' ? `api (built-in${a.model ? `, ${a.model}` : ''})` : `${a.name} (${a.driver || 'coding CLI'}, ${a.model})`)));
    if (answer.status === 200 && answer.body.runnerd && !answer.body.runnerd.running) {
      element.append(h('p', { class: 'hint muted' }, `Coding CLIs are not offered: ${answer.body.runnerd.message}`));
    }
    showModes();
  }

  agent.addEventListener('change', showModes);
  element.addEventListener('submit', async (event) => {
    event.preventDefault();
    start.disabled = true;
    const answer = await api('POST', '/v1/chats', { project: project.id, agent: agent.value, mode: mode.value });
    start.disabled = false;
    if (answer.status === 201 || answer.status === 200) {
      location.assign(`/console/chats/${encodeURIComponent(answer.body.chat_id)}`);
    } else {
      showStatus(`A new chat could not be created: ${errorMessage(answer)}`, 'error');
    }
  });
  return { element, load };
}

async function loadChats(project, list) {
  const answer = await api('GET', `/v1/chats?project=${encodeURIComponent(project.id)}`);
  if (answer.status !== 200) {
    fill(list, h('li', { class: 'error' }, `Chats could not be loaded: ${errorMessage(answer)}`));
    return;
  }
  const chats = answer.body.chats || [];
  if (chats.length === 0) {
    fill(list, h('li', { class: 'muted' }, 'No chats yet.'));
    return;
  }
  fill(list, chats.map((chat) => h('li', {},
    h('a', { href: `/console/chats/${encodeURIComponent(chat.chat_id)}` }, chatName(chat)),
    ` · ${new Date(chat.created_at_ms).toLocaleString()}`,
    ` · ${chat.turns} ${chat.turns === 1 ? 'turn' : 'turns'}`,
    ` · ${agentLabel(chat)}`,
    chat.binding ? ` · laptop folder ${chat.binding.folder}` : ' · server files')));
}

async function start() {
  document.getElementById('sign-out').addEventListener('click', signOut);
  clearStatus();
  const route = parseRoute(location.pathname);
  if (route.name === 'invite') return inviteView();
  if (route.name === 'sign-in' && fragmentCode(location.hash)) return linkView();
  let person = null;
  try {
    person = await session();
  } catch (error) {
    showStatus(`Cannot reach the server: ${error.message}`, 'error');
  }
  showPerson(person);
  if (!person) return signInView();
  const next = safeNext(new URLSearchParams(location.search).get('next'));
  if (next && (route.name === 'home' || route.name === 'sign-in')) return location.replace(next);
  if (route.name === 'sign-in') return location.replace('/console/');
  if (route.name === 'home') return homeView();
  if (route.name === 'chat') return chatView(main(), route.chatId, { onSignedOut: () => signInView() });
  if (route.name === 'apps') return appsView(main(), { onSignedOut: () => signInView() });
  if (route.name === 'settings') return settingsView(main(), route.projectId, { onSignedOut: () => signInView() });
  fill(main(), h('h1', {}, 'Not found'), h('p', {}, 'The console has no such page. ', h('a', { href: '/console/' }, 'Your projects')));
}

start();
