'use strict';
/**
 * The client: one Unix-socket connection shared by every concurrent call, requests
 * pipelined on it (written as they come, replies matched in order), the socket
 * unref'd so it never keeps a process alive. Failures (daemon absent, refused, closed,
 * slow, overloaded) resolve to the configured fallback result with its cause; a
 * request the daemon rejects as malformed rejects with a RequestError.
 */

const net = require('node:net');
const {
  DEFAULT_SOCKET, RequestError, ReplyError, requestLine, parseReply, fallback,
} = require('./result');

class Client {
  /**
   * @param {string | {socket?: string, timeoutMs?: number, failOpen?: boolean}} [opts]
   * the socket's path (`new Client('/srv/app/ratelimitd.sock')`), or options.
   * timeoutMs bounds each call, connecting included; a timeout is never retried.
   * A kept connection found closed (daemon restarted) is retried once on a fresh one.
   */
  constructor(opts = {}) {
    if (typeof opts === 'string') opts = { socket: opts };
    const { socket = DEFAULT_SOCKET, timeoutMs = 200, failOpen = true } = opts || {};
    this.path = socket;
    // Said once per client: a daemon that cannot be reached (a wrong path) must not
    // pass silently while every call fails open.
    this.warned = false;
    this.timeoutMs = timeoutMs;
    this.failOpen = failOpen;
    this.conn = null;
  }

  /** Asks for `cost` units of `key`'s budget under `rule`. */
  check(rule, key, cost = 1) {
    return new Promise((resolve, reject) => {
      this._send(new Batch([rule], requestLine(rule, key, cost), resolve, reject, true,
        Date.now() + this.timeoutMs));
    });
  }

  /** Several checks in one round trip; results in the same order. */
  checkMany(checks) {
    return new Promise((resolve, reject) => {
      if (checks.length === 0) {
        resolve([]);
        return;
      }
      const rules = new Array(checks.length);
      let payload = '';
      for (let i = 0; i < checks.length; i++) {
        const [rule, key, cost = 1] = checks[i];
        rules[i] = rule;
        payload += requestLine(rule, key, cost);
      }
      this._send(new Batch(rules, payload, resolve, reject, false, Date.now() + this.timeoutMs));
    });
  }

  /** Closes the connection (the next check opens a new one). */
  close() {
    if (this.conn) this._lost(this.conn, 'client closed');
  }

  _connect() {
    const sock = net.createConnection(this.path);
    sock.unref();
    sock.setEncoding('latin1');
    const conn = {
      sock, buf: '', out: '', used: false, closed: false, pending: [], timer: null, timerAt: 0,
    };
    sock.on('data', (chunk) => this._data(conn, chunk));
    sock.on('error', (e) => {
      if (!conn.used && !this.warned) {
        this.warned = true;
        console.warn(`ratelimitd: cannot reach the daemon at ${this.path} (${e.code || e.name}); `
          + `every call fails ${this.failOpen ? 'open' : 'closed'} until it can`);
      }
      this._lost(conn, `${e.code || e.name}: ${e.message}`);
    });
    sock.on('close', () => this._lost(conn, 'ConnectionResetError: daemon closed the connection'));
    this.conn = conn;
    return conn;
  }

  _send(batch) {
    const conn = this.conn || this._connect();
    batch.conn = conn;
    batch.reused = conn.used;
    conn.pending.push(batch);
    // Calls made in one turn of the event loop (every reply read in it resumes its
    // caller, who may check again) go out in one write: fewer syscalls and wake-ups
    // on both sides.
    if (conn.out === '') setImmediate(flush, conn);
    conn.out += batch.payload;
    if (!conn.timer || batch.deadline < conn.timerAt) this._arm(conn);
  }

  // One timer per connection, set for the earliest deadline in flight (not one timer
  // per call: under load that is most of a call's cost).
  _arm(conn) {
    clearTimeout(conn.timer);
    conn.timer = null;
    if (conn.closed || conn.pending.length === 0) return;
    let due = Infinity;
    for (const b of conn.pending) due = Math.min(due, b.deadline);
    conn.timerAt = due;
    conn.timer = setTimeout(() => {
      conn.timer = null;
      const now = Date.now();
      const late = conn.pending.find((b) => b.deadline <= now);
      if (late) this._timedOut(late);
      else this._arm(conn);
    }, Math.max(1, due - Date.now()));
  }

