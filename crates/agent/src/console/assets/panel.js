// The chat's right-side panel: exactly three tabs, Local CLI connection, Costs and Models.
// Local CLI connection: the binding's status and Disconnect, the person's devices and folders
// (polled every 3 s), the consequences review and Use this folder, and the setup steps (the
// CLI's install line from GET /v1/cli, then the commands; folded away behind Set up another
// computer while the chat is bound).

import { api, errorMessage } from './api.js';
import { h, fill, uid, showStatus } from './dom.js';
import { connectCommand, loginCommand, pathProblem } from './quote.js';
import { costRows } from './messages.js';

// What a client sends as `confirm` to bind a chat (crates/contract public_api CONFIRMATION;
// a unit test of agentd checks the two are the same).
export const CONFIRMATION = 'I understand file contents and command output go to the server and the model, and commands can reach the network';

const POLL_MS = 3000;

const TABS = [
  ['local', 'Local CLI connection'],
  ['costs', 'Costs'],
  ['models', 'Models'],
];

// state: {chat, running, devices, devicesError} shared with the chat view; onChange() is called
// when the panel changed the chat (binding) or learnt the devices.
export function createPanel(state, onChange) {
  const panels = {};
  const tabs = {};
  const tablist = h('div', { role: 'tablist', 'aria-label': 'Chat panel' });
  const element = h('aside', { class: 'panel', 'aria-label': 'Chat panel' }, tablist);
  for (const [key, label] of TABS) {
    tabs[key] = h('button', {
      type: 'button', role: 'tab', id: `tab-${key}`, 'aria-controls': `tabpanel-${key}`,
      onclick: () => select(key),
    }, label);
    panels[key] = h('section', { role: 'tabpanel', id: `tabpanel-${key}`, 'aria-labelledby': `tab-${key}`, tabindex: '0' });
    tablist.append(tabs[key]);
    element.append(panels[key]);
  }
  function select(key, focus = false) {
    for (const [other] of TABS) {
      const chosen = other === key;
      tabs[other].setAttribute('aria-selected', String(chosen));
      tabs[other].tabIndex = chosen ? 0 : -1;
      panels[other].hidden = !chosen;
    }
    if (focus) tabs[key].focus();
  }
  // Arrow keys move between the tabs (the ARIA tabs pattern).
  tablist.addEventListener('keydown', (event) => {
    const keys = TABS.map(([key]) => key);
    const at = keys.findIndex((key) => tabs[key] === document.activeElement);
    if (at === -1) return;
    const to = { ArrowRight: at + 1, ArrowLeft: at - 1, Home: 0, End: keys.length - 1 }[event.key];
    if (to === undefined) return;
    event.preventDefault();
    select(keys[(to + keys.length) % keys.length], true);
  });
  select('local');

  const local = localConnection(state, onChange);
  panels.local.append(local.element);
  const costs = h('div');
  panels.costs.append(h('h2', {}, 'Costs'), costs);
  const models = h('div', {}, h('p', {}, 'Loading…'));
  panels.models.append(h('h2', {}, 'Models'), models);
  loadModels(models, state.chat);

  function update() {
    local.update();
    renderCosts(costs, state.chat.usage);
  }
  update();
  return { element, update };
}

function renderCosts(container, usage) {
  const { turns, total } = costRows(usage);
  if (turns.length === 0) {
    fill(container, h('p', {}, 'No tokens counted yet: the counts of each turn appear here when it ends (from the model\'s usage fields).'));
    return;
  }
  const cells = (row) => [row.prompt_tokens, row.completion_tokens, row.total_tokens].map((n) => h('td', {}, n.toLocaleString()));
  fill(container,
    h('table', { class: 'costs' },
      h('caption', {}, 'Tokens used, per turn and for this chat'),
      h('thead', {}, h('tr', {}, ['Turn', 'Prompt', 'Completion', 'Total'].map((t) => h('th', { scope: 'col' }, t)))),
      h('tbody', {}, turns.map((row) => h('tr', {}, h('th', { scope: 'row' }, `Turn ${row.turn}`), cells(row)))),
      h('tfoot', {}, h('tr', {}, h('th', { scope: 'row' }, 'This chat'), cells(total)))));
}

