// A code project's settings (`/console/projects/{id}/settings`): its MCP connections (remote
// servers whose tools every server-mode chat of the project can use) and the secrets their
// headers name. Owners and co-owners add and remove both; editors see the connections only.
// A secret's value is typed once and never shown again; the server never sends it back.

import { api, errorMessage } from './api.js';
import { h, fill, uid, showStatus } from './dom.js';

const MANAGERS = ['owner', 'co-owner'];

function field(label, props) {
  const id = uid('field');
  return h('p', { class: 'field' }, h('label', { for: id }, label), h('input', { id, ...props }));
}

function connectionItem(connection, manage, base, list) {
  const title = uid('connection');
  const headers = Object.entries(connection.headers || {});
  const item = h('li', { class: 'app', 'aria-labelledby': title },
    h('h3', { id: title }, connection.name),
    h('dl', {},
      h('dt', {}, 'URL'), h('dd', {}, h('code', {}, connection.url)),
      h('dt', {}, 'Tools are named'), h('dd', {}, h('code', {}, `${connection.tool_prefix}…`)),
      h('dt', {}, 'Headers'), h('dd', {}, headers.length === 0 ? 'none'
        : headers.map(([name, value]) => `${name}: ${value.format.replace('{}', `«secret ${value.secret}»`)}`).join('; ')),
      h('dt', {}, 'OAuth sign-in'), h('dd', {}, connection.signed_in ? 'signed in' : 'not signed in')));
  if (manage) {
    const signIn = h('button', { type: 'button' },
      `${connection.signed_in ? 'Sign in again to' : 'Sign in to'} ${connection.name}`);
    signIn.addEventListener('click', async () => {
      signIn.disabled = true;
      const answer = await api('POST', `${base}/mcp-connections/${encodeURIComponent(connection.connection_id)}/sign-in`);
      const target = answer.status === 200 && answer.body ? String(answer.body.authorization_url || '') : '';
      // The server checked it too: only an https page is opened.
      if (target.startsWith('https://')) {
        showStatus(`Opening ${connection.name}'s sign-in page…`);
        location.assign(target);
        return;
      }
      signIn.disabled = false;
      const error = answer.body && answer.body.error;
      if (error && error.code === 'needs_client_id') {
        showStatus(`${connection.name} offers no automatic registration: an operator must configure a sign-in app for it with the callback URL ${error.callback_url}.`, 'error');
      } else if (error && error.code === 'no_sign_in_needed') {
        showStatus(`${connection.name} does not ask for a sign-in.`);
      } else {
        showStatus(`Signing in to ${connection.name} failed: ${errorMessage(answer)}`, 'error');
      }
    });
    item.append(signIn, ' ');
    const remove = h('button', { type: 'button' }, `Remove ${connection.name}`);
    remove.addEventListener('click', async () => {
      remove.disabled = true;
      const answer = await api('DELETE', `${base}/mcp-connections/${encodeURIComponent(connection.connection_id)}`);
      if (answer.status === 200 || answer.status === 404) {
        item.remove();
        if (list.children.length === 0) list.append(h('li', { class: 'muted' }, 'No MCP connections.'));
        showStatus(`Removed ${connection.name}: chats no longer get its tools.`);
        return;
      }
      remove.disabled = false;
      showStatus(`Removing ${connection.name} failed: ${errorMessage(answer)}`, 'error');
    });
    item.append(remove);
  }
  return item;
}

function addConnectionForm(base, reload) {
  const error = h('p', { class: 'error', role: 'alert', hidden: true });
  const submit = h('button', { type: 'submit' }, 'Add connection');
  const form = h('form', { class: 'card', 'aria-label': 'Add an MCP connection' },
    h('h3', {}, 'Add an MCP connection'),
    h('p', { class: 'muted' }, 'A remote MCP server over https. Its tools go to every server-mode chat of this project; chats bound to a laptop folder never get them.'),
    field('Name', { name: 'name', type: 'text', required: true, maxlength: 64 }),
    field('Server URL', { name: 'url', type: 'text', required: true, placeholder: 'https://mcp.example.com/mcp' }),
    field('Header (optional)', { name: 'header', type: 'text', placeholder: 'Authorization' }),
    field('Secret the header sends', { name: 'secret', type: 'text', placeholder: 'LINEAR_API_KEY' }),
    field('Header value format', { name: 'format', type: 'text', value: 'Bearer {}' }),
    error,
    submit);
  form.addEventListener('submit', async (event) => {
    event.preventDefault();
    const values = form.elements;
    const body = { name: values.name.value, url: values.url.value };
    if (values.header.value.trim() !== '') {
      body.headers = { [values.header.value.trim()]: { secret: values.secret.value.trim(), format: values.format.value } };
    }
    submit.disabled = true;
    error.hidden = true;
    const answer = await api('POST', `${base}/mcp-connections`, body);
    submit.disabled = false;
    if (answer.status === 201) {
      form.reset();
      showStatus(`Added ${answer.body.name}.`);
      return reload();
    }
    error.textContent = errorMessage(answer);
    error.hidden = false;
    showStatus(`The connection was not added: ${errorMessage(answer)}`, 'error');
  });
  return form;
}

