'use strict';
/**
 * Concurrency slots (`algorithm = "concurrency"` rules): `acquire` / `release`,
 * `withSlot` (runs a function holding a slot and always gives it back) and a
 * node:http / Express middleware that holds one slot while a request is served.
 *
 * The daemon also gives a slot back when the connection that took it closes (a
 * crashed process frees its slots at once) and when the rule's `max_hold` ends, so a
 * slot cannot leak; releasing promptly frees it for others. A slot the client could
 * not ask about (daemon absent, slow, overloaded) follows `failOpen`: allowed with no
 * token, or denied, the cause in `error`.
 */

const { RequestError, REQUEST_ERRORS, encodeKey } = require('./result');
const { Batch } = require('./client');

/** One ACQUIRE's answer; `token` names the slot for `release` (null when denied or
 * when the client decided). */
class Slot {
  constructor(fields) {
    Object.assign(this, {
      allowed: false, rule: '', key: '', limit: 0, remaining: 0, waitMs: 0, source: '',
      token: null, error: null,
    }, fields);
  }

  /** `RateLimit-Policy: "<rule>";q=<limit>;qu="concurrent-requests"`, `RateLimit`, and
   * on a denial `Retry-After`; none when the client failed open. */
  headers() {
    if (this.source.startsWith('client_')) return this.allowed ? {} : { 'Retry-After': '1' };
    const h = {
      'RateLimit-Policy': `"${this.rule}";q=${this.limit};qu="concurrent-requests"`,
      RateLimit: `"${this.rule}";r=${this.remaining}`,
    };
    if (!this.allowed) h['Retry-After'] = String(Math.max(1, Math.ceil(this.waitMs / 1000)));
    return h;
  }
}

/** One request line on `client`'s connection: {line, cause}. */
function ask(client, line) {
  return new Promise((resolve, reject) => {
    const b = new Batch([''], line, resolve, reject, true, Date.now() + client.timeoutMs);
    b.raw = true;
    client._send(b);
  });
}

/** Throws a RequestError for a reply that says the request is wrong. */
function refuse(line) {
  const m = /^ERR (\S+) ?(.*)$/.exec(line);
  if (m && REQUEST_ERRORS.has(m[1])) throw new RequestError(m[1], m[2]);
}

/** `ACQUIRE rule key` → a Slot (rejects with RequestError on a caller bug). */
async function acquire(client, rule, key) {
  const k = encodeKey(key);
  const { line, cause } = await ask(client, `ACQUIRE ${rule} ${k}\n`);
  if (line !== null) {
    refuse(line);
    const f = line.split(' ');
    const n = f.slice(1, 5).map(Number);
    if (f.length >= 6 && (f[0] === 'DENY' || (f[0] === 'ALLOW' && f.length >= 8))
      && n.every(Number.isInteger)) {
      return new Slot({
        allowed: f[0] === 'ALLOW', rule, key: k, limit: n[0], remaining: n[1], waitMs: n[3],
        source: f[5], token: f[0] === 'ALLOW' ? f[7] : null,
      });
    }
  }
  return new Slot({
    allowed: client.failOpen, rule, key: k,
    source: client.failOpen ? 'client_fail_open' : 'client_fail_closed',
    error: line === null ? (cause || 'no reply') : `unexpected reply: ${line.slice(0, 80)}`,
  });
}

/** `RELEASE`: true when given back, false when the daemon no longer held it or could
 * not be asked. Idempotent (the token is cleared). */
async function release(client, slot) {
  const token = slot.token;
  slot.token = null;
  if (!token) return false;
  const { line } = await ask(client, `RELEASE ${slot.rule} ${slot.key} ${token}\n`);
  if (line === null) return false;
  refuse(line);
  return line === 'OK';
}

/** Runs `fn(slot)` holding a slot of `rule` for `key` and releases it afterwards,
 * whether `fn` returns, throws or rejects; `fn` sees `slot.allowed`. */
async function withSlot(client, rule, key, fn) {
  const slot = await acquire(client, rule, key);
  try {
    return await fn(slot);
  } finally {
    await release(client, slot);
  }
}

/**
 * Middleware `(req, res, next)` for node:http handlers and Express: holds one slot of
 * `rule` per request (`key(req)`; null or undefined: no slot), released once when the
 * response finishes, when the client disconnects ('close'), or when the handler fails
 * (Express ends the response). A denied request gets 429 with the headers.
 */
function concurrencyMiddleware(client, { rule, key, denyBody = 'Too many requests in progress\n' }) {
  return (req, res, next) => {
    const k = key(req);
    if (k === null || k === undefined) {
      next();
      return;
    }
    acquire(client, rule, k).then((slot) => {
      for (const [name, value] of Object.entries(slot.headers())) res.setHeader(name, value);
      if (!slot.allowed) {
        res.statusCode = 429;
        res.setHeader('Content-Type', 'text/plain; charset=utf-8');
        res.end(denyBody);
        return;
      }
      let done = false;
      const give = () => {
        if (done) return;
        done = true;
        release(client, slot).catch(() => {});
      };
      res.once('finish', give);
      res.once('close', give);
      try {
        next();
      } catch (e) {
        give();
        throw e;
      }
    }, next);
  };
}

module.exports = { Slot, acquire, release, withSlot, concurrencyMiddleware };
