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
   * @param {{socket?: string, timeoutMs?: number, failOpen?: boolean}} [opts]
   * timeoutMs bounds each call, connecting included; a timeout is never retried.
   * A kept connection found closed (daemon restarted) is retried once on a fresh one.
   */
  constructor({ socket = DEFAULT_SOCKET, timeoutMs = 200, failOpen = true } = {}) {
    this.path = socket;
    this.timeoutMs = timeoutMs;
    this.failOpen = failOpen;
    this.conn = null;
  }

  /** Asks for `cost` units of `key`'s budget under `rule`. */
  async check(rule, key, cost = 1) {
    return (await this.checkMany([[rule, key, cost]]))[0];
  }

  /** Several checks in one round trip; results in the same order. */
  checkMany(checks) {
    const items = checks.map(([rule, key, cost = 1]) => ({ rule, key, cost }));
    if (items.length === 0) return Promise.resolve([]);
    let payload = '';
    for (const c of items) payload += requestLine(c.rule, c.key, c.cost);
    return new Promise((resolve, reject) => {
      const batch = {
        items,
        payload,
        lines: [],
        resolve,
        reject,
        reused: false,
        retried: false,
        done: false,
        conn: null,
        deadline: Date.now() + this.timeoutMs,
      };
      this._send(batch);
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
      sock, buf: '', used: false, closed: false, pending: [], timer: null, timerAt: 0, corked: false,
    };
    sock.on('data', (chunk) => this._data(conn, chunk));
    sock.on('error', (e) => this._lost(conn, `${e.code || e.name}: ${e.message}`));
    sock.on('close', () => this._lost(conn, 'ConnectionResetError: daemon closed the connection'));
    this.conn = conn;
    return conn;
  }

  _send(batch) {
    const conn = this.conn || this._connect();
    batch.conn = conn;
    batch.reused = conn.used;
    conn.pending.push(batch);
    // Calls made in the same tick go out in one write (fewer syscalls on both sides).
    if (!conn.corked) {
      conn.corked = true;
      conn.sock.cork();
      process.nextTick(() => {
        conn.corked = false;
        conn.sock.uncork();
      });
    }
    conn.sock.write(batch.payload);
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
      if (batch.lines.length === batch.items.length) {
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
    const out = new Array(batch.items.length);
    let bug = null;
    for (let i = 0; i < batch.items.length; i++) {
      const { rule } = batch.items[i];
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
    else batch.resolve(out);
  }
}

module.exports = { Client };
