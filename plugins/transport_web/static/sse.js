// Server-sent events read with fetch (not EventSource): the API key goes in a header, never in
// the URL, and the page decides how to resume. A dropped stream is reopened with back-off and
// `Last-Event-ID`, so the server replays what was missed (docs/http_api.md, "Events").

import { sleep } from './dom.js';

const QUIET_LIMIT = 45000; // ms without a byte (the server pings every 15 s): the link is dead

export class EventStream {
  /**
   * onOpen(startId, fresh): awaited before the first event of each connection; `fresh` when it
   *   started from "now" (not a resume), so the caller reads history for what came before.
   * onEvent({id, type, data}): awaited in order; returning 'resync' drops the resume point
   *   and reconnects from now (after a Gap: history fills what was lost).
   * onState('open' | 'reconnecting' | 'gone', detail)
   */
  constructor(api, path, { onOpen, onEvent, onState }) {
    this.api = api;
    this.path = path;
    this.onOpen = onOpen || (async () => {});
    this.onEvent = onEvent;
    this.onState = onState || (() => {});
    this.lastId = null;
    this.closed = false;
    this.controller = null;
  }

  start() {
    this.running = this.loop();
    return this;
  }

  close() {
    this.closed = true;
    if (this.controller) this.controller.abort();
  }

  async loop() {
    let failures = 0;
    while (!this.closed) {
      let opened = false;
      try {
        opened = await this.connect();
      } catch {
        // network failure, or aborted: below
      }
      if (this.closed) return;
      failures = opened ? 1 : failures + 1;
      const wait = Math.min(5000, 250 * 2 ** Math.min(failures, 5));
      if (this.resync) {
        this.resync = false; // reopen from now at once: not a lost connection
        continue;
      }
      this.onState('reconnecting', { attempt: failures, wait });
      await sleep(wait);
    }
  }

  /** One connection; true once it was open (so the back-off starts again). */
  async connect() {
    const controller = (this.controller = new AbortController());
    const headers = { Accept: 'text/event-stream' };
    const fresh = this.lastId === null;
    if (!fresh) headers['Last-Event-ID'] = this.lastId;
    const response = await this.api.fetch(this.path, { headers, signal: controller.signal, cache: 'no-store' });
    if (response.status === 404) {
      this.closed = true;
      this.onState('gone');
      return false;
    }
    if (!response.ok) return false;
    const start = response.headers.get('Last-Event-ID');
    await this.onOpen(start, fresh); // if it fails, the next try starts from now again
    if (fresh) this.lastId = start;
    this.onState('open');
    await this.read(response.body, controller);
    return true;
  }

  async read(body, controller) {
    const reader = body.pipeThrough(new TextDecoderStream()).getReader();
    let buffer = '';
    let heard = Date.now();
    const watchdog = setInterval(() => {
      if (Date.now() - heard > QUIET_LIMIT) controller.abort();
    }, 5000);
    try {
      for (;;) {
        const { value, done } = await reader.read();
        if (done) return;
        heard = Date.now();
        buffer += value;
        let end;
        while ((end = buffer.indexOf('\n\n')) !== -1) {
          const frame = parseFrame(buffer.slice(0, end));
          buffer = buffer.slice(end + 2);
          if (!frame) continue;
          const verdict = await this.onEvent(frame);
          if (this.closed) return;
          if (verdict === 'resync') {
            this.lastId = null;
            this.resync = true;
            controller.abort();
            return;
          }
          if (frame.id !== null) this.lastId = frame.id;
        }
      }
    } finally {
      clearInterval(watchdog);
    }
  }
}

/** One SSE frame as {id, type, data}; null for a comment (a ping) or a frame without data. */
export function parseFrame(text) {
  let id = null;
  let type = 'message';
  const data = [];
  for (const line of text.split('\n')) {
    if (!line || line.startsWith(':')) continue;
    const colon = line.indexOf(':');
    const field = colon === -1 ? line : line.slice(0, colon);
    let value = colon === -1 ? '' : line.slice(colon + 1);
    if (value.startsWith(' ')) value = value.slice(1);
    if (field === 'id') id = value;
    else if (field === 'event') type = value;
    else if (field === 'data') data.push(value);
  }
  if (!data.length) return null;
  let parsed;
  try {
    parsed = JSON.parse(data.join('\n'));
  } catch {
    return null;
  }
  return { id, type: parsed.type || type, data: parsed };
}

/** Events buffered by the server for one stream, up to `untilId` (a catch-up read): what the
 * stream holds of a turn that was already running when the page connected. */
export async function readBuffered(api, path, untilId) {
  const controller = new AbortController();
  const response = await api.fetch(`${path}?after=0`, {
    headers: { Accept: 'text/event-stream' },
    signal: controller.signal,
    cache: 'no-store',
  });
  if (!response.ok || untilId === null) {
    controller.abort();
    return [];
  }
  const until = BigInt(untilId);
  const events = [];
  const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
  const timer = setTimeout(() => controller.abort(), 5000);
  let buffer = '';
  try {
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      buffer += value;
      let end;
      while ((end = buffer.indexOf('\n\n')) !== -1) {
        const frame = parseFrame(buffer.slice(0, end));
        buffer = buffer.slice(end + 2);
        if (!frame || frame.id === null) continue;
        if (BigInt(frame.id) > until) return events;
        if (frame.type !== 'Gap') events.push(frame);
        if (BigInt(frame.id) >= until) return events;
      }
    }
  } catch {
    // aborted by the timer: what was read is all there is
  } finally {
    clearTimeout(timer);
    controller.abort();
  }
  return events;
}