async function loadModels(container, chat) {
  // A coding CLI's model is its runnerd provider's, not the server's [agentd.model].
  if (chat.agent && chat.agent !== 'api') {
    const agents = await api('GET', '/v1/agents');
    const found = agents.status === 200 ? (agents.body.agents || []).find((a) => a.name === chat.agent) : null;
    fill(container, h('p', {}, found && found.model
      ? `This chat's agent, ${chat.agent}, is a coding CLI that runnerd runs with the model ${found.model}.`
      : `This chat's agent, ${chat.agent}, is a coding CLI that runnerd runs; its provider's configuration names its model.`));
    return;
  }
  const answer = await api('GET', '/v1/models');
  if (answer.status !== 200) {
    fill(container, h('p', { class: 'error' }, `The model could not be looked up: ${errorMessage(answer)}`));
    return;
  }
  const { configured, model, base_url: baseUrl } = answer.body;
  if (!configured) {
    fill(container,
      h('p', { class: 'warning' }, 'No model is configured on this server: nothing answers. A message you send is kept in the chat, and a turn sent once a model is configured answers from there.'),
      h('p', {}, 'An operator sets base_url and model in the [agentd.model] section of agentd\'s config file (or runs agentworksctl quickstart with --model-url URL --model NAME).'));
    return;
  }
  fill(container,
    h('p', {}, 'This server\'s agent uses:'),
    h('dl', {},
      h('dt', {}, 'Model'), h('dd', {}, model || '(unnamed)'),
      h('dt', {}, 'Endpoint'), h('dd', {}, baseUrl || '(not shown)')));
}