function secretsSection(base, secrets, reload) {
  const list = h('ul', { class: 'apps', 'aria-label': 'Project secrets' });
  if (secrets.length === 0) list.append(h('li', { class: 'muted' }, 'No secrets.'));
  for (const secret of secrets) {
    const remove = h('button', { type: 'button' }, `Remove secret ${secret.name}`);
    const item = h('li', {}, h('code', {}, secret.name),
      ` · set ${new Date(secret.updated_at_ms).toLocaleString()} `, remove);
    remove.addEventListener('click', async () => {
      remove.disabled = true;
      const answer = await api('DELETE', `${base}/secrets/${encodeURIComponent(secret.name)}`);
      if (answer.status === 200 || answer.status === 404) {
        showStatus(`Removed the secret ${secret.name}.`);
        return reload();
      }
      remove.disabled = false;
      showStatus(`Removing ${secret.name} failed: ${errorMessage(answer)}`, 'error');
    });
    list.append(item);
  }
  const error = h('p', { class: 'error', role: 'alert', hidden: true });
  const submit = h('button', { type: 'submit' }, 'Save secret');
  const form = h('form', { class: 'card', 'aria-label': 'Set a project secret' },
    h('h3', {}, 'Set a secret'),
    h('p', { class: 'muted' }, 'Stored encrypted; never shown again, to you or anyone. Only a connection header that names it sends it.'),
    field('Secret name', { name: 'name', type: 'text', required: true, placeholder: 'LINEAR_API_KEY', autocomplete: 'off' }),
    field('Secret value', { name: 'value', type: 'password', required: true, autocomplete: 'off' }),
    error,
    submit);
  form.addEventListener('submit', async (event) => {
    event.preventDefault();
    const name = form.elements.name.value.trim();
    submit.disabled = true;
    error.hidden = true;
    const answer = await api('PUT', `${base}/secrets/${encodeURIComponent(name)}`, { value: form.elements.value.value });
    submit.disabled = false;
    form.elements.value.value = '';
    if (answer.status === 200) {
      form.reset();
      showStatus(`Saved the secret ${name}.`);
      return reload();
    }
    error.textContent = errorMessage(answer);
    error.hidden = false;
    showStatus(`The secret was not saved: ${errorMessage(answer)}`, 'error');
  });
  return h('section', { 'aria-labelledby': 'secrets-title' },
    h('h2', { id: 'secrets-title' }, 'Secrets'), list, form);
}

// What the OAuth callback said, in the address it sent the browser back to: shown once, then
// dropped from the address.
function signInOutcome(connections) {
  const params = new URLSearchParams(location.search);
  const signedIn = params.get('signed_in');
  const failed = params.get('sign_in_error');
  if (signedIn === null && failed === null) return;
  history.replaceState(null, '', location.pathname);
  const named = connections.find((c) => c.connection_id === signedIn);
  if (signedIn !== null) showStatus(`Signed in to ${named ? named.name : 'the server'}: chats can use its tools now.`);
  else showStatus(`The sign-in did not finish (${failed}). Try again, or check the server.`, 'error');
}

export async function settingsView(container, projectId, { onSignedOut }) {
  const base = `/v1/projects/${encodeURIComponent(projectId)}`;
  const reload = () => settingsView(container, projectId, { onSignedOut });
  fill(container, h('p', {}, 'Loading the project…'));
  const projects = await api('GET', '/v1/projects');
  if (projects.status === 401) return onSignedOut();
  const project = (projects.body && projects.body.projects || []).find((p) => p.id === projectId || p.name === projectId);
  if (!project) {
    fill(container, h('h1', {}, 'Project settings'), h('p', { class: 'error' }, 'No such project of yours.'));
    return;
  }
  document.title = `${project.name} settings · agentworks`;
  const manage = MANAGERS.includes(project.role);
  const connections = await api('GET', `${base}/mcp-connections`);
  if (connections.status !== 200) {
    const message = `The connections could not be loaded: ${errorMessage(connections)}`;
    fill(container, h('h1', {}, `${project.name} settings`), h('p', { class: 'error' }, message));
    showStatus(message, 'error');
    return;
  }
  const list = h('ul', { class: 'apps', 'aria-label': 'MCP connections' });
  const listed = connections.body.connections || [];
  if (listed.length === 0) list.append(h('li', { class: 'muted' }, 'No MCP connections.'));
  for (const connection of listed) list.append(connectionItem(connection, manage, base, list));
  const parts = [
    h('p', {}, h('a', { href: '/console/' }, 'Your projects')),
    h('h1', {}, `${project.name} settings`),
    h('section', { 'aria-labelledby': 'connections-title' },
      h('h2', { id: 'connections-title' }, 'MCP connections'), list,
      manage ? addConnectionForm(base, reload)
        : h('p', { class: 'muted' }, `Only the project's owner or a co-owner adds or removes connections; your role is ${project.role}.`)),
  ];
  if (manage) {
    const secrets = await api('GET', `${base}/secrets`);
    parts.push(secrets.status === 200
      ? secretsSection(base, secrets.body.secrets || [], reload)
      : h('p', { class: 'error' }, `The secrets could not be loaded: ${errorMessage(secrets)}`));
  }
  fill(container, ...parts);
  signInOutcome(listed);
}
