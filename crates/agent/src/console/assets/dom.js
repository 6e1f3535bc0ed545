// Building the page. Strings always become text nodes: nothing from the server, the model or a
// tool is ever parsed as HTML.

const PROPERTIES = new Set(['value', 'checked', 'disabled', 'hidden', 'open', 'selected']);

// h('button', {type: 'button', onclick: f}, 'Send'): an element with attributes, properties
// (value, checked, disabled, hidden, open), listeners (on…) and children (nodes, strings,
// arrays; null and false are skipped).
export function h(tag, props = {}, ...children) {
  const element = document.createElement(tag);
  for (const [key, value] of Object.entries(props)) {
    if (value === undefined || value === null) continue;
    if (key.startsWith('on')) {
      if (typeof value !== 'function') throw new TypeError(`${key} must be a function`);
      element.addEventListener(key.slice(2), value);
    } else if (PROPERTIES.has(key)) {
      element[key] = value;
    } else if (key === 'class') {
      element.className = value;
    } else if (value !== false) {
      element.setAttribute(key, value === true ? '' : String(value));
    }
  }
  append(element, children);
  return element;
}

function append(element, children) {
  for (const child of children) {
    if (child === null || child === undefined || child === false) continue;
    if (Array.isArray(child)) append(element, child);
    else if (child instanceof Node) element.append(child);
    else element.append(document.createTextNode(String(child)));
  }
}

// Replaces an element's children.
export function fill(element, ...children) {
  element.replaceChildren();
  append(element, children);
  return element;
}

let ids = 0;
// A page-unique id for label/aria references.
export function uid(prefix) {
  ids += 1;
  return `${prefix}-${ids}`;
}

// The status line under the header: what went wrong (kind 'error') or what happened.
export function showStatus(message, kind = 'info') {
  const line = document.getElementById('status');
  if (!line) return;
  line.textContent = message;
  line.dataset.kind = kind;
  line.hidden = message === '';
}

export function clearStatus() {
  showStatus('');
}
