// A small Markdown renderer for untrusted text (model output). The source is never handed to
// the HTML parser: every element is made with createElement and every piece of text is a text
// node, so `<script>`, `<img onerror=…>` or raw HTML show as the characters they are. Links
// are kept only for http(s) and mailto URLs; images are shown as links (never loaded).
//
// Supported: headings, paragraphs, fenced code (with a copy button), lists (nested by
// indentation), block quotes, tables, rules; inline code, bold, italic, strike-through, links,
// bare URLs. A text is rendered segment by segment (segments end at blank lines outside code
// fences), which lets a streaming reply re-render only its last segment each frame.

import { h, copyText } from './dom.js';

const FENCE = /^ {0,3}(`{3,}|~{3,})\s*([^`\s]*)[^`]*$/;
const HEADING = /^ {0,3}(#{1,6})\s+(.*?)\s*#*\s*$/;
const RULE = /^ {0,3}([-*_])(?:\s*\1){2,}\s*$/;
const QUOTE = /^ {0,3}>\s?(.*)$/;
const ITEM = /^(\s*)([-*+]|\d{1,9}[.)])\s+(.*)$/;
const TABLE_SEP = /^\s*\|?\s*:?-+:?\s*(\|\s*:?-+:?\s*)*\|?\s*$/;
const SAFE_URL = /^(https?:\/\/|mailto:)/i;
const MAX_NESTING = 12; // deeper quotes, lists, emphasis are shown as text: no recursion to exhaust

// does this fence line (FENCE's match) close a block opened by `fence`?
function closes(m, fence) {
  return Boolean(m) && m[1][0] === fence[0] && m[1].length >= fence.length && !m[2];
}

// The offset after a blank line outside code fences (a segment's end), scanning from `from` (a
// segment boundary): the first one, or the last one (`last`: the finished part of a growing
// text). Without one: the end of the text, or `from` when looking for the last.
function segmentEnd(text, from, last) {
  let fence = null;
  let cut = from;
  for (let pos = from; pos < text.length; ) {
    const nl = text.indexOf('\n', pos);
    if (nl === -1) break; // the last line is still being written
    const line = text.slice(pos, nl);
    const m = FENCE.exec(line);
    if (fence) {
      if (closes(m, fence)) fence = null;
    } else if (m) {
      fence = m[1];
    } else if (!line.trim()) {
      cut = nl + 1;
      if (!last) return cut;
    }
    pos = nl + 1;
  }
  return last ? cut : text.length;
}

/** Where the finished segments of a growing `text` end, scanning from `from`. */
export function stableEnd(text, from = 0) {
  return segmentEnd(text, from, true);
}

function nextSegmentEnd(text, from) {
  return segmentEnd(text, from, false);
}

/** The whole text as a fragment. */
export function renderMarkdown(text) {
  const frag = document.createDocumentFragment();
  for (let from = 0; from < text.length; ) {
    const end = nextSegmentEnd(text, from);
    frag.append(renderBlocks(text.slice(from, end)));
    from = end;
  }
  return frag;
}

/** Renders a growing text into `el`: finished segments are rendered once, the last one again
 * at each update. The result is the same DOM as renderMarkdown of the final text, but for a
 * code block still being written: its new lines are appended as blocks of their own, so the
 * browser lays out only them (a long file streamed into one block stays smooth). */
export class StreamingMarkdown {
  constructor(el) {
    this.el = el;
    this.done = 0; // characters rendered into finished segments
    this.tail = h('div', { class: 'md-tail' });
    this.open = null; // the tail's unclosed code block: {code, partial, start, length}
    el.append(this.tail);
  }

  update(text) {
    if (text.length < this.done) this.reset();
    const cut = stableEnd(text, this.done);
    if (cut > this.done) this.open = null;
    while (this.done < cut) {
      const end = nextSegmentEnd(text, this.done);
      this.tail.before(renderBlocks(text.slice(this.done, end)));
      this.done = end;
    }
    const tail = text.slice(this.done);
    if (this.open && this.growCode(tail)) return;
    this.tail.replaceChildren(renderBlocks(tail));
    this.open = this.openCode(tail);
  }

  reset() {
    this.el.replaceChildren(this.tail);
    this.done = 0;
    this.open = null;
  }

  // the tail is one code block without its closing fence: hold its lines in chunks
  openCode(tail) {
    const first = tail.indexOf('\n');
    if (first === -1 || !FENCE.test(tail.slice(0, first))) return null;
    const body = tail.slice(first + 1);
    if (closesFence(body, FENCE.exec(tail.slice(0, first))[1])) return null;
    const code = this.tail.querySelector('pre code');
    if (!code || this.tail.children.length !== 1) return null;
    const nl = body.lastIndexOf('\n') + 1;
    const partial = document.createTextNode(body.slice(nl));
    code.replaceChildren(h('span', { class: 'chunk' }, body.slice(0, nl)), partial);
    const fence = FENCE.exec(tail.slice(0, first))[1];
    return { code, partial, fence, start: first + 1 + nl, length: tail.length };
  }

  growCode(tail) {
    const open = this.open;
    if (tail.length < open.length) return false;
    const region = tail.slice(open.start); // the unfinished line and what came after it
    if (closesFence(region, open.fence)) return false;
    const nl = region.lastIndexOf('\n') + 1;
    if (nl) open.code.insertBefore(h('span', { class: 'chunk' }, region.slice(0, nl)), open.partial);
    open.partial.data = region.slice(nl);
    open.start += nl;
    open.length = tail.length;
    return true;
  }
}

function closesFence(body, fence) {
  return body.split('\n').some((line) => closes(FENCE.exec(line), fence));
}

/** Block elements of one piece of text (`depth`: how deep in quotes and lists it is). */
export function renderBlocks(text, depth = 0) {
  const frag = document.createDocumentFragment();
  if (depth > MAX_NESTING) {
    frag.append(h('p', {}, text)); // deeper nesting is shown as it is
    return frag;
  }
  const lines = text.replace(/\r\n?/g, '\n').split('\n');
  let i = 0;
  while (i < lines.length) {
    const line = lines[i];
    if (!line.trim()) {
      i += 1;
      continue;
    }
    let m = FENCE.exec(line);
    if (m) {
      const body = [];
      i += 1;
      while (i < lines.length) {
        if (closes(FENCE.exec(lines[i]), m[1])) {
          i += 1;
          break;
        }
        body.push(lines[i]);
        i += 1;
      }
      frag.append(codeBlock(body.join('\n'), m[2]));
      continue;
    }
    m = HEADING.exec(line);
    if (m) {
      frag.append(h(`h${m[1].length}`, {}, inline(m[2])));
      i += 1;
      continue;
    }
    if (RULE.test(line)) {
      frag.append(h('hr'));
      i += 1;
      continue;
    }
    if (QUOTE.test(line)) {
      const body = [];
      while (i < lines.length && lines[i].trim() && (m = QUOTE.exec(lines[i]))) {
        body.push(m[1]);
        i += 1;
      }
      frag.append(h('blockquote', {}, renderBlocks(body.join('\n'), depth + 1)));
      continue;
    }
    if (ITEM.test(line)) {
      i = list(lines, i, frag, depth);
      continue;
    }
    if (line.includes('|') && i + 1 < lines.length && TABLE_SEP.test(lines[i + 1])) {
      i = table(lines, i, frag);
      continue;
    }
    const para = [];
    while (i < lines.length && lines[i].trim() && !startsBlock(lines, i)) {
      para.push(lines[i].trim());
      i += 1;
    }
    if (!para.length) {
      para.push(lines[i].trim()); // a line no block took (cannot loop forever)
      i += 1;
    }
    frag.append(h('p', {}, inline(para.join('\n'))));
  }
  return frag;
}

function startsBlock(lines, i) {
  const line = lines[i];
  return (
    FENCE.test(line) ||
    HEADING.test(line) ||
    RULE.test(line) ||
    QUOTE.test(line) ||
    ITEM.test(line) ||
    (line.includes('|') && i + 1 < lines.length && TABLE_SEP.test(lines[i + 1]))
  );
}

function codeBlock(code, lang) {
  const codeEl = h('code', {}, code);
  const button = h('button', { type: 'button', class: 'copy', 'aria-label': 'Copy code' }, 'Copy');
  button.addEventListener('click', async () => {
    const ok = await copyText(codeEl.textContent);
    button.textContent = ok ? 'Copied' : 'Copy failed';
    setTimeout(() => (button.textContent = 'Copy'), 1500);
  });
  const label = lang ? h('span', { class: 'lang' }, lang.slice(0, 40)) : h('span');
  return h('div', { class: 'code' }, h('div', { class: 'code-head' }, label, button), h('pre', {}, codeEl));
}

function list(lines, i, frag, depth) {
  const first = ITEM.exec(lines[i]);
  const indent = first[1].length;
  const ordered = /\d/.test(first[2]);
  const el = h(ordered ? 'ol' : 'ul');
  if (ordered && parseInt(first[2], 10) !== 1) el.setAttribute('start', String(parseInt(first[2], 10)));
  while (i < lines.length) {
    const m = ITEM.exec(lines[i]);
    if (!m || m[1].length !== indent || /\d/.test(m[2]) !== ordered) break;
    const body = [m[3]];
    i += 1;
    // continuation lines: indented deeper than the marker (nested lists included)
    while (i < lines.length && lines[i].trim()) {
      const deeper = /^(\s*)/.exec(lines[i])[1].length > indent;
      if (!deeper && (ITEM.test(lines[i]) || startsBlock(lines, i))) break;
      body.push(deeper ? lines[i].slice(Math.min(indent + 2, /^(\s*)/.exec(lines[i])[1].length)) : lines[i]);
      i += 1;
    }
    const li = h('li');
    const rest = body.slice(1).join('\n');
    li.append(inline(body[0]));
    if (rest.trim()) {
      // nested blocks: lists, code; plain continuation lines join the item's text
      const nested = renderBlocks(rest, depth + 1);
      if (nested.childNodes.length === 1 && nested.firstChild.nodeName === 'P') {
        li.append('\n', ...nested.firstChild.childNodes);
      } else {
        li.append(nested);
      }
    }
    el.append(li);
  }
  frag.append(el);
  return i;
}

function cells(line) {
  let row = line.trim();
  if (row.startsWith('|')) row = row.slice(1);
  if (row.endsWith('|') && !row.endsWith('\\|')) row = row.slice(0, -1);
  return row.split(/(?<!\\)\|/).map((c) => c.trim().replace(/\\\|/g, '|'));
}

function table(lines, i, frag) {
  const head = cells(lines[i]);
  const aligns = cells(lines[i + 1]).map((c) =>
    c.startsWith(':') && c.endsWith(':') ? 'center' : c.endsWith(':') ? 'right' : null,
  );
  const row = (values, tag) =>
    h('tr', {}, head.map((_, k) => h(tag, { class: aligns[k] ? `align-${aligns[k]}` : null }, inline(values[k] ?? ''))));
  const body = h('tbody');
  i += 2;
  while (i < lines.length && lines[i].trim() && lines[i].includes('|')) {
    body.append(row(cells(lines[i]), 'td'));
    i += 1;
  }
  frag.append(h('div', { class: 'table' }, h('table', {}, h('thead', {}, row(head, 'th')), body)));
  return i;
}

// inline: the earliest of these wins; the text between is plain text
const INLINE = new RegExp(
  [
    /(`+)([^`]|[^`][\s\S]{0,2000}?[^`])\1(?!`)/.source, // 1,2 code span
    /!\[([^\]\n]*)\]\(\s*<?([^)\s>]*)>?(?:\s+"[^"\n]*")?\s*\)/.source, // 3,4 image
    /\[((?:[^\][]|\[[^\]]*\])+)\]\(\s*<?([^)\s>]*)>?(?:\s+"[^"\n]*")?\s*\)/.source, // 5,6 link
    /<((?:https?:\/\/|mailto:)[^>\s]+)>/.source, // 7 autolink
    /(https?:\/\/[^\s<>"]*[^\s<>".,:;'")\]!?*_~])/.source, // 8 bare URL
    // emphasis spans at most 1,000 characters: bounded work for text full of stray markers
    /(\*\*|__)(?=\S)([\s\S]{0,1000}?\S)\9/.source, // 9,10 bold
    /(?<![\w*])(\*|_)(?=[^\s*_])([\s\S]{0,1000}?[^\s\\])\11(?![\w])/.source, // 11,12 italic
    /~~(?=\S)([\s\S]{0,1000}?\S)~~/.source, // 13 strike
    /\\([\\`*_{}\[\]()#+\-.!|~<>])/.source, // 14 escape
    /(\n)/.source, // 15 line break
  ].join('|'),
  'g',
);

/** Inline content of a piece of text, as a fragment. */
export function inline(text, depth = 0) {
  const frag = document.createDocumentFragment();
  if (depth > MAX_NESTING) {
    frag.append(text);
    return frag;
  }
  const re = new RegExp(INLINE.source, 'g');
  let last = 0;
  let m;
  while ((m = re.exec(text))) {
    if (m.index > last) frag.append(text.slice(last, m.index));
    last = re.lastIndex;
    if (m[1] !== undefined) frag.append(h('code', {}, m[2].length > 2 && m[2][0] === ' ' && m[2].at(-1) === ' ' ? m[2].slice(1, -1) : m[2]));
    else if (m[3] !== undefined) frag.append(link(m[4], m[3] ? `image: ${m[3]}` : 'image'));
    else if (m[5] !== undefined) frag.append(link(m[6], null, m[5], depth));
    else if (m[7] !== undefined) frag.append(link(m[7], m[7]));
    else if (m[8] !== undefined) frag.append(link(m[8], m[8]));
    else if (m[9] !== undefined) frag.append(h('strong', {}, inline(m[10], depth + 1)));
    else if (m[11] !== undefined) frag.append(h('em', {}, inline(m[12], depth + 1)));
    else if (m[13] !== undefined) frag.append(h('del', {}, inline(m[13], depth + 1)));
    else if (m[14] !== undefined) frag.append(m[14]);
    else if (m[15] !== undefined) frag.append(h('br'));
  }
  if (last < text.length) frag.append(text.slice(last));
  return frag;
}

/** A link when the URL is http(s) or mailto; otherwise the label (or the source) as text. */
function link(url, label, markdownLabel, depth = 0) {
  const content = markdownLabel !== undefined && markdownLabel !== null ? inline(markdownLabel, depth + 1) : label;
  if (!SAFE_URL.test(url)) {
    const text = h('span', { class: 'unsafe-link', title: 'link not followed' });
    text.append(content ?? url);
    return text;
  }
  const a = h('a', { href: url, target: '_blank', rel: 'noopener noreferrer nofollow' });
  a.append(content ?? url);
  return a;
}