  _data(conn, chunk) {
    conn.buf += chunk;
    let start = 0;
    let nl;
    while ((nl = conn.buf.indexOf('\n', start)) >= 0) {
      const line = conn.buf.slice(start, nl);
      start = nl + 1;
      conn.used = true;
      const batch = conn.pending[0];
      if (!batch) continue; // unsolicited (ERR BUSY/PERM at connect)
      batch.lines.push(line);
      if (batch.lines.length === batch.rules.length) {
        conn.pending.shift();
        if (conn.pending.length === 0 && conn.timer) {
          clearTimeout(conn.timer);
          conn.timer = null;
        }
        this._finish(batch, null);
      }
    }
    conn.buf = start === 0 ? conn.buf : conn.buf.slice(start);
  }

  _lost(conn, cause, retry = true) {
    if (conn.closed) return;
    conn.closed = true;
    clearTimeout(conn.timer);
    conn.timer = null;
    if (this.conn === conn) this.conn = null;
    conn.sock.destroy();
    const pending = conn.pending;
    conn.pending = [];
    for (const batch of pending) {
      if (retry && batch.lines.length === 0 && batch.reused && !batch.retried && !batch.done) {
        // A kept connection closed by a daemon restart or idle timeout: one retry.
        batch.retried = true;
        this._send(batch);
      } else {
        this._finish(batch, cause);
      }
    }
  }

  _timedOut(batch) {
    const cause = `TimeoutError: no reply within ${this.timeoutMs} ms`;
    const conn = batch.conn;
    if (conn && !conn.closed) {
      // Replies come in order: everything behind a late one is late too, and the
      // connection is out of step. Fail them all, retry none.
      for (const b of conn.pending) this._finish(b, cause);
      this._lost(conn, cause, false);
    }
    this._finish(batch, cause);
  }

  _finish(batch, cause) {
    if (batch.done) return;
    batch.done = true;
    // A slot request (lib/slots.js) reads its own reply.
    if (batch.raw) {
      batch.resolve({ line: batch.lines.length ? batch.lines[0] : null, cause });
      return;
    }
    const n = batch.rules.length;
    const out = new Array(n);
    let bug = null;
    for (let i = 0; i < n; i++) {
      const rule = batch.rules[i];
      if (i >= batch.lines.length) {
        out[i] = fallback(rule, this.failOpen, cause || 'no reply');
        continue;
      }
      try {
        out[i] = parseReply(batch.lines[i], rule);
      } catch (e) {
        if (e instanceof RequestError) bug = bug || e;
        else if (!(e instanceof ReplyError)) throw e;
        // ERR BUSY/PERM/INTERNAL: the daemon cannot serve us now (it closes the
        // connection itself after BUSY and PERM). An unreadable line: out of step.
        else if (!batch.lines[i].startsWith('ERR') && batch.conn) this._lost(batch.conn, 'connection out of step', false);
        out[i] = fallback(rule, this.failOpen, e.message);
      }
    }
    if (bug) batch.reject(bug);
    else batch.resolve(batch.single ? out[0] : out);
  }
}

/** Writes what the calls of one event-loop turn queued on `conn`. */
function flush(conn) {
  const out = conn.out;
  conn.out = '';
  if (!conn.closed && out !== '') conn.sock.write(out);
}

/** One call's requests (one line for check, several for checkMany) and its promise. */
class Batch {
  constructor(rules, payload, resolve, reject, single, deadline) {
    this.rules = rules;
    this.payload = payload;
    this.lines = [];
    this.resolve = resolve;
    this.reject = reject;
    this.single = single;
    this.reused = false;
    this.retried = false;
    this.done = false;
    this.conn = null;
    this.deadline = deadline;
  }
}

module.exports = { Client, Batch };
