// The OAuth consent page (`/oauth/consent?request=…`, where agentd's /oauth/authorize sends the
// browser): the signed-in person sees which app asks for what, picks the projects and folders
// it may use, and allows or denies it once; the browser then goes back to the app. Not signed
// in: off to the console's sign-in, which comes back here (`?next=`).

import { api, session } from './api.js';
import { h, fill, uid, showStatus } from './dom.js';
import { scopeMeaning, problem, folderLines, authoringUnion } from './oauth.js';

const API = '/v1/console/oauth/requests';
const main = () => document.getElementById('main');

// The session ended meanwhile: sign in again and come back to this page.
function signIn() {
  const next = location.pathname + location.search;
  location.replace(`/console/sign-in?next=${encodeURIComponent(next)}`);
}

// What went wrong with this request, in words.
function requestProblem(answer) {
  if (answer.status === 404) return 'This request is unknown, expired or already decided. Start again from the app.';
  if (answer.status === 409) return 'This request was already allowed or denied.';
  return problem(answer);
}

function failed(message) {
  fill(main(), h('h1', {}, 'Allow an app'), h('p', { class: 'error' }, message));
  showStatus(message, 'error');
}

// One checkbox per project. Checked by default: every project, or, when the app asks to
// write, every project the person can author (one whose role cannot author says it would
// stay read only, and is left unchecked).
function projectBoxes(request) {
  return (request.projects || []).map((project) => {
    const id = uid('project');
    const readOnly = request.writes && !project.can_author;
    const box = h('input', { type: 'checkbox', id, value: project.id, checked: !readOnly });
    if (readOnly) box.setAttribute('aria-describedby', `${id}-note`);
    return {
      project,
      box,
      element: h('p', { class: 'check' }, box, h('label', { for: id }, project.name),
        readOnly ? h('span', { id: `${id}-note`, class: 'muted' }, ' read only: your role cannot author') : null),
    };
  });
}

function textarea(label, value, hint) {
  const id = uid('folders');
  const field = h('textarea', { id, rows: 3, spellcheck: 'false', autocomplete: 'off', 'aria-describedby': `${id}-hint` });
  field.value = value;
  return {
    field,
    element: h('p', { class: 'field' }, h('label', { for: id }, label), field,
      h('span', { id: `${id}-hint`, class: 'hint' }, hint)),
  };
}

// How far the app's name can be trusted: a registered app chose it itself (unverified); an
// app named by a metadata document is shown with that document's host.
function clientLabel(request) {
  return request.client_registered || !request.client_host ? 'unverified' : request.client_host;
}

function consentForm(request) {
  const name = request.client_name || request.client_id;
  const label = clientLabel(request);
  const scopes = request.scopes || [];
  const host = request.redirect_host;
  const projects = projectBoxes(request);
  const chosen = () => projects.filter((p) => p.box.checked);
  const allow = h('button', { type: 'submit' }, 'Allow');
  const deny = h('button', { type: 'button' }, 'Deny');
  const buttons = [allow, deny];

  let writable = null;
  let readOnly = null;
  let edited = false; // whether the person changed Writable folders: untouched, `null` is sent
  if (request.writes) {
    writable = textarea('Writable folders', authoringUnion(chosen().map((p) => p.project)).join('\n'),
      'One folder per line, under the projects\' authoring paths. Empty: nothing is writable.');
    writable.field.addEventListener('input', () => { edited = true; });
    readOnly = textarea('Read-only folders', '', 'One folder per line; the app can read these but never change them.');
    // Untouched, the field follows the chosen projects.
    for (const p of projects) {
      p.box.addEventListener('change', () => {
        if (!edited) writable.field.value = authoringUnion(chosen().map((c) => c.project)).join('\n');
      });
    }
  }

  const decide = async (allowed) => {
    let body = { allow: false };
    if (allowed) {
      const ids = chosen().map((p) => p.project.id);
      if (ids.length === 0) return showStatus('Choose at least one project, or Deny.', 'error');
      // An app that cannot write gets no writable folder at all.
      body = { allow: true, projects: ids, write_folders: [], read_only_folders: [] };
      if (request.writes) {
        body.write_folders = edited ? folderLines(writable.field.value) : null;
        body.read_only_folders = folderLines(readOnly.field.value);
      }
    }
    for (const button of buttons) button.disabled = true;
    const answer = await api('POST', `${API}/${encodeURIComponent(request.request)}`, body);
    if (answer.status === 401) return signIn();
    if (answer.status === 200 && answer.body && typeof answer.body.redirect === 'string') {
      showStatus(`${allowed ? 'Allowed' : 'Denied'}: returning to ${host}…`);
      return location.assign(answer.body.redirect);
    }
    if (answer.status === 404 || answer.status === 409) {
      document.getElementById('decision')?.remove();
    } else {
      // Nothing was decided (a folder to fix, the server unreachable): the person may try again.
      for (const button of buttons) button.disabled = false;
    }
    showStatus(requestProblem(answer), 'error');
  };
  deny.addEventListener('click', () => decide(false));

  const reads = scopes.includes('workflows:run') ? 'read and run' : 'read';
  const minutes = Math.max(1, Math.round(request.expires_in / 60));
  const form = h('form', { class: 'consent', 'aria-labelledby': 'consent-title' },
    h('h1', { id: 'consent-title' }, `Allow ${name} (${label}) to use agentworks?`),
    h('dl', {},
      h('dt', {}, 'App'), h('dd', { id: 'client-name' }, name, ' ',
        h('span', { id: 'client-verification', class: 'muted' },
          request.client_registered || !request.client_host
            ? '(unverified: the app chose this name itself when it registered)'
            : `(named by a document at ${request.client_host}; the name itself is unverified)`)),
      h('dt', {}, 'Client ID'), h('dd', { id: 'client-id' }, h('code', {}, request.client_id)),
      h('dt', {}, 'Returns to'), h('dd', { id: 'redirect-host' }, host)),
    h('h2', {}, 'It asks to'),
    h('ul', { class: 'scopes', 'aria-label': 'Scopes' },
      scopes.map((scope) => h('li', {}, h('code', {}, scope), ': ', scopeMeaning(scope)))),
    h('fieldset', {}, h('legend', {}, 'Projects'),
      projects.length > 0
        ? projects.map((p) => p.element)
        : h('p', { class: 'muted' }, 'You are not a member of any project, so this app could reach nothing.')),
    request.writes
      ? [writable.element, readOnly.element]
      : h('p', {}, `This app can ${reads}; it can never write.`),
    h('p', { class: 'muted' }, `Only allow an app you are setting up yourself. This request expires in about ${minutes} min.`),
    h('div', { id: 'decision', class: 'actions' }, allow, ' ', deny));
  form.addEventListener('submit', (event) => {
    event.preventDefault();
    decide(true);
  });
  document.title = `Allow ${name} (${label}) · agentworks`;
  fill(main(), form);
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
  const id = new URLSearchParams(location.search).get('request');
  if (!id || id.trim() === '') return failed('This link has no request. Start again from the app.');
  const answer = await api('GET', `${API}/${encodeURIComponent(id.trim())}`);
  if (answer.status === 401) return signIn();
  if (answer.status !== 200 || !answer.body) return failed(requestProblem(answer));
  consentForm(answer.body);
}

start();
