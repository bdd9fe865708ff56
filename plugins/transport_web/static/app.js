// The page: the conversation list, the open conversation, the message box, the key prompt.
// Everything goes through the agent's own API (api.js); nothing here is private to the server.

import { Api } from './api.js';
import { h } from './dom.js';
import { EventStream } from './sse.js';
import { ConversationView } from './conversation.js';
import { Panel } from './panel.js';

const $ = (id) => document.getElementById(id);
const PAGE = 30;
const MAX_BODY = 1000000; // the server takes 1 MiB a request; base64 makes images 4/3 bigger
const IMAGE_TYPES = ['image/png', 'image/jpeg', 'image/gif', 'image/webp'];
const THEME_STORE = 'agentik.theme';

class App {
  constructor() {
    this.api = new Api((refused) => this.askKey(refused));
    this.messagesEl = $('messages');
    this.input = $('composer-text');
    this.view = null;
    this.info = null;
    this.shown = PAGE;
    this.images = [];
    this.listTimer = 0;
  }

  async start() {
    this.bind();
    this.applyTheme(localStorage.getItem(THEME_STORE));
    await this.refreshList();
    this.agentStream = new EventStream(this.api, '/events', {
      onOpen: (_start, fresh) => (fresh ? this.refreshList() : null),
      onEvent: (event) => this.agentEvent(event),
    }).start();
    await this.route();
    window.addEventListener('hashchange', () => this.route());
    this.panel = new Panel(this, $('panel'), $('panel-button'));
    await this.panel.probe();

    performance.mark('agentik:ready'); // the list is shown and the page takes input
  }

  bind() {
    $('new-chat').addEventListener('click', () => this.newConversation());
    $('more').addEventListener('click', () => {
      this.shown += PAGE;
      this.refreshList();
    });
    $('composer').addEventListener('submit', (e) => {
      e.preventDefault();
      this.submit();
    });
    this.input.addEventListener('keydown', (e) => {
      if (e.key === 'Enter' && !e.shiftKey && !e.isComposing) {
        e.preventDefault();
        this.submit();
      }
    });
    this.input.addEventListener('input', () => this.fitInput());
    this.input.addEventListener('paste', (e) => this.takeFiles(e.clipboardData && e.clipboardData.files, e));
    const composer = $('composer');
    composer.addEventListener('dragover', (e) => e.preventDefault());
    composer.addEventListener('drop', (e) => this.takeFiles(e.dataTransfer && e.dataTransfer.files, e));
    $('attach').addEventListener('click', () => $('file').click());
    $('file').addEventListener('change', (e) => {
      this.takeFiles(e.target.files);
      e.target.value = '';
    });
    $('stop').addEventListener('click', () => this.stop());
    document.addEventListener('keydown', (e) => {
      if (e.key === 'Escape' && !e.defaultPrevented && this.view && this.view.running && !$('key-dialog').open) {
        this.stop();
      }
    });
    $('theme').addEventListener('click', () => {
      const dark = document.documentElement.dataset.theme
        ? document.documentElement.dataset.theme === 'dark'
        : matchMedia('(prefers-color-scheme: dark)').matches;
      const next = dark ? 'light' : 'dark';
      localStorage.setItem(THEME_STORE, next);
      this.applyTheme(next);
    });
    $('menu').addEventListener('click', () => this.toggleNav());
    $('scrim').addEventListener('click', () => this.toggleNav(false));
    // a page kept in the back/forward cache would keep its streams open (browsers allow 6
    // connections to a host): close them when leaving, start afresh when shown again
    window.addEventListener('pagehide', () => {
      if (this.agentStream) this.agentStream.close();
      if (this.view) this.view.close();
    });
    window.addEventListener('pageshow', (e) => e.persisted && location.reload());
    $('key-dialog').addEventListener('cancel', (e) => e.preventDefault()); // a key is needed
    this.messagesEl.addEventListener('scroll', () => {
      const el = this.messagesEl;
      this.pinned = el.scrollTop + el.clientHeight >= el.scrollHeight - 48;
    });
    this.pinned = true;
  }

