// The side panel: long-term memory notes (read, delete) and skills (read), when the server has
// those plugins on (their routes answer 404 otherwise, and the panel's button stays hidden).

import { h } from './dom.js';
import { renderMarkdown } from './markdown.js';

const CATEGORIES = ['user', 'world', 'preference'];
const PAGE = 50;

export class Panel {
  constructor(app, el, button) {
    this.app = app;
    this.api = app.api;
    this.el = el;
    this.button = button;
    this.category = 'user';
    this.memory = false;
    this.skills = false;
  }

  /** Find out which features the server has; show the button if any. */
  async probe() {
    const has = async (path) => {
      try {
        await this.api.get(path);
        return true;
      } catch (e) {
        if (e.status !== 404) this.app.toast(`Could not read ${path}: ${e.message}`);
        return false;
      }
    };
    [this.memory, this.skills] = await Promise.all([
      has('/memory/notes?category=user&limit=1'),
      has('/skills'),
    ]);
    this.button.hidden = !(this.memory || this.skills);
    this.button.addEventListener('click', () => this.toggle());
  }

  toggle(open = this.el.hidden) {
    this.el.hidden = !open;
    this.button.setAttribute('aria-expanded', String(open));
    if (open) this.render();
  }

  async render() {
    const close = h('button', { type: 'button', class: 'plain small', 'aria-label': 'Close the panel' }, 'Close');
    close.addEventListener('click', () => this.toggle(false));
    this.el.replaceChildren(h('div', { class: 'panel-head' }, h('h2', {}, 'Memory and skills'), close));
    if (this.memory) this.el.append(await this.notesSection());
    if (this.skills) this.el.append(await this.skillsSection());
  }

  async notesSection() {
    const list = h('ul', { class: 'notes-list' });
    const more = h('button', { type: 'button', class: 'plain', hidden: true }, 'More notes');
    const tabs = CATEGORIES.map((c) => {
      const tab = h('button', { type: 'button', class: 'small', 'aria-pressed': String(c === this.category) }, c);
      tab.addEventListener('click', () => {
        this.category = c;
        this.render();
      });
      return tab;
    });
    let offset = 0;
    const load = async () => {
      let page;
      try {
        page = await this.api.get(`/memory/notes?category=${this.category}&offset=${offset}&limit=${PAGE}`);
      } catch (e) {
        this.app.toast(`Could not read the notes: ${e.message}`);
        return;
      }
      offset += page.items.length;
      list.append(...page.items.map((note) => this.noteItem(note)));
      more.hidden = !page.hasMore;
      if (!list.children.length) list.append(h('li', { class: 'muted' }, 'No notes.'));
    };
    more.addEventListener('click', load);
    await load();
    return h('section', { 'aria-label': 'Memory notes' }, h('h3', {}, 'Notes'), h('div', { class: 'tabs', role: 'group', 'aria-label': 'Category' }, tabs), list, more);
  }

  noteItem(note) {
    const del = h('button', { type: 'button', class: 'small', 'aria-label': `Delete the note: ${note.text.slice(0, 60)}` }, 'Delete');
    const item = h(
      'li',
      { class: 'note-item', 'data-id': note.id },
      h('div', { class: 'note-text' }, note.text),
      h('div', { class: 'note-meta' }, `${note.source.toLowerCase()} · ${new Date(note.createdAt).toLocaleDateString()} · used ${note.uses}×`, ' ', del),
    );
    del.addEventListener('click', async () => {
      if (!confirm('Delete this note? (It is archived, and can be restored from the memory folder.)')) return;
      try {
        await this.api.request('DELETE', `/memory/notes/${encodeURIComponent(note.id)}`);
        item.remove();
      } catch (e) {
        if (e.status === 404) item.remove();
        else this.app.toast(`Not deleted: ${e.message}`);
      }
    });
    return item;
  }

  async skillsSection() {
    let skills = [];
    try {
      skills = (await this.api.get('/skills')).items;
    } catch (e) {
      this.app.toast(`Could not read the skills: ${e.message}`);
    }
    const list = h('ul', { class: 'skills-list' });
    for (const skill of skills) {
      const body = h('div', { class: 'md' });
      const details = h('details', {}, h('summary', {}, h('strong', {}, skill.name), ` — ${skill.description}`), body);
      details.addEventListener('toggle', async () => {
        if (!details.open || body.childNodes.length) return;
        try {
          const full = await this.api.get(`/skills/${encodeURIComponent(skill.name)}`);
          body.replaceChildren(renderMarkdown(full.body || '')); // skills may be model-written
        } catch (e) {
          body.replaceChildren(h('p', { class: 'muted' }, e.message));
        }
      });
      list.append(h('li', {}, details));
    }
    if (!skills.length) list.append(h('li', { class: 'muted' }, 'No skills.'));
    return h('section', { 'aria-label': 'Skills' }, h('h3', {}, 'Skills'), list);
  }
}
