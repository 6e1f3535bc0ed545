// The chat view: earlier turns, the composer (Message, Send, Stop, the current connection as
// text), the streamed turn, and the right-side panel. Everything the model or a tool produced
// is put in the page as text.

import { api, request, upload, errorMessage } from './api.js';
import { h, fill, showStatus, clearStatus } from './dom.js';
import { readEventStream } from './sse.js';
import { foldMessages, toolOutcome, toolLine, toolDetails } from './messages.js';
import { createPanel } from './panel.js';

// The server's limits on attachments (it refuses beyond them too).
const MAX_FILES = 10;
const MAX_MB = 10;

function sizeText(bytes) {
  if (bytes < 1024) return `${bytes} B`;
  if (bytes < 1024 * 1024) return `${Math.round(bytes / 1024)} KB`;
  return `${(bytes / (1024 * 1024)).toFixed(1)} MB`;
}

// A chat's name where the console lists or shows it: its title (the first line of its first
// message, which the server keeps), else `New chat` while it has no message.
export function chatName(chat) {
  return chat && typeof chat.title === 'string' && chat.title !== '' ? chat.title : 'New chat';
}

export async function chatView(container, chatId, { onSignedOut }) {
  document.title = 'Chat · agentworks';
  fill(container, h('p', {}, 'Loading the chat…'));
  const path = `/v1/chats/${encodeURIComponent(chatId)}`;
  const answer = await api('GET', path);
  if (answer.status === 401) return onSignedOut();
  if (answer.status !== 200) {
    fill(container, h('h1', {}, 'Chat not found'), h('p', { class: 'error' }, errorMessage(answer)),
      h('p', {}, h('a', { href: '/console/' }, 'Your projects')));
    showStatus(errorMessage(answer), 'error');
    return;
  }
  const state = { chat: answer.body, running: false, devices: [], devicesError: null };

  const title = h('h1', { id: 'chat-title' });
  const where = h('span', { id: 'chat-project' });
  // Who answers and what it may do to the project, fixed when the chat was created.
  const agent = h('p', { class: 'chat-agent', id: 'chat-agent' },
    `Agent: ${state.chat.agent || 'api'} · ${state.chat.mode === 'builder' ? 'Builder mode (writes the project)' : 'Run mode'}`);
  const messages = h('ol', { class: 'messages', 'aria-label': 'Conversation' });
  const connection = h('p', { class: 'connection', id: 'connection', 'aria-live': 'polite' });
  const input = h('textarea', { id: 'message', name: 'message', rows: 3, 'aria-describedby': 'connection' });
  const send = h('button', { type: 'submit' }, 'Send');
  const stop = h('button', { type: 'button', disabled: true, onclick: cancel }, 'Stop');
  // Attachments: picked, pasted or dropped; kept here until the message is sent.
  let pending = [];
  const picker = h('input', {
    type: 'file', multiple: true, id: 'attach-input', hidden: true, 'aria-hidden': 'true', tabindex: '-1',
    onchange: () => { addFiles(picker.files); picker.value = ''; },
  });
  const attach = h('button', { type: 'button', onclick: () => picker.click() }, 'Attach files');
  const attached = h('ul', { class: 'attachments', 'aria-label': 'Attached files' });
  const form = h('form', { class: 'composer', 'aria-label': 'New message' },
    connection,
    h('label', { for: 'message' }, 'Message'),
    input,
    attached,
    h('p', { class: 'hint', id: 'attach-note' },
      `Attached files (at most ${MAX_FILES} per message, ${MAX_MB} MB each) go to the server and the model; they are never copied to your laptop.`),
    h('p', { class: 'actions' }, send, ' ', stop, ' ', attach, picker));
  const panel = createPanel(state, (what) => {
    showConnection();
    if (!(what && what.devicesOnly)) panel.update();
  });
  fill(container, h('div', { class: 'chat-layout' },
    h('section', { class: 'conversation', 'aria-labelledby': 'chat-title' },
      h('p', { class: 'crumbs' }, h('a', { href: '/console/' }, 'Your projects'), where),
      title, agent, messages, form),
    panel.element));
  showTitle();
  projectName(state.chat.project_id).then((name) => {
    if (name) where.textContent = ` › ${name}`;
  });

  for (const item of foldMessages(state.chat.messages)) messages.append(itemElement(item).element);
  showConnection();

  // The heading and the window's title: the chat's title once its first message is stored.
  function showTitle() {
    title.textContent = chatName(state.chat);
    document.title = `${chatName(state.chat)} · agentworks`;
  }

  // The composer says which files the agent works on; it is changed in the panel only.
  function showConnection() {
    const binding = state.chat.binding;
    if (!binding) {
      connection.textContent = 'Connection: server files';
      return;
    }
    const d = state.devices.find((x) => x.device_id === binding.device_id);
    const name = d ? d.name : `device ${binding.device_id}`;
    connection.textContent = `Connection: laptop folder ${binding.folder} on ${name}${d && d.online ? '' : ' (offline)'}`;
  }

  function addFiles(files) {
    for (const file of Array.from(files || [])) {
      if (pending.length >= MAX_FILES) {
        showStatus(`At most ${MAX_FILES} files can be attached to one message; ${file.name} was not added.`, 'error');
        break;
      }
      if (file.size > MAX_MB * 1024 * 1024) {
        showStatus(`${file.name} is larger than ${MAX_MB} MB, the limit per file; it was not added.`, 'error');
        continue;
      }
      if (file.size === 0) {
        showStatus(`${file.name} is empty; it was not added.`, 'error');
        continue;
      }
      pending.push(file);
    }
    showAttached();
  }

  function showAttached() {
    fill(attached, pending.map((file, index) => h('li', {},
      `${file.name || 'pasted image'} (${sizeText(file.size)}) `,
      h('button', {
        type: 'button',
        'aria-label': `Remove ${file.name || 'pasted image'}`,
        disabled: state.running,
        onclick: () => { pending.splice(index, 1); showAttached(); },
      }, 'Remove'))));
  }

  // A pasted screenshot or file, and files dropped on the composer, are attached.
  input.addEventListener('paste', (event) => {
    const files = event.clipboardData ? event.clipboardData.files : null;
    if (files && files.length > 0) {
      event.preventDefault();
      addFiles(files);
    }
  });
  form.addEventListener('dragover', (event) => event.preventDefault());
  form.addEventListener('drop', (event) => {
    event.preventDefault();
    if (event.dataTransfer) addFiles(event.dataTransfer.files);
  });

  // Uploads the pending files; their ids, or null (the status line says why) if one failed.
  async function uploadPending() {
    const ids = [];
    for (const file of pending) {
      const name = file.name || 'pasted-image';
      const answer = await upload(`${path}/attachments?name=${encodeURIComponent(name)}`, file);
      if (answer.status === 401) {
        onSignedOut();
        return null;
      }
      if (answer.status !== 201) {
        showStatus(`Attaching ${name} failed: ${errorMessage(answer)}`, 'error');
        return null;
      }
      ids.push(answer.body.attachment_id);
    }
    return ids;
  }

  function setRunning(running) {
    state.running = running;
    attach.disabled = running;
    send.disabled = running;
    stop.disabled = !running;
    messages.setAttribute('aria-busy', String(running));
    panel.update();
  }

  async function cancel() {
    stop.disabled = true;
    const stopped = await api('POST', `${path}/cancel`);
    if (stopped.status !== 202 && stopped.status !== 409) {
      showStatus(`Stopping failed: ${errorMessage(stopped)}`, 'error');
      if (state.running) stop.disabled = false;
    }
  }

  form.addEventListener('submit', async (event) => {
    event.preventDefault();
    const text = input.value;
    if (text.trim() === '' || state.running) return;
    clearStatus();
    setRunning(true);
    try {
      const ids = await uploadPending();
      if (ids !== null) await runTurn(text, ids);
    } finally {
      setRunning(false);
    }
    // The turn's usage and the chat's binding as stored now.
    const again = await api('GET', path);
    if (again.status === 200) {
      state.chat = again.body;
      showTitle();
      showConnection();
      panel.update();
    }
  });
  // Ctrl+Enter (or ⌘+Enter) sends; Enter alone is a new line.
  input.addEventListener('keydown', (event) => {
    if (event.key === 'Enter' && (event.ctrlKey || event.metaKey)) {
      event.preventDefault();
      form.requestSubmit();
    }
  });

  async function runTurn(text, attachments) {
    let response;
    try {
      response = await request('POST', `${path}/turns`, { message: text, attachments }, 'text/event-stream');
    } catch (error) {
      showStatus(`Cannot reach the server: ${error.message}`, 'error');
      return;
    }
    const type = response.headers.get('Content-Type') || '';
    if (!response.ok || !type.startsWith('text/event-stream')) {
      let body = null;
      try {
        body = await response.json();
      } catch {
        // Not JSON: the status says it.
      }
      if (response.status === 401) return onSignedOut();
      showStatus(errorMessage({ status: response.status, body, headers: response.headers }), 'error');
      return;
    }
    input.value = '';
    const names = pending.map((file) => file.name || 'pasted-image');
    pending = [];
    showAttached();
    messages.append(itemElement({ kind: 'user', text, attachments: names }).element);
    let reply = null; // the answer's text being streamed, until a tool call starts
    const calls = new Map();
    let ended = false;
    try {
      await readEventStream(response, (kind, data) => {
        if (kind === 'text') {
          if (!reply) {
            reply = itemElement({ kind: 'assistant', text: '' });
            messages.append(reply.element);
          }
          reply.add(typeof data.text === 'string' ? data.text : '');
        } else if (kind === 'tool_call') {
          reply = null;
          const call = itemElement({
            kind: 'tool', id: data.id, name: data.name, arguments: data.arguments, state: 'pending', summary: '', output: null,
          });
          calls.set(data.id, call);
          messages.append(call.element);
        } else if (kind === 'tool_result') {
          let call = calls.get(data.id);
          if (!call) {
            call = itemElement({ kind: 'tool', id: data.id, name: data.name, arguments: null, state: 'pending' });
            messages.append(call.element);
          }
          call.settle({ ...toolOutcome(data), output: data.ok === true ? data.result : data.error });
        } else if (kind === 'connection_unavailable') {
          // A project MCP server left out of this turn: say why, and where to reconnect it.
          const name = data && typeof data.name === 'string' ? data.name : 'an MCP server';
          const why = data && typeof data.message === 'string' ? data.message : 'unavailable';
          const settings = `/console/projects/${encodeURIComponent(state.chat.project_id)}/settings`;
          messages.append(h('li', { class: 'msg note', role: 'note' },
            `The MCP server ${name} is not available in this turn: ${why} `,
            h('a', { href: settings }, `Reconnect ${name} in the project's settings`)));
        } else if (kind === 'error') {
          const message = data && typeof data.message === 'string' ? data.message : 'the turn failed';
          messages.append(h('li', { class: 'msg error' }, `Error: ${message}`));
          showStatus(message, 'error');
        } else if (kind === 'end') {
          ended = true;
          if (data && data.reason === 'cancelled') messages.append(h('li', { class: 'msg note' }, 'Stopped: the turn was cancelled.'));
        }
      });
    } catch (error) {
      showStatus(`The answer stopped arriving: ${error.message}`, 'error');
      return;
    }
    if (!ended) showStatus('The connection ended before the turn did; reload the page to see what was stored.', 'error');
  }
}