  applyTheme(theme) {
    if (theme === 'light' || theme === 'dark') document.documentElement.dataset.theme = theme;
  }

  toggleNav(open = !document.body.classList.contains('nav-open')) {
    document.body.classList.toggle('nav-open', open);
    $('menu').setAttribute('aria-expanded', String(open));
  }

  async route() {
    const wanted = decodeURIComponent(location.hash.slice(1));
    if (wanted && (!this.view || this.view.id !== wanted)) await this.openConversation(wanted);
    else if (!wanted) this.showEmpty();
  }

  // --- the key ---------------------------------------------------------------------------------

  askKey(refused) {
    const dialog = $('key-dialog');
    $('key-message').textContent = refused
      ? 'That key was refused. Enter a valid API key.'
      : 'This agent needs an API key (AGENTIK_API_KEY on the server).';
    $('key-input').value = '';
    dialog.showModal();
    $('key-input').focus();
    return new Promise((resolve) => {
      $('key-form').onsubmit = (e) => {
        e.preventDefault();
        const key = $('key-input').value.trim();
        if (!key) return;
        dialog.close();
        resolve(key);
      };
    });
  }

  // --- the conversation list ---------------------------------------------------------------------

  async refreshList() {
    if (this.renaming) return; // not under the person's cursor: refreshed when the rename ends
    let page;
    try {
      page = await this.api.get(`/conversations?offset=0&limit=${Math.min(this.shown, 200)}`);
    } catch (e) {
      this.toast(`Could not list the conversations: ${e.message}`);
      return;
    }
    const list = $('conversations');
    list.replaceChildren(...page.items.map((c) => this.listItem(c)));
    $('more').hidden = !page.hasMore;
    $('empty-list').hidden = page.items.length > 0;
  }

  listItem(conv) {
    const current = this.view && this.view.id === conv.id;
    const title = conv.title || 'Untitled';
    const open = h(
      'button',
      { type: 'button', class: 'open', 'aria-current': current ? 'page' : null, title: conv.id },
      h('span', { class: 'conv-title' }, title),
      h('span', { class: 'when' }, conv.busy ? 'replying…' : ago(conv.updatedAt)),
    );
    open.addEventListener('click', () => {
      location.hash = encodeURIComponent(conv.id);
      this.toggleNav(false);
    });
    const rename = h('button', { type: 'button', class: 'small', 'aria-label': `Rename ${title}` }, 'Rename');
    const del = h('button', { type: 'button', class: 'small', 'aria-label': `Delete ${title}` }, 'Delete');
    const actions = h('span', { class: 'actions' }, rename, del);
    const item = h('li', { class: `conv${conv.busy ? ' busy' : ''}`, 'data-id': conv.id }, open, actions);
    rename.addEventListener('click', () => this.rename(item, conv));
    del.addEventListener('click', () => this.remove(conv));
    return item;
  }

  rename(item, conv) {
    const input = h('input', { type: 'text', class: 'rename', 'aria-label': 'New title', maxlength: 1000 });
    input.value = conv.title || '';
    const form = h('form', { class: 'rename-form' }, input);
    item.replaceChildren(form);
    this.renaming = true;
    input.focus();
    input.select();
    let done = false;
    const finish = async (save) => {
      if (done) return;
      done = true;
      this.renaming = false;
      if (save) {
        const title = input.value.trim() || null;
        try {
          const info = await this.api.request('PATCH', `/conversations/${encodeURIComponent(conv.id)}`, { title });
          if (this.view && this.view.id === conv.id) this.conversationInfo(info);
        } catch (e) {
          this.toast(`Not renamed: ${e.message}`);
        }
      }
      this.refreshList();
    };
    form.addEventListener('submit', (e) => {
      e.preventDefault();
      finish(true);
    });
    input.addEventListener('keydown', (e) => {
      if (e.key === 'Escape') {
        e.preventDefault();
        finish(false);
      }
    });
    input.addEventListener('blur', () => finish(true));
  }