// The Local CLI connection tab.
function localConnection(state, onChange) {
  const status = h('div', { class: 'binding', 'aria-live': 'polite' });
  const devices = h('div', { class: 'devices' });
  const review = h('div', { class: 'review' });
  const setup = setupSteps();
  // Once the chat is bound the setup is done: its steps give way to a button that brings
  // them back (another computer, another folder).
  let setupWanted = false;
  const showSetup = h('button', {
    type: 'button', id: 'show-setup', onclick: () => { setupWanted = true; render(); },
  }, 'Set up another computer');
  const devicesHeading = h('h3', {}, 'Your devices');
  const element = h('div', {},
    h('h2', {}, 'Local CLI connection'),
    status,
    devicesHeading,
    devices,
    review,
    showSetup,
    setup);
  let selected = null; // {device_id, folder}: picking changes nothing until Use this folder
  let disconnecting = false;
  let shownDevices = null;

  const device = (id) => (state.devices || []).find((d) => d.device_id === id);

  async function change(method, body, done) {
    const path = `/v1/chats/${encodeURIComponent(state.chat.chat_id)}/binding`;
    const answer = await api(method, path, body);
    if (answer.status !== 200) {
      const message = errorMessage(answer);
      showStatus(message, 'error');
      render();
      review.prepend(h('p', { class: 'error', role: 'alert' }, message));
      return;
    }
    const message = done();
    // The answer is the chat without its messages and usage.
    state.chat = { ...state.chat, ...answer.body, binding: answer.body.binding || null };
    selected = null;
    disconnecting = false;
    setupWanted = false;
    showStatus(message, 'info');
    onChange();
  }

  function bindingStatus() {
    const binding = state.chat.binding;
    if (!binding) return [h('p', {}, 'This chat uses server files.')];
    const d = device(binding.device_id);
    const name = d ? d.name : `device ${binding.device_id}`;
    const online = d ? d.online : false;
    const parts = [
      h('p', {}, 'This chat uses the folder ', h('strong', {}, binding.folder), ' on ', h('strong', {}, name), ': ',
        h('span', { class: online ? 'online' : 'offline' }, online ? 'online' : 'offline'), '.'),
    ];
    if (!online) {
      parts.push(h('p', { class: 'warning' }, `${name} is offline. The chat keeps this binding and its restrictions: file and command calls fail until the device reconnects (there is no fallback to server files).`));
    }
    if (disconnecting) {
      parts.push(h('div', { class: 'review', role: 'group', 'aria-label': 'What switching back restores' },
        h('h3', {}, 'Switch back to server files?'),
        h('ul', {},
          h('li', {}, 'The agent works on the project\'s server files again, with its MCP connections and secrets.'),
          h('li', {}, `The agent no longer reaches ${binding.folder} on ${name}; the CLI keeps sharing the folder until you stop it (Ctrl-C).`),
          h('li', {}, 'File contents and command output already in this chat stay in its history.')),
        h('button', {
          type: 'button', disabled: state.running,
          onclick: () => change('DELETE', undefined, () => 'This chat uses server files again.'),
        }, 'Switch to server files'),
        ' ',
        h('button', { type: 'button', onclick: () => { disconnecting = false; render(); } }, 'Keep the folder')));
    } else {
      parts.push(h('button', {
        type: 'button', disabled: state.running,
        onclick: () => { disconnecting = true; render(); },
      }, 'Disconnect'));
    }
    if (state.running) parts.push(h('p', { class: 'muted' }, 'A turn is running: connection changes wait until it ends.'));
    return parts;
  }

  function deviceList() {
    if (state.devicesError) return [h('p', { class: 'error' }, `Your devices could not be listed: ${state.devicesError}`)];
    const list = state.devices || [];
    if (list.length === 0) {
      return [h('p', {}, 'No devices yet. Follow the steps below: your computer appears here while agentworks executor connect runs.')];
    }
    const bound = state.chat.binding;
    // One fieldset per device (its name and state as the legend); all folders are one radio
    // group: one folder is picked at a time.
    return list.map((d) => h('fieldset', { class: 'device' },
      h('legend', {}, d.name, ' ', h('span', { class: d.online ? 'online' : 'offline' }, d.online ? 'online' : 'offline')),
      d.folders.length === 0
        ? h('p', { class: 'muted' }, 'Shares no folders.')
        : d.folders.map((f) => {
          const id = uid('folder');
          const inUse = bound && bound.device_id === d.device_id && bound.folder === f.alias;
          const access = f.access === 'read_write' ? 'writable' : 'read-only';
          return h('p', { class: 'folder' },
            h('input', {
              type: 'radio', name: 'folder-choice', id, value: JSON.stringify([d.device_id, f.alias]),
              checked: selected ? selected.device_id === d.device_id && selected.folder === f.alias : Boolean(inUse),
              onchange: () => { selected = { device_id: d.device_id, folder: f.alias }; renderReview(); },
            }),
            h('label', { for: id }, f.alias, ` (${access}${f.downloads ? ', with Downloads' : ''})`, inUse ? ' · in use by this chat' : ''));
        })));
  }

  function renderReview() {
    const bound = state.chat.binding;
    if (!selected || (bound && bound.device_id === selected.device_id && bound.folder === selected.folder)) {
      fill(review);
      return;
    }
    const d = device(selected.device_id);
    const name = d ? d.name : selected.device_id;
    const folder = d && d.folders.find((f) => f.alias === selected.folder);
    const writable = folder && folder.access === 'read_write';
    fill(review,
      h('section', { 'aria-labelledby': 'review-title' },
        h('h3', { id: 'review-title' }, `Review before using ${selected.folder} on ${name}`),
        h('ul', {},
          h('li', {}, 'File contents and command output from this folder go to the server and the model, and stay in this chat\'s history.'),
          h('li', {}, 'Commands the agent runs can reach the network: the internet, services on localhost and your local network, even in a read-only folder.'),
          h('li', {}, 'While this chat is bound, server files, MCP connections and secrets are unavailable in this chat.'),
          h('li', {}, writable
            ? 'The folder is writable: the agent can change its files and run builds and tests that do.'
            : 'The folder is read-only: the agent can read files and run commands, not change files.')),
        d && !d.online ? h('p', { class: 'warning' }, `${name} is offline now: file and command calls fail until it reconnects.`) : null,
        h('button', {
          type: 'button', disabled: state.running,
          onclick: () => change('PUT', { device_id: selected.device_id, folder: selected.folder, confirm: CONFIRMATION },
            () => `This chat now uses the folder ${selected.folder} on ${name}.`),
        }, 'Use this folder'),
        state.running ? h('p', { class: 'muted' }, 'A turn is running: connection changes wait until it ends.') : null));
  }

  // The device list is rebuilt only when the devices changed, so a poll does not take the
  // focus away from a folder being picked.
  function renderDevices() {
    const seen = JSON.stringify([
      (state.devices || []).map((d) => [d.device_id, d.name, d.online, d.folders]),
      state.devicesError,
      state.chat.binding,
    ]);
    if (seen === shownDevices) return;
    shownDevices = seen;
    const focused = document.activeElement && devices.contains(document.activeElement) ? document.activeElement.value : null;
    fill(devices, deviceList());
    if (focused) {
      const again = [...devices.querySelectorAll('input')].find((input) => input.value === focused);
      if (again) again.focus();
    }
  }

  function render() {
    // The same for every agent: a coding CLI's chat bound to a folder works there too.
    fill(status, bindingStatus());
    renderDevices();
    renderReview();
    setup.hidden = Boolean(state.chat.binding) && !setupWanted;
    showSetup.hidden = !setup.hidden;
  }

  let polling = false;
  async function poll() {
    if (polling) return;
    polling = true;
    const answer = await api('GET', '/v1/devices');
    polling = false;
    if (answer.status === 200) {
      state.devices = answer.body.devices || [];
      state.devicesError = null;
    } else {
      state.devicesError = errorMessage(answer);
    }
    render();
    onChange({ devicesOnly: true });
  }
  poll();
  setInterval(poll, POLL_MS);

  return { element, update: render };
}

