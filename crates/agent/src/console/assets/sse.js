// Reading a turn's `text/event-stream` as it arrives: fetch + ReadableStream, parsed here (the
// turn is a POST, which EventSource cannot send).

// The event-stream parser (the WHATWG "server-sent events" rules for `event:` and `data:`):
// push text as it arrives; each call answers the events completed so far, {event, data}.
export class SseParser {
  constructor() {
    this.buffer = '';
    this.type = '';
    this.data = [];
  }

  push(text) {
    this.buffer += text;
    const events = [];
    let start = 0;
    for (;;) {
      const match = /\r\n|\r|\n/g;
      match.lastIndex = start;
      const found = match.exec(this.buffer);
      if (!found) break;
      // A \r at the very end may be the first half of a \r\n still on its way.
      if (found[0] === '\r' && found.index === this.buffer.length - 1) break;
      const line = this.buffer.slice(start, found.index);
      start = found.index + found[0].length;
      const event = this.line(line);
      if (event) events.push(event);
    }
    this.buffer = this.buffer.slice(start);
    return events;
  }

  line(line) {
    if (line === '') {
      const event = this.data.length > 0
        ? { event: this.type || 'message', data: this.data.join('\n') }
        : null;
      this.type = '';
      this.data = [];
      return event;
    }
    if (line.startsWith(':')) return null; // a comment
    const colon = line.indexOf(':');
    const field = colon === -1 ? line : line.slice(0, colon);
    let value = colon === -1 ? '' : line.slice(colon + 1);
    if (value.startsWith(' ')) value = value.slice(1);
    if (field === 'event') this.type = value;
    else if (field === 'data') this.data.push(value);
    return null; // id and retry mean nothing here
  }
}

// Calls onEvent(kind, data) for each event of `response`'s body as it arrives, `data` parsed
// as JSON (or the raw text when it is not JSON). Resolves when the stream ends; an event cut
// off by the end of the stream is dropped, as the SSE rules say.
export async function readEventStream(response, onEvent) {
  const reader = response.body.getReader();
  const decoder = new TextDecoder();
  const parser = new SseParser();
  const deliver = (events) => {
    for (const { event, data } of events) {
      let parsed;
      try {
        parsed = JSON.parse(data);
      } catch {
        parsed = data;
      }
      onEvent(event, parsed);
    }
  };
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    deliver(parser.push(decoder.decode(value, { stream: true })));
  }
  deliver(parser.push(decoder.decode()));
}
