// One user message and what the agent did about it: the records of the history (tool calls,
// the reply or the error) and, while the turn runs, what the event stream says. History is the
// truth: when a turn ends its live rendering is replaced by its records.

import { h, clear } from './dom.js';
import { renderMarkdown, StreamingMarkdown } from './markdown.js';

const IMAGE_TYPES = new Set(['image/png', 'image/jpeg', 'image/gif', 'image/webp']);
const ERROR_HINTS = {
  restart: 'The server restarted while this reply was being written.',
  cancelled: 'This message was taken out of the queue before it ran.',
};

export function contextBadge(context) {
  if (!context || !context.origin || context.origin === 'user') return null;
  const where = context.sourceId ? ` (sourceId=${context.sourceId})` : '';
  return h('span', { class: 'badge context' }, `[${context.origin.toUpperCase()}] ${context.description || ''}${where}`);
}

function imagePart(part) {
  if (part.data && IMAGE_TYPES.has(part.mimeType) && /^[A-Za-z0-9+/=\s]*$/.test(part.data)) {
    return h('img', { class: 'attachment', alt: 'attached image', src: `data:${part.mimeType};base64,${part.data}` });
  }
  return h('span', { class: 'badge' }, part.url ? `image: ${part.url}` : 'image');
}

function time(iso) {
  const d = new Date(iso);
  return Number.isNaN(d.getTime()) ? '' : d.toLocaleString();
}

export class Turn {
  /** user: the user record, or null for a turn whose message this page has not seen. */
  constructor(user) {
    this.userId = user ? user.id : null;
    this.createdAt = user ? user.createdAt : '';
    this.userEl = user ? this.renderUser(user) : null;
    this.reasoningEl = h('div');
    this.toolsEl = h('div', { class: 'tools' });
    this.replyEl = h('div', { class: 'reply md' });
    this.notesEl = h('div', { class: 'notes' });
    this.el = h('section', { class: 'turn', 'aria-label': 'reply' }, this.reasoningEl, this.toolsEl, this.replyEl, this.notesEl);
    this.tools = new Map(); // callId -> {el, resultEl, recorded}
    this.text = '';
    this.reasoning = '';
    this.stream = null;
    this.reasoningStream = null;
    this.closed = false;
    this.records = 0;
  }

  renderUser(user) {
    const parts = (user.content || []).map((part) =>
      part.type === 'text' ? h('div', { class: 'text' }, part.body || '') : part.type === 'image' ? imagePart(part) : null,
    );
    this.queuedEl = h('span', { class: 'badge queued', hidden: true }, 'queued');
    return h(
      'article',
      { class: 'msg user', 'data-id': user.id, title: time(user.createdAt) },
      h('div', { class: 'bubble' }, contextBadge(user.context), parts, this.queuedEl),
    );
  }

  /** Give this turn (live so far, no message) the user message it answers. */
  adopt(user) {
    this.userId = user.id;
    this.createdAt = user.createdAt;
    this.userEl = this.renderUser(user);
    this.el.before(this.userEl);
  }

  remove() {
    if (this.userEl) this.userEl.remove();
    this.el.remove();
  }

  setQueued(queued) {
    if (this.queuedEl && this.queuedEl.hidden === queued) this.queuedEl.hidden = !queued;
  }

  setRunning(running) {
    const now = running && !this.closed;
    if (this.running === now) return;
    this.running = now;
    this.el.setAttribute('aria-busy', now ? 'true' : 'false');
    this.el.classList.toggle('running', now);
  }

  // --- live events -------------------------------------------------------------------------

  appendReasoning(text) {
    if (!this.reasoningStream) {
      const body = h('div', { class: 'md' });
      this.reasoningEl.replaceChildren(h('details', { class: 'reasoning' }, h('summary', {}, 'Reasoning'), body));
      this.reasoningStream = new StreamingMarkdown(body);
    }
    this.reasoning += text;
  }

  appendText(text) {
    if (!this.stream) this.stream = new StreamingMarkdown(clear(this.replyEl));
    this.text += text;
  }

  /** Draw what arrived since the last frame. */
  render() {
    if (this.stream && !this.closed) this.stream.update(this.text);
    if (this.reasoningStream) this.reasoningStream.update(this.reasoning);
  }

  toolCall(callId, name, argsJson, recorded) {
    const known = this.tools.get(callId);
    if (known) {
      known.recorded ||= recorded;
      return;
    }
    let args = argsJson || '';
    try {
      args = JSON.stringify(JSON.parse(args), null, 2);
    } catch {
      // not JSON: shown as it came
    }
    const status = h('span', { class: 'tool-status' }, 'running…');
    const resultEl = h('div', { class: 'tool-result' });
    const el = h(
      'details',
      { class: 'tool', 'data-call': callId },
      h('summary', {}, h('span', { class: 'tool-name' }, name), ' ', status),
      h('div', { class: 'tool-label' }, 'Arguments'),
      h('pre', { class: 'tool-args' }, args),
      resultEl,
    );
    this.toolsEl.append(el);
    this.tools.set(callId, { el, name, status, resultEl, recorded, done: false, approval: null });
  }

