// One open conversation: its history, its live event stream, and sending to it.
//
// Records are grouped in turns: each user message, then the records of its turn (tool calls,
// tool results, then the reply or the error). Turns run one at a time in the order their
// messages were recorded, so the record that ends a turn belongs to the oldest open one.
// Live events draw into that turn; when it ends the page reads the history after the last
// record it has, and the records replace the live drawing (no text lost or shown twice).

import { EventStream, readBuffered } from './sse.js';
import { Turn, summaryElement } from './turn.js';

export class ConversationView {
  constructor(app, info) {
    this.app = app;
    this.api = app.api;
    this.id = info.id;
    this.info = info;
    this.path = `/conversations/${encodeURIComponent(info.id)}`;
    this.list = app.messagesEl;
    this.turns = new Map(); // user message id -> Turn
    this.order = []; // turns with a user message, oldest first
    this.open = []; // turns without their last record, oldest first: [0] runs, the rest wait
    this.known = new Set(); // ids of the records shown
    this.cursor = null; // the last record read from the history
    this.orphan = null; // a running turn whose user message this page has not seen
    this.dirty = new Set();
    this.frame = 0;
    this.answer = (callId, body) =>
      this.api.request('POST', `${this.path}/approvals/${encodeURIComponent(callId)}`, body);
  }

  start() {
    this.list.replaceChildren();
    this.stream = new EventStream(this.api, `${this.path}/events`, {
      onOpen: (startId, fresh) => (fresh ? this.sync(startId) : null),
      onEvent: (event) => this.handle(event),
      onState: (state, detail) => this.app.connection(state, detail, this),
    }).start();
    return this;
  }

  close() {
    this.closed = true;
    if (this.stream) this.stream.close();
    cancelAnimationFrame(this.frame);
  }

  get running() {
    return this.open.length > 0 || this.orphan !== null;
  }

  /** Catch up from the history (and, when a turn runs, from the stream's buffer). */
  async sync(startId) {
    await this.readHistory();
    const info = await this.api.get(this.path);
    this.app.conversationInfo(info);
    for (const turn of this.open) turn.dropLive();
    this.dropOrphan();
    if (info.busy && startId) {
      const events = await readBuffered(this.api, `${this.path}/events`, startId);
      const last = events.findLastIndex((e) => e.type === 'End');
      for (const event of events.slice(last + 1)) await this.handle(event);
    }
    this.settle();
    this.app.refreshStats(this);
  }

  async readHistory() {
    for (;;) {
      const after = this.cursor ? `after=${encodeURIComponent(this.cursor)}&` : '';
      const page = await this.api.get(`${this.path}/messages?${after}limit=200`);
      for (const record of page.items) this.addRecord(record);
      if (page.items.length) this.cursor = page.items.at(-1).id;
      if (!page.hasMore) return;
    }
  }

  addRecord(record) {
    if (!record || !record.id || this.known.has(record.id)) return;
    this.known.add(record.id);
    switch (record.type) {
      case 'user':
        this.addUser(record);
        break;
      case 'tool_call':
        this.turnFor(record).toolCall(record.callId, record.toolName, record.argsJson, true);
        break;
      case 'tool_result':
        this.turnFor(record).toolResult(record.callId, record.text, record.isError, true);
        break;
      case 'assistant':
      case 'error': {
        const turn = this.turnFor(record);
        turn.finish(record);
        this.open = this.open.filter((t) => t !== turn);
        if (turn === this.orphan) this.orphan = null;
        break;
      }
      case 'approval': // pending when the call began to wait, then approved or denied
        if (record.status === 'pending') this.turnFor(record).askApproval(record.callId, this.answer);
        else this.turnFor(record).approvalAnswered(record.callId, record.status);
        break;
      case 'summary':
        if (this.open.length) this.open[0].el.prepend(summaryElement(record));
        else this.list.append(summaryElement(record));
        break;
      default: // a record type this page does not know
    }
    this.scrollSoon();
  }

  addUser(record) {
    const head = this.open[0];
    const at = this.order.findIndex((t) => t.createdAt > record.createdAt);
    let turn;
    if (this.orphan && this.orphan.records === 0 && (!head || head.createdAt > record.createdAt)) {
      turn = this.orphan; // the turn that was already running is this message's
      this.orphan = null;
      turn.adopt(record);
    } else {
      turn = new Turn(record);
      if (at === -1) this.list.append(turn.userEl, turn.el);
      else this.order[at].userEl.before(turn.userEl, turn.el);
    }
    this.turns.set(record.id, turn);
    this.order.splice(at === -1 ? this.order.length : at, 0, turn);
    const pos = this.open.findIndex((t) => t.createdAt > record.createdAt);
    this.open.splice(pos === -1 ? this.open.length : pos, 0, turn);
  }