// The setup steps, with the connect command generated from the inputs.
function setupSteps() {
  const origin = location.origin;
  const pathId = uid('path');
  const readOnlyId = uid('readonly');
  const blockId = uid('block');
  const downloadsId = uid('downloads');
  const path = h('input', { id: pathId, type: 'text', placeholder: '~/src/project', autocomplete: 'off', spellcheck: 'false' });
  const readOnlyAccess = h('input', { type: 'radio', name: 'access', id: uid('access'), value: 'read-only', checked: true });
  const writableAccess = h('input', { type: 'radio', name: 'access', id: uid('access'), value: 'writable' });
  const readOnly = h('textarea', { id: readOnlyId, rows: 2, spellcheck: 'false', placeholder: '.git' });
  const block = h('textarea', { id: blockId, rows: 2, spellcheck: 'false', placeholder: '.env' });
  const downloads = h('input', { type: 'checkbox', id: downloadsId, 'aria-describedby': `${downloadsId}-note` });
  const command = h('code', { id: 'connect-command' });
  const problem = h('p', { class: 'muted' });
  const copy = h('button', { type: 'button', onclick: () => copyText(command.textContent) }, 'Copy the command');
  const readOnlyField = h('p', { class: 'field' },
    h('label', { for: readOnlyId }, 'Paths that stay read-only (--read-only), one per line, inside the folder'), readOnly);
  const lines = (area) => area.value.split('\n');

  function update() {
    const writable = writableAccess.checked;
    readOnlyField.hidden = !writable;
    const trouble = pathProblem(path.value);
    if (trouble) {
      problem.textContent = `The command appears here once you ${trouble}.`;
      problem.hidden = false;
      command.textContent = '';
      command.parentElement.hidden = true;
      copy.hidden = true;
      return;
    }
    problem.hidden = true;
    command.parentElement.hidden = false;
    copy.hidden = false;
    command.textContent = connectCommand({
      folder: path.value, writable, readOnly: lines(readOnly), block: lines(block), downloads: downloads.checked,
    });
  }
  for (const input of [path, readOnlyAccess, writableAccess, readOnly, block, downloads]) {
    input.addEventListener('input', update);
    input.addEventListener('change', update);
  }
  const login = loginCommand(origin);
  const element = h('section', { class: 'setup', 'aria-labelledby': 'setup-title' },
    h('h3', { id: 'setup-title' }, 'Set up the CLI on your computer'),
    h('ol', {},
      installStep(),
      h('li', {}, 'Sign in: ', h('pre', {}, h('code', { id: 'login-command' }, login)),
        `It shows a code to approve at ${origin}/v1/device/approve while signed in here. The credential it stores can only connect devices (devices:connect).`),
      h('li', {}, 'Share a project folder (not your home directory, which the CLI refuses) and keep the command running; Ctrl-C stops sharing.',
        h('p', { class: 'field' }, h('label', { for: pathId }, 'Folder to share'), path),
        h('fieldset', {}, h('legend', {}, 'Access'),
          h('p', {}, readOnlyAccess, h('label', { for: readOnlyAccess.id }, 'Read-only (--folder): read files and run commands, change nothing')),
          h('p', {}, writableAccess, h('label', { for: writableAccess.id }, 'Writable (--write-folder): patches, builds and tests'))),
        readOnlyField,
        h('p', { class: 'field' }, h('label', { for: blockId }, 'Blocked paths (--block), one per line, inside the folder'), block),
        h('p', { class: 'check' }, downloads, h('label', { for: downloadsId }, 'Also share Downloads'),
          h('span', { id: `${downloadsId}-note`, class: 'muted' }, ' adds --downloads after the folder: ~/Downloads is shared read-write with the commands of this folder only.')),
        problem,
        h('pre', { hidden: true }, command),
        copy),
      h('li', {}, 'Your computer appears under Your devices: pick the folder, review what it means, then Use this folder.')));
  update();
  return element;
}