  /** A call waiting for a person (docs/approvals.md): Approve, Deny and Edit under its
   * arguments. answer(callId, body) posts the answer and resolves to the server's reply. */
  askApproval(callId, answer) {
    const entry = this.tools.get(callId);
    if (!entry || entry.done || entry.approval || this.closed) return;
    const argsEl = entry.el.querySelector('.tool-args');
    const editor = h('textarea', { class: 'approval-args', 'aria-label': 'Arguments to approve', hidden: true });
    const note = h('input', { class: 'approval-note', type: 'text', placeholder: 'Note for the model (optional)', 'aria-label': 'Note' });
    const problem = h('div', { class: 'approval-error', role: 'alert' });
    const send = async (approve) => {
      const body = { approve };
      if (note.value.trim()) body.note = note.value.trim();
      if (approve && !editor.hidden) {
        try {
          body.args = JSON.parse(editor.value);
        } catch {
          problem.textContent = 'The arguments are not valid JSON.';
          return;
        }
      }
      buttons.forEach((b) => (b.disabled = true));
      try {
        await answer(callId, body);
        this.approvalAnswered(callId, approve ? 'approved' : 'denied');
      } catch (e) {
        if (e.status === 409) this.approvalAnswered(callId, 'answered');
        else problem.textContent = e.message || 'The answer was not taken.';
      } finally {
        buttons.forEach((b) => (b.disabled = false));
      }
    };
    const edit = () => {
      editor.value = argsEl.textContent;
      editor.hidden = false;
      argsEl.hidden = true;
      editor.focus();
    };
    const buttons = [
      h('button', { type: 'button', class: 'primary small approve', onclick: () => send(true) }, 'Approve'),
      h('button', { type: 'button', class: 'danger small deny', onclick: () => send(false) }, 'Deny'),
      h('button', { type: 'button', class: 'small edit', onclick: edit }, 'Edit'),
    ];
    entry.approval = h('div', { class: 'approval', role: 'group', 'aria-label': `Approve ${entry.name}?` }, editor, note, h('div', { class: 'approval-buttons' }, buttons), problem);
    argsEl.after(entry.approval);
    entry.status.textContent = 'waiting for your approval';
    entry.el.classList.add('waiting');
    entry.el.open = true;
  }

  /** The call's approval was answered (here, by another viewer, or by the timeout). */
  approvalAnswered(callId, status) {
    const entry = this.tools.get(callId);
    if (!entry) return;
    if (entry.approval) {
      entry.approval.remove();
      entry.approval = null;
      entry.el.querySelector('.tool-args').hidden = false;
    }
    entry.el.classList.remove('waiting');
    if (!entry.done) entry.status.textContent = status === 'denied' ? 'denied' : 'running…';
  }

  toolResult(callId, text, isError, recorded) {
    let entry = this.tools.get(callId);
    if (!entry) {
      this.toolCall(callId, '(tool)', '', recorded);
      entry = this.tools.get(callId);
    }
    entry.recorded ||= recorded;
    if (entry.done) return;
    this.approvalAnswered(callId, 'answered');
    entry.done = true;
    entry.status.textContent = isError ? 'failed' : 'done';
    entry.el.classList.toggle('failed', Boolean(isError));
    entry.resultEl.replaceChildren(h('div', { class: 'tool-label' }, 'Result'), h('pre', {}, text || ''));
  }

  note(kind, text) {
    if (this.notesEl.querySelector(`[data-kind="${kind}"]`)) return;
    const role = kind === 'error' ? 'alert' : null;
    this.notesEl.append(h('div', { class: `note ${kind}`, 'data-kind': kind, role }, text));
  }

  error(message, code) {
    const hint = ERROR_HINTS[code];
    this.note('error', `Error${code ? ` (${code})` : ''}: ${hint || message}`);
  }

  /** Forget what the events said (they are being read again, or history says more). */
  dropLive() {
    if (this.closed) return;
    for (const [callId, entry] of this.tools) {
      if (!entry.recorded) {
        entry.el.remove();
        this.tools.delete(callId);
      }
    }
    this.text = '';
    this.stream = null;
    this.replyEl.replaceChildren();
    this.notesEl.replaceChildren();
  }

  // --- records -----------------------------------------------------------------------------

  /** The turn's last record: an assistant reply or an error. */
  finish(record) {
    this.closed = true;
    this.records += 1;
    this.setRunning(false);
    this.setQueued(false);
    for (const [callId, entry] of this.tools) {
      if (!entry.recorded) {
        entry.el.remove();
        this.tools.delete(callId);
      }
    }
    this.stream = null;
    if (this.reasoningStream) this.reasoningStream.update(this.reasoning);
    this.notesEl.replaceChildren();
    const text = record.type === 'assistant' ? record.text || '' : record.partialText || '';
    this.replyEl.replaceChildren(renderMarkdown(text));
    if (record.type === 'error') this.error(record.message, record.code);
    if (record.interrupted) this.note('interrupted', 'Interrupted');
    if (record.truncated) this.note('truncated', 'Cut short: the reply reached the output limit');
    const tokens = record.tokens;
    if (tokens && (tokens.input !== null || tokens.output !== null)) {
      const approx = tokens.estimated ? '~' : '';
      this.notesEl.append(
        h('div', { class: 'note tokens' }, `${approx}${tokens.input ?? '?'} in · ${approx}${tokens.output ?? '?'} out`),
      );
    }
  }

}

/** A summary record: context compaction replaced the turns before it. */
export function summaryElement(record) {
  return h(
    'details',
    { class: 'summary' },
    h('summary', {}, 'Earlier turns were summarised for the model'),
    h('div', { class: 'md' }, renderMarkdown(record.text || '')),
  );
}
