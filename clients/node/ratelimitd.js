'use strict';
/**
 * Client for ratelimitd, the per-host rate-limit daemon (Node.js, no dependencies).
 *
 *   const { Client } = require('./ratelimitd');
 *   const rl = new Client({ socket: '/run/ratelimitd/ratelimitd.sock' });
 *   const r = await rl.check('rides_request', 'user:42');
 *   if (!r.allowed) { res.writeHead(429, r.headers()); return res.end(); }
 *
 * One connection per Client, opened on first use, shared by concurrent calls (requests
 * are pipelined, replies matched in order), re-opened after the daemon restarts. When
 * the daemon is absent, refuses, or does not answer within `timeoutMs`, the result is
 * allowed (`failOpen: true`, the default, source `client_fail_open`) or denied (source
 * `client_fail_closed`), with the cause in `error`. A request the daemon rejects as
 * malformed (unknown rule, bad key or cost) rejects with a `RequestError`.
 */

const net = require('net');

const DEFAULT_SOCKET = '/run/ratelimitd/ratelimitd.sock';
const REQUEST_ERRORS = new Set(['PROTO', 'RULE', 'KEY', 'COST', 'TOO_LONG']);

/** The daemon rejected the request itself (ERR PROTO/RULE/KEY/COST/TOO_LONG). */
class RequestError extends Error {
  constructor(code, message) {
    super(`ratelimitd: ERR ${code} ${message}`);
    this.name = 'RequestError';
    this.code = code;
  }
}

/** One decision; times in ms. `source` is the daemon's or `client_fail_open|closed`. */
class Result {
  constructor(fields) {
    Object.assign(this, {
      allowed: false, limit: 0, remaining: 0, resetMs: 0, waitMs: 0, source: '', rule: '', error: null,
    }, fields);
  }

  /** True when the daemon did not decide (the client failed open or closed). */
  get fromClient() {
    return this.source.startsWith('client_');
  }

  /**
   * HTTP response headers: IETF draft-ietf-httpapi-ratelimit-headers (RateLimit-Policy,
   * RateLimit), X-RateLimit-Limit/Remaining/Reset (seconds from now), Retry-After
   * (seconds) when denied. Empty when the daemon did not decide (Retry-After: 1 when
   * the client failed closed).
   */
  headers() {
    if (this.fromClient) return this.allowed ? {} : { 'Retry-After': '1' };
    const resetS = Math.ceil(this.resetMs / 1000);
    const h = {
      'RateLimit-Policy': `"${this.rule}";q=${this.limit}`,
      'RateLimit': `"${this.rule}";r=${this.remaining};t=${resetS}`,
      'X-RateLimit-Limit': String(this.limit),
      'X-RateLimit-Remaining': String(this.remaining),
      'X-RateLimit-Reset': String(resetS),
    };
    if (!this.allowed) h['Retry-After'] = String(Math.max(1, Math.ceil(this.waitMs / 1000)));
    return h;
  }
}

/** Percent-encodes every byte outside 0x21..0x7E, and `%` itself. */
function encodeKey(key) {
  const bytes = Buffer.isBuffer(key) ? key : Buffer.from(String(key), 'utf8');
  let out = '';
  for (const b of bytes) {
    out += b >= 0x21 && b <= 0x7e && b !== 0x25
      ? String.fromCharCode(b)
      : '%' + b.toString(16).toUpperCase().padStart(2, '0');
  }
  return out;
}

/** Parses a CHECK reply (six fields, extra trailing ones ignored). Throws on ERR. */
function parseReply(line, rule = '') {
  const f = line.trim().split(/[ \t]+/);
  if (f[0] === 'ERR') throw new RequestError(f[1] || 'INTERNAL', f.slice(2).join(' '));
  if (f.length < 6 || (f[0] !== 'ALLOW' && f[0] !== 'DENY')) {
    throw new Error(`ratelimitd: unexpected reply ${JSON.stringify(line)}`);
  }
  const n = f.slice(1, 5).map((x) => Number.parseInt(x, 10));
  if (n.some((x) => !Number.isSafeInteger(x))) throw new Error(`ratelimitd: bad numbers in ${line}`);
  return new Result({
    allowed: f[0] === 'ALLOW', limit: n[0], remaining: n[1], resetMs: n[2], waitMs: n[3], source: f[5], rule,
  });
}

class Client {
  /**
   * @param {{socket?: string, timeoutMs?: number, failOpen?: boolean}} [opts]
   */
  constructor({ socket = DEFAULT_SOCKET, timeoutMs = 200, failOpen = true } = {}) {
    this.path = socket;
    this.timeoutMs = timeoutMs;
    this.failOpen = failOpen;
    this.conn = null; // { sock, buf, used, batches: [] }
  }

