// The agent's own HTTP API (docs/http_api.md), with the API key when the server wants one:
// a 401 asks the person once (askKey), the key is kept for this tab (sessionStorage) and the
// request is sent again.

import { sleep } from './dom.js';

const KEY_STORE = 'agentik.key';

export class ApiError extends Error {
  constructor(status, code, message) {
    super(message);
    this.status = status;
    this.code = code;
  }

  static async of(response) {
    let code = `http_${response.status}`;
    let message = response.statusText || `HTTP ${response.status}`;
    try {
      const body = await response.json();
      if (body && body.error) ({ code, message } = body.error);
    } catch {
      // not JSON (a proxy's page): the status says enough
    }
    return new ApiError(response.status, code, message);
  }
}

export class Api {
  /** askKey(refused: boolean) resolves to the key a person typed. */
  constructor(askKey, base = '/agentik') {
    this.base = base;
    this.askKey = askKey;
    this.key = sessionStorage.getItem(KEY_STORE) || '';
    this.asking = null;
  }

  headers(extra = {}) {
    return this.key ? { ...extra, Authorization: `Bearer ${this.key}` } : { ...extra };
  }

  /** Ask for a key (one question however many requests were refused at once). */
  needKey() {
    if (!this.asking) {
      const refused = Boolean(this.key);
      this.asking = this.askKey(refused).then((key) => {
        this.key = key;
        sessionStorage.setItem(KEY_STORE, key);
        this.asking = null;
      });
    }
    return this.asking;
  }

  /** fetch with the key, asking for one on a 401; `retries`: tries again after a network
   * failure (safe for sends: they carry an Idempotency-Key). */
  async fetch(path, init = {}, retries = 0) {
    for (let attempt = 0; ; attempt += 1) {
      const sentKey = this.key;
      let response;
      try {
        response = await fetch(this.base + path, { ...init, headers: this.headers(init.headers) });
      } catch (e) {
        if (init.signal && init.signal.aborted) throw e;
        if (attempt >= retries) throw new ApiError(0, 'network', 'the server cannot be reached');
        await sleep(Math.min(4000, 250 * 2 ** attempt));
        continue;
      }
      if (response.status !== 401) return response;
      if (this.key === sentKey) await this.needKey();
    }
  }

  async request(method, path, body, { headers = {}, retries = 0 } = {}) {
    const init = { method, headers: { ...headers } };
    if (body !== undefined) {
      init.body = JSON.stringify(body);
      init.headers['Content-Type'] = 'application/json';
    }
    const response = await this.fetch(path, init, retries);
    if (!response.ok) throw await ApiError.of(response);
    return response.status === 204 ? null : response.json();
  }

  get(path) {
    return this.request('GET', path);
  }

  /** Every item of a paged list (`{items, hasMore}`), `limit` at a time. */
  async all(path, limit = 200) {
    const items = [];
    const sep = path.includes('?') ? '&' : '?';
    for (let offset = 0; ; offset += limit) {
      const page = await this.get(`${path}${sep}offset=${offset}&limit=${limit}`);
      items.push(...page.items);
      if (!page.hasMore) return items;
    }
  }
}