  async remove(conv) {
    if (!confirm(`Delete “${conv.title || 'Untitled'}” and its history?`)) return;
    try {
      await this.api.request('DELETE', `/conversations/${encodeURIComponent(conv.id)}`);
    } catch (e) {
      if (e.status !== 404) this.toast(`Not deleted: ${e.message}`);
    }
    if (this.view && this.view.id === conv.id) location.hash = '';
    this.refreshList();
  }

  agentEvent(event) {
    if (event.type === 'Gap') return 'resync';
    const id = event.data.conversationId;
    if (!id) return undefined; // an event this page does not know
    clearTimeout(this.listTimer);
    this.listTimer = setTimeout(() => this.refreshList(), 150);
    if (this.view && this.view.id === id) {
      if (event.type === 'ConversationDeleted') {
        this.toast('This conversation was deleted.');
        location.hash = '';
      } else if (event.type === 'ConversationUpdated') {
        this.api.get(this.view.path).then((info) => this.conversationInfo(info), () => {});
      }
    }
    return undefined;
  }

  async newConversation() {
    try {
      const info = await this.api.request('POST', '/conversations', {});
      await this.openConversation(info.id, info);
      history.replaceState(null, '', `#${encodeURIComponent(info.id)}`);
      this.refreshList();
      this.toggleNav(false);
      this.input.focus();
      return info;
    } catch (e) {
      this.toast(`Could not create a conversation: ${e.message}`);
      throw e;
    }
  }

  // --- the open conversation ---------------------------------------------------------------------

  async openConversation(id, known = null) {
    if (this.view) this.view.close();
    this.view = null;
    let info = known;
    try {
      info = info || (await this.api.get(`/conversations/${encodeURIComponent(id)}`));
    } catch (e) {
      this.toast(e.status === 404 ? `No conversation ${id}` : `Could not open it: ${e.message}`);
      history.replaceState(null, '', location.pathname);
      this.showEmpty();
      return;
    }
    $('empty').hidden = true;
    this.pinned = true;
    this.view = new ConversationView(this, info).start();
    this.conversationInfo(info);
    for (const item of document.querySelectorAll('#conversations .open')) {
      const current = item.closest('li').dataset.id === id;
      if (current) item.setAttribute('aria-current', 'page');
      else item.removeAttribute('aria-current');
    }
    this.input.focus();
  }

  showEmpty() {
    if (this.view) this.view.close();
    this.view = null;
    this.info = null;
    this.messagesEl.replaceChildren();
    $('empty').hidden = false;
    $('title').textContent = 'agentik';
    $('stats').textContent = '';
    $('attach').hidden = true;
    this.setRunning(false);
    this.connection('open');
  }

  conversationInfo(info) {
    if (!this.view || this.view.id !== info.id) return;
    this.info = info;
    $('title').textContent = info.title || 'Untitled';
    document.title = `${info.title || 'Untitled'} · agentik`;
    $('attach').hidden = !info.supportsImageInput;
  }

  async refreshStats(view) {
    try {
      const s = await this.api.get(`${view.path}/stats`);
      if (this.view !== view) return;
      const context = s.contextTokens ? ` · context ${s.contextTokens.toLocaleString()}` : '';
      $('stats').textContent =
        `${s.turns} turn${s.turns === 1 ? '' : 's'} · ${s.input.toLocaleString()} in · ` +
        `${s.output.toLocaleString()} out${context}`;
    } catch {
      // the stats are a nicety: the conversation works without them
    }
  }

  setRunning(running) {
    if ($('stop').hidden === running) $('stop').hidden = !running;
  }

  async stop() {
    if (!this.view) return;
    try {
      await this.view.interrupt();
    } catch (e) {
      this.toast(`Could not stop it: ${e.message}`);
    }
  }

