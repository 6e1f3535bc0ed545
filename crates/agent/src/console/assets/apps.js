// The Connected apps view (`/console/apps`): every app the signed-in person allowed (one live
// grant each) with what it may reach, and a Revoke button that ends its tokens at once.

import { api } from './api.js';
import { h, fill, uid, showStatus, clearStatus } from './dom.js';
import { scopeMeaning, problem } from './oauth.js';

const API = '/v1/console/oauth/apps';

function when(ms) {
  return typeof ms === 'number' ? new Date(ms).toLocaleString() : 'never';
}

function folders(list, none) {
  if (list === null || list === undefined) return "the project's authoring paths";
  return list.length > 0 ? list.join(', ') : none;
}

function appItem(app, list) {
  const name = app.client_name || app.client_id;
  const title = uid('app');
  const revoke = h('button', { type: 'button' }, `Revoke ${name}`);
  const item = h('li', { class: 'app', 'aria-labelledby': title },
    h('h2', { id: title }, name),
    h('dl', {},
      h('dt', {}, 'Client ID'), h('dd', {}, h('code', {}, app.client_id)),
      h('dt', {}, 'Returns to'), h('dd', {}, app.redirect_host),
      h('dt', {}, 'Scopes'), h('dd', {}, h('ul', { class: 'scopes' },
        (app.scopes || []).map((scope) => h('li', {}, h('code', {}, scope), ': ', scopeMeaning(scope))))),
      h('dt', {}, 'Projects'), h('dd', {}, (app.projects || []).map((p) => p.name).join(', ') || 'none'),
      h('dt', {}, 'Writable folders'), h('dd', {}, folders(app.write_folders, 'none')),
      h('dt', {}, 'Read-only folders'), h('dd', {}, folders(app.read_only_folders || [], 'none')),
      h('dt', {}, 'Connected'), h('dd', {}, when(app.created_at_ms)),
      h('dt', {}, 'Last used'), h('dd', {}, when(app.last_used_at_ms))),
    revoke);
  revoke.addEventListener('click', async () => {
    revoke.disabled = true;
    const answer = await api('DELETE', `${API}/${encodeURIComponent(app.grant)}`);
    if (answer.status === 200 || answer.status === 404) {
      // 404: it was revoked already (elsewhere, or it expired): not connected either way.
      item.remove();
      if (list.children.length === 0) list.replaceWith(empty());
      showStatus(answer.status === 200
        ? `Revoked ${name}: its tokens stop working now.`
        : `${name} was no longer connected.`);
      return;
    }
    revoke.disabled = false;
    showStatus(`Revoking ${name} failed: ${problem(answer)}`, 'error');
  });
  return item;
}

function empty() {
  return h('p', { class: 'muted' }, 'No apps are connected. An app you allow on a consent page appears here.');
}

export async function appsView(container, { onSignedOut }) {
  document.title = 'Connected apps · agentworks';
  fill(container, h('h1', {}, 'Connected apps'), h('p', {}, 'Loading your apps…'));
  const answer = await api('GET', API);
  if (answer.status === 401) return onSignedOut();
  if (answer.status !== 200 || !answer.body) {
    const message = `Your apps could not be loaded: ${problem(answer)}`;
    fill(container, h('h1', {}, 'Connected apps'), h('p', { class: 'error' }, message));
    showStatus(message, 'error');
    return;
  }
  clearStatus();
  const apps = answer.body.apps || [];
  const intro = h('p', {}, 'Apps you allowed to use agentworks as you. Revoking one ends its tokens at once; it must ask again.');
  if (apps.length === 0) {
    fill(container, h('h1', {}, 'Connected apps'), intro, empty());
    return;
  }
  const list = h('ul', { class: 'apps', 'aria-label': 'Connected apps' });
  fill(list, apps.map((app) => appItem(app, list)));
  fill(container, h('h1', {}, 'Connected apps'), intro, list);
}