  /** Asks for `cost` units of `key`'s budget under `rule`. */
  async check(rule, key, cost = 1) {
    return (await this.checkMany([[rule, key, cost]]))[0];
  }

  /** Several checks in one round trip; results in the same order. */
  checkMany(checks) {
    const items = checks.map(([rule, key, cost = 1]) => ({ rule, key, cost }));
    if (items.length === 0) return Promise.resolve([]);
    const payload = items.map((c) => `CHECK ${c.rule} ${encodeKey(c.key)} ${c.cost}\n`).join('');
    return new Promise((resolve, reject) => {
      const batch = { items, payload, replies: [], resolve, reject, retried: false, timer: null };
      batch.timer = setTimeout(() => this._timeout(batch), this.timeoutMs);
      this._send(batch);
    });
  }

  /** Closes the connection (the next check opens a new one). */
  close() {
    if (this.conn) this._lost(this.conn, new Error('client closed'));
  }

  _fallback(rule, error) {
    return new Result({
      allowed: this.failOpen,
      source: this.failOpen ? 'client_fail_open' : 'client_fail_closed',
      rule,
      error: String(error),
    });
  }

  _finish(batch, fallbackError) {
    clearTimeout(batch.timer);
    if (fallbackError !== undefined) {
      batch.resolve(batch.items.map((c) => this._fallback(c.rule, fallbackError)));
      return;
    }
    const out = [];
    for (let i = 0; i < batch.items.length; i++) {
      const line = batch.replies[i];
      const f = line.split(/[ \t]+/);
      if (f[0] === 'ERR' && REQUEST_ERRORS.has(f[1])) {
        batch.reject(new RequestError(f[1], f.slice(2).join(' ')));
        return;
      }
      if (f[0] === 'ERR') {
        out.push(this._fallback(batch.items[i].rule, `daemon said: ${line}`));
        continue;
      }
      try {
        out.push(parseReply(line, batch.items[i].rule));
      } catch (e) {
        batch.reject(e);
        return;
      }
    }
    batch.resolve(out);
  }

  _connect() {
    const sock = net.createConnection(this.path);
    const conn = { sock, buf: '', used: false, batches: [] };
    sock.setEncoding('latin1');
    sock.on('data', (chunk) => this._data(conn, chunk));
    sock.on('error', (e) => this._lost(conn, e));
    sock.on('close', () => this._lost(conn, new Error('daemon closed the connection')));
    this.conn = conn;
    return conn;
  }

  _send(batch) {
    const conn = this.conn || this._connect();
    batch.reused = conn.used;
    conn.batches.push(batch);
    conn.sock.write(batch.payload);
  }

  _data(conn, chunk) {
    conn.buf += chunk;
    let nl;
    while ((nl = conn.buf.indexOf('\n')) >= 0) {
      const line = conn.buf.slice(0, nl);
      conn.buf = conn.buf.slice(nl + 1);
      conn.used = true;
      const batch = conn.batches[0];
      if (!batch) continue; // an unsolicited line (ERR BUSY/PERM at connect)
      batch.replies.push(line);
      if (line.startsWith('ERR BUSY') || line.startsWith('ERR PERM')) {
        // The daemon closes the connection after these: the rest of the batch and the
        // batches behind it fail over.
        this._lost(conn, new Error(`daemon said: ${line}`));
        return;
      }
      if (batch.replies.length === batch.items.length) {
        conn.batches.shift();
        this._finish(batch);
      }
    }
  }

  _lost(conn, err) {
    if (this.conn === conn) this.conn = null;
    conn.sock.destroy();
    const batches = conn.batches;
    conn.batches = [];
    for (const batch of batches) {
      if (batch.replies.length === 0 && batch.reused && !batch.retried) {
        // A kept connection closed by a daemon restart or idle timeout: one retry.
        batch.retried = true;
        this._send(batch);
      } else if (batch.replies.length > 0 && /^ERR (BUSY|PERM)/.test(batch.replies[batch.replies.length - 1])) {
        this._finish(batch, batch.replies[batch.replies.length - 1]);
      } else {
        this._finish(batch, err.message || err);
      }
    }
  }

  _timeout(batch) {
    // The connection is out of step once a reply is late: drop it, fail its batches.
    const conn = this.conn;
    if (conn && conn.batches.includes(batch)) {
      conn.batches = conn.batches.filter((b) => b !== batch);
      this._finish(batch, `TimeoutError: no reply within ${this.timeoutMs} ms`);
      this._lost(conn, new Error('connection dropped after a timeout'));
    } else {
      this._finish(batch, `TimeoutError: no reply within ${this.timeoutMs} ms`);
    }
  }
}

module.exports = { Client, Result, RequestError, parseReply, encodeKey, DEFAULT_SOCKET };