  connection(state, detail, source) {
    if (source && source !== this.view) return;
    const banner = $('connection');
    clearTimeout(this.bannerTimer);
    if (state === 'reconnecting') {
      banner.textContent = `Connection lost: reconnecting (try ${detail.attempt})…`;
      banner.className = 'connection lost';
      banner.hidden = false;
      this.lost = true;
    } else if (state === 'gone') {
      banner.textContent = 'This conversation no longer exists.';
      banner.className = 'connection lost';
      banner.hidden = false;
    } else if (this.lost) {
      this.lost = false;
      banner.textContent = 'Reconnected.';
      banner.className = 'connection back';
      this.bannerTimer = setTimeout(() => (banner.hidden = true), 2500);
    } else {
      banner.hidden = true;
    }
  }

  // --- the message box ------------------------------------------------------------------------------

  fitInput() {
    this.input.style.height = 'auto';
    this.input.style.height = `${Math.min(this.input.scrollHeight, 240)}px`;
    this.input.style.overflowY = this.input.scrollHeight > 240 ? 'auto' : 'hidden';
  }

  async submit() {
    const text = this.input.value;
    const images = this.images;
    if (!text.trim() && !images.length) return;
    const parts = [];
    if (text.trim()) parts.push({ type: 'text', body: text });
    for (const image of images) parts.push({ type: 'image', mimeType: image.type, data: image.data });
    if (JSON.stringify({ content: parts }).length > MAX_BODY) {
      this.toast('Too large to send: the server takes 1 MB a message (attach smaller images).');
      return;
    }
    this.input.value = '';
    this.setImages([]);
    this.fitInput();
    try {
      if (!this.view) await this.newConversation();
      await this.view.send(parts);
    } catch (e) {
      if (!this.input.value) this.input.value = text; // nothing typed is lost
      this.setImages(images);
      this.toast(`Not sent: ${e.message}`);
    }
  }

  takeFiles(files, event) {
    const images = Array.from(files || []).filter((f) => IMAGE_TYPES.includes(f.type));
    if (!images.length) return;
    if (event) event.preventDefault();
    if (!this.info || !this.info.supportsImageInput) {
      this.toast('This model does not take images.');
      return;
    }
    for (const file of images) {
      const reader = new FileReader();
      reader.onload = () => {
        const data = String(reader.result).split(',', 2)[1] || '';
        this.setImages([...this.images, { type: file.type, data, name: file.name, url: URL.createObjectURL(file) }]);
      };
      reader.readAsDataURL(file);
    }
  }

  setImages(images) {
    for (const old of this.images) if (!images.includes(old)) URL.revokeObjectURL(old.url);
    this.images = images;
    $('attachments').replaceChildren(
      ...images.map((image) => {
        const remove = h('button', { type: 'button', class: 'small', 'aria-label': `Remove ${image.name || 'image'}` }, '×');
        remove.addEventListener('click', () => this.setImages(this.images.filter((i) => i !== image)));
        return h('div', { class: 'thumb' }, h('img', { src: image.url, alt: image.name || 'image to send' }), remove);
      }),
    );
  }

  // --- feedback --------------------------------------------------------------------------------------

  toast(text) {
    const el = h('div', { class: 'toast' }, text);
    $('toasts').append(el);
    setTimeout(() => el.remove(), 6000);
  }

  announce(text) {
    $('announcer').textContent = text;
  }

  pinnedToBottom() {
    return this.pinned;
  }

  scrollToBottom() {
    this.messagesEl.scrollTop = this.messagesEl.scrollHeight;
    this.pinned = true;
  }
}

function ago(iso) {
  const seconds = (Date.now() - new Date(iso).getTime()) / 1000;
  if (!Number.isFinite(seconds)) return '';
  const format = new Intl.RelativeTimeFormat(undefined, { numeric: 'auto' });
  for (const [unit, size] of [['day', 86400], ['hour', 3600], ['minute', 60]]) {
    if (Math.abs(seconds) >= size) return format.format(-Math.round(seconds / size), unit);
  }
  return 'just now';
}

window.agentikApp = new App();
window.agentikApp.start();