  turnFor(record) {
    const own = record.userMessageId && this.turns.get(record.userMessageId);
    if (own) return own;
    return this.open[0] || this.orphanTurn();
  }

  orphanTurn() {
    if (!this.orphan) {
      this.orphan = new Turn(null);
      this.list.append(this.orphan.el);
    }
    return this.orphan;
  }

  dropOrphan() {
    if (this.orphan && this.orphan.records === 0) this.orphan.remove();
    this.orphan = null;
  }

  /** The turn live events belong to. */
  live() {
    return this.open[0] || this.orphanTurn();
  }

  async handle(event) {
    if (this.closed) return undefined;
    const d = event.data;
    switch (event.type) {
      case 'Gap':
        return 'resync';
      case 'UserMessage': // another viewer's message (servers that announce them)
        if (d.id && Array.isArray(d.content)) this.addRecord({ ...d, type: 'user', conversationId: this.id });
        break;
      case 'StartReasoning':
      case 'StartResponse':
        this.live();
        break;
      case 'AppendText': // the hot path: drawn at the next frame, nothing else touched
        if (d.reasoning) this.live().appendReasoning(d.text || '');
        else this.live().appendText(d.text || '');
        this.draw(this.live());
        return undefined;
      case 'ToolCall':
        this.live().toolCall(d.callId, d.toolName, d.argsJson, false);
        break;
      case 'ToolResult':
        this.live().toolResult(d.callId, d.text, d.isError, false);
        break;
      case 'Error':
        this.live().error(d.message, d.code);
        break;
      case 'Interrupted':
        this.live().note('interrupted', 'Interrupted');
        break;
      case 'Truncated':
        this.live().note('truncated', 'Cut short: the reply reached the output limit');
        break;
      case 'ApprovalRequested':
        this.live().askApproval(d.callId, this.answer);
        break;
      case 'End':
        return this.turnEnded();
      default: // an event this page does not know (a newer server's, a plugin's)
        return undefined;
    }
    this.settle();
    this.scrollSoon();
    return undefined;
  }

  async turnEnded() {
    this.flush();
    try {
      await this.readHistory();
    } catch {
      return 'resync'; // the history is read again once the server answers
    }
    this.dropOrphan();
    for (const turn of this.open) turn.dropLive(); // their turns have not started
    this.settle();
    this.app.refreshStats(this);
    this.app.announce('Reply finished');
    return undefined;
  }

  /** Queued and running marks, and the stop button. */
  settle() {
    this.open.forEach((turn, i) => {
      turn.setQueued(i > 0);
      turn.setRunning(i === 0);
    });
    this.app.setRunning(this.running);
  }

  // --- drawing: at most once a frame, however fast the text comes ----------------------------

  draw(turn) {
    this.dirty.add(turn);
    this.scrollSoon();
  }

  /** At the next frame: draw what changed, then keep the newest text in view (when the
   * person has not scrolled up). One layout a frame, however many events came. */
  scrollSoon() {
    if (!this.frame) this.frame = requestAnimationFrame(() => this.flush());
  }

  flush() {
    cancelAnimationFrame(this.frame);
    this.frame = 0;
    if (this.dirty.size) {
      performance.mark('agentik:render-start');
      for (const turn of this.dirty) turn.render();
      this.dirty.clear();
      performance.measure('agentik:render', 'agentik:render-start');
    }
    if (this.app.pinnedToBottom()) this.app.scrollToBottom();
  }

  // --- actions ---------------------------------------------------------------------------------

  async send(parts) {
    const record = await this.api.request(
      'POST',
      `${this.path}/messages`,
      { content: parts },
      { headers: { 'Idempotency-Key': randomKey() }, retries: 3 },
    );
    this.addRecord(record);
    this.settle();
    this.app.scrollToBottom();
    return record;
  }

  async interrupt() {
    await this.api.request('POST', `${this.path}/interrupt`);
  }
}

function randomKey() {
  const bytes = crypto.getRandomValues(new Uint8Array(16)); // works outside secure contexts too
  return `web-${Array.from(bytes, (b) => b.toString(16).padStart(2, '0')).join('')}`;
}
