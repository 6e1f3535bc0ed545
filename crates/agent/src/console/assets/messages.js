// What a chat shows, from the stored messages (OpenAI chat format) and the turn's events:
// pure functions (no DOM), so the folding rules can be checked outside a browser.

const MAX_SUMMARY_CHARS = 200;
const MAX_DETAIL_CHARS = 100_000;

// A tool call's outcome: 'done' or 'failed' and its one-line summary. The server's `state` and
// `summary` win; without them a call that is not ok is failed, with its error's message.
export function toolOutcome({ ok, state, summary, error }) {
  const settled = state === 'done' || state === 'failed' ? state : ok === true ? 'done' : 'failed';
  let line = typeof summary === 'string' ? summary : '';
  if (line === '' && settled === 'failed' && error && typeof error.message === 'string') line = error.message;
  return { state: settled, summary: oneLine(line) };
}

function oneLine(text) {
  const first = String(text).split(/\r\n|\r|\n/, 1)[0].trim();
  return first.length > MAX_SUMMARY_CHARS ? `${first.slice(0, MAX_SUMMARY_CHARS)}…` : first;
}

// The folded line of a tool call: `✓ name summary`, `✗ name summary`, `… name running`.
export function toolLine(call) {
  if (call.state === 'pending') return `… ${call.name} running`;
  const mark = call.state === 'done' ? '✓' : '✗';
  return call.summary ? `${mark} ${call.name} ${call.summary}` : `${mark} ${call.name}`;
}

// The expanded details of a tool call, as text: its arguments and its result or error.
export function toolDetails(call) {
  let text = `arguments:\n${pretty(call.arguments)}`;
  if (call.output !== undefined && call.output !== null) text += `\n\nresult:\n${pretty(call.output)}`;
  if (text.length > MAX_DETAIL_CHARS) {
    text = `${text.slice(0, MAX_DETAIL_CHARS)}\n… (${text.length - MAX_DETAIL_CHARS} more characters not shown)`;
  }
  return text;
}

function pretty(value) {
  let parsed = value;
  if (typeof value === 'string') {
    try {
      parsed = JSON.parse(value);
    } catch {
      return value;
    }
  }
  if (parsed === undefined) return '';
  return JSON.stringify(parsed, null, 2);
}

// The display names of a stored message's attachments (the server sanitised them).
function attachmentNames(attachments) {
  if (!Array.isArray(attachments)) return [];
  return attachments.filter((a) => a && typeof a.name === 'string').map((a) => a.name);
}

// The stored messages as items to show, in order:
// {kind: 'user'|'assistant', turn, text} and {kind: 'tool', turn, id, name, arguments, state,
// summary, output}: each tool call one item, its stored result folded into it.
export function foldMessages(messages) {
  const items = [];
  const calls = new Map();
  for (const message of messages || []) {
    const turn = message.turn;
    if (message.role === 'user') {
      items.push({ kind: 'user', turn, text: textOf(message.content), attachments: attachmentNames(message.attachments) });
    } else if (message.role === 'assistant') {
      const text = textOf(message.content);
      if (text !== '') items.push({ kind: 'assistant', turn, text });
      for (const call of message.tool_calls || []) {
        const fn = call.function || {};
        const item = {
          kind: 'tool', turn, id: call.id, name: fn.name || 'tool', arguments: fn.arguments,
          state: 'pending', summary: '', output: null,
        };
        calls.set(call.id, item);
        items.push(item);
      }
    } else if (message.role === 'tool') {
      const item = calls.get(message.tool_call_id);
      if (!item) continue;
      let content = message.content;
      try {
        content = JSON.parse(message.content);
      } catch {
        // Not JSON: shown as it is.
      }
      const body = content && typeof content === 'object' ? content : {};
      Object.assign(item, toolOutcome({ ok: body.ok, state: message.state, summary: message.summary, error: body.error }));
      item.output = body.ok === true ? body.result : body.error !== undefined ? body.error : content;
    }
  }
  // A stored turn is over: a call without a stored result never got one.
  for (const item of calls.values()) {
    if (item.state === 'pending') Object.assign(item, { state: 'failed', summary: 'no result was recorded' });
  }
  return items;
}

function textOf(content) {
  if (typeof content === 'string') return content;
  if (Array.isArray(content)) {
    return content.filter((part) => part && part.type === 'text').map((part) => part.text).join('\n');
  }
  return '';
}

// The chat's token counts: {turns: [{turn, prompt_tokens, completion_tokens, total_tokens}],
// total: {...}}, zeros for missing numbers; an empty list when the chat has none.
export function costRows(usage) {
  const counts = (row) => ({
    prompt_tokens: number(row && row.prompt_tokens),
    completion_tokens: number(row && row.completion_tokens),
    total_tokens: number(row && row.total_tokens),
  });
  const turns = (usage && Array.isArray(usage.turns) ? usage.turns : []).map((row) => ({ turn: row.turn, ...counts(row) }));
  let total = counts(usage && usage.total);
  if (!(usage && usage.total)) {
    total = turns.reduce((sum, row) => ({
      prompt_tokens: sum.prompt_tokens + row.prompt_tokens,
      completion_tokens: sum.completion_tokens + row.completion_tokens,
      total_tokens: sum.total_tokens + row.total_tokens,
    }), counts(null));
  }
  return { turns, total };
}

function number(value) {
  return Number.isFinite(value) ? value : 0;
}