// The first setup step: the CLI this server offers (GET /v1/cli, no sign-in needed). For each
// binary, the manifest's one line, shown exactly as the server wrote it: it downloads the
// binary, checks it against the SHA-256 in the line and installs it as ~/.local/bin/agentworks,
// no sudo. Then what this server does not offer, and the package for machines with the
// project's package repository.
function installStep() {
  const body = h('div', {}, h('p', { class: 'muted' }, 'Asking the server which CLI it offers…'));
  const step = h('li', { id: 'install-step' }, 'Install the CLI.', body);
  api('GET', '/v1/cli').then((answer) => fill(body, ...installText(answer)));
  return step;
}

const OS_NAMES = { linux: 'Linux', macos: 'macOS' };
const platformName = ({ os, arch }) => `${OS_NAMES[os] || os} ${arch}`;

function installText(answer) {
  const { binaries = [], not_offered: notOffered = [], package: cliPackage = 'agentworks-cli' } =
    answer.status === 200 && answer.body ? answer.body : {};
  const parts = [];
  if (answer.status !== 200) {
    parts.push(h('p', {}, `The server did not say which CLI it offers: ${errorMessage(answer)}`));
  } else if (binaries.length === 0) {
    const linux = notOffered.find((n) => n.os === 'linux');
    parts.push(h('p', { id: 'no-cli' }, 'This server has no CLI to offer', linux ? `: ${linux.reason}.` : '.'));
  }
  for (const binary of binaries) {
    const name = platformName(binary);
    if (binary.install) {
      parts.push(
        h('p', {}, `${name} (uname -sm prints "${OS_NAMES[binary.os] || binary.os} ${binary.arch}"): paste this line into a terminal. It downloads the CLI, checks its SHA-256 and installs it as ~/.local/bin/agentworks, without sudo:`),
        h('pre', {}, h('code', { class: 'install-command', 'data-arch': binary.arch }, binary.install)),
        h('button', { type: 'button', onclick: () => copyText(binary.install) }, `Copy the ${name} line`));
    } else {
      parts.push(h('p', {}, `${name}: download `, h('code', {}, binary.url), ', check that its SHA-256 is ',
        h('code', {}, binary.sha256), ', make it executable and put it on your PATH as agentworks.'));
    }
  }
  if (answer.status === 200) {
    const offered = binaries.map(platformName);
    const missing = notOffered.map(platformName);
    parts.push(h('p', { id: 'cli-platforms', class: 'muted' },
      offered.length ? `This server offers the CLI for ${offered.join(' and ')}.` : '',
      missing.length ? ` Not for ${missing.join(', ')}: build it from a clone of the repository, ` : '',
      missing.length ? h('code', {}, 'cargo build --release -p agentworks-laptop --features bin') : '',
      missing.length ? '.' : ''));
  }
  parts.push(h('p', {}, 'Or, where the agentworks package repository is set up: ',
    h('code', {}, `sudo apt install ${cliPackage}`), ' or ', h('code', {}, `sudo dnf install ${cliPackage}`), '.'));
  return parts;
}

async function copyText(text) {
  try {
    await navigator.clipboard.writeText(text);
    showStatus('The command is copied.', 'info');
  } catch {
    showStatus('The browser refused to copy; select the command and copy it by hand.', 'error');
  }
}