async function projectName(projectId) {
  const answer = await api('GET', '/v1/projects');
  if (answer.status !== 200) return null;
  const project = (answer.body.projects || []).find((p) => p.id === projectId);
  return project ? project.name : null;
}

// One item of the conversation as an element: {element, add(text)} for a message,
// {element, settle(outcome)} for a tool call (one line; the details open on demand).
function itemElement(item) {
  if (item.kind === 'tool') {
    const call = { ...item };
    const line = h('summary', {}, toolLine(call));
    const details = h('pre', { class: 'details' }, toolDetails(call));
    const element = h('li', { class: `tool ${call.state}` }, h('details', {}, line, details));
    return {
      element,
      settle(outcome) {
        Object.assign(call, outcome);
        element.className = `tool ${call.state}`;
        line.textContent = toolLine(call);
        details.textContent = toolDetails(call);
      },
    };
  }
  const who = item.kind === 'user' ? 'You' : 'Agent';
  const text = h('p', { class: 'text' }, item.text);
  const files = (item.attachments || []).length > 0
    ? h('p', { class: 'files' }, `Attached: ${item.attachments.join(', ')}`)
    : null;
  const element = h('li', { class: `msg ${item.kind}` }, h('span', { class: 'who' }, who), text, files);
  return {
    element,
    add(more) {
      text.append(document.createTextNode(more));
    },
  };
}
