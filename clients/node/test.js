'use strict';
// Tests of the Node client against a real daemon (clients/run_tests.sh runs them;
// needs RATELIMITD_BIN). Run: node --test test.js
const test = require('node:test');
const assert = require('node:assert/strict');
const { execFileSync } = require('node:child_process');
const fs = require('node:fs');
const os = require('node:os');
const path = require('node:path');
const { Client, RequestError, parseReply, encodeKey } = require('./ratelimitd');

const TESTDAEMON = path.join(__dirname, '..', 'testdaemon.sh');

class Daemon {
  constructor() {
    this.dir = fs.mkdtempSync(path.join(process.env.RL_TEST_ROOT || os.tmpdir(), 'rl-node-'));
    this.socket = path.join(this.dir, 'rl.sock');
    this.start();
  }
  run(cmd) { execFileSync('bash', [TESTDAEMON, cmd, this.dir], { stdio: 'inherit', timeout: 30000 }); }
  start() { this.run('start'); }
  stop() { this.run('stop'); }
  pause() { this.run('pause'); }
  resume() { this.run('resume'); }
}

test('counts down, denies, maps headers; one reused connection', async () => {
  const d = new Daemon();
  const rl = new Client({ socket: d.socket, timeoutMs: 5000 });
  try {
    for (const left of [4, 3, 2, 1, 0]) {
      const r = await rl.check('api', 'node:count');
      assert.deepEqual([r.allowed, r.limit, r.remaining, r.source], [true, 5, left, 'local']);
    }
    const sock = rl.conn.sock;
    const r = await rl.check('api', 'node:count');
    assert.equal(rl.conn.sock, sock, 'same connection');
    assert.equal(r.allowed, false);
    const h = r.headers();
    assert.equal(h['RateLimit-Policy'], '"api";q=5');
    assert.match(h.RateLimit, /^"api";r=0;t=\d+$/);
    assert.equal(h['X-RateLimit-Remaining'], '0');
    assert.equal(h['Retry-After'], String(Math.ceil(r.waitMs / 1000)));
    assert.equal((await rl.check('api', 'node:other')).headers()['Retry-After'], undefined);
  } finally {
    rl.close();
    d.stop();
  }
});

test('pipelining keeps order, concurrent calls share the connection', async () => {
  const d = new Daemon();
  const rl = new Client({ socket: d.socket, timeoutMs: 5000 });
  try {
    const checks = Array(7).fill(['api', 'node:pipe']).concat([['api', 'node:pipe2', 2], ['fast', 'x', 0]]);
    const rs = await rl.checkMany(checks);
    assert.deepEqual(rs.map((r) => r.allowed), [true, true, true, true, true, false, false, true, true]);
    assert.deepEqual(rs.slice(0, 5).map((r) => r.remaining), [4, 3, 2, 1, 0]);
    assert.equal(rs[7].remaining, 3);
    const many = await Promise.all(Array.from({ length: 100 }, (_, i) => rl.check('fast', `k${i}`)));
    assert.ok(many.every((r) => r.allowed && r.source === 'local'));
  } finally {
    rl.close();
    d.stop();
  }
});

test('request errors reject; keys are encoded; extra fields ignored', async () => {
  const d = new Daemon();
  const rl = new Client({ socket: d.socket, timeoutMs: 5000 });
  try {
    await assert.rejects(rl.check('nope', 'k'), (e) => e instanceof RequestError && e.code === 'RULE');
    await assert.rejects(rl.check('api', 'k', 6), (e) => e.code === 'COST');
    assert.equal((await rl.check('api', 'user name/é')).allowed, true);
    assert.equal(encodeKey('user name/é%'), 'user%20name/%C3%A9%25');
    const r = parseReply('DENY 20 0 1900 100 cache future fields', 'rides');
    assert.deepEqual([r.allowed, r.limit, r.remaining, r.resetMs, r.waitMs, r.source], [false, 20, 0, 1900, 100, 'cache']);
  } finally {
    rl.close();
    d.stop();
  }
});

test('fails open (or closed) when the daemon is absent', async () => {
  const p = path.join(fs.mkdtempSync(path.join(os.tmpdir(), 'rl-node-none-')), 'none.sock');
  const r = await new Client({ socket: p }).check('api', 'k');
  assert.deepEqual([r.allowed, r.source], [true, 'client_fail_open']);
  assert.match(r.error, /ENOENT/);
  assert.deepEqual(r.headers(), {});
  const c = await new Client({ socket: p, failOpen: false }).check('api', 'k');
  assert.deepEqual([c.allowed, c.source], [false, 'client_fail_closed']);
  assert.deepEqual(c.headers(), { 'Retry-After': '1' });
});

test('reconnects after a daemon restart', async () => {
  const d = new Daemon();
  const rl = new Client({ socket: d.socket, timeoutMs: 5000 });
  try {
    assert.equal((await rl.check('api', 'k')).source, 'local');
    d.stop();
    assert.equal((await rl.check('api', 'k')).source, 'client_fail_open');
    d.start();
    const r = await rl.check('api', 'k');
    assert.deepEqual([r.source, r.remaining], ['local', 4]);
    d.stop();
    d.start();
    assert.equal((await rl.check('api', 'k')).source, 'local');
  } finally {
    rl.close();
    d.stop();
  }
});

test('times out and fails open when the daemon is stalled', async () => {
  const d = new Daemon();
  const rl = new Client({ socket: d.socket, timeoutMs: 5000 });
  try {
    assert.equal((await rl.check('fast', 'k')).source, 'local');
    rl.timeoutMs = 300;
    d.pause();
    const t0 = Date.now();
    const r = await rl.check('fast', 'k');
    assert.equal(r.source, 'client_fail_open');
    assert.match(r.error, /Timeout/);
    assert.ok(Date.now() - t0 < 3000);
    const closed = await new Client({ socket: d.socket, timeoutMs: 300, failOpen: false }).check('fast', 'k');
    assert.equal(closed.source, 'client_fail_closed');
    d.resume();
    rl.timeoutMs = 5000;
    assert.equal((await rl.check('fast', 'k')).source, 'local');
  } finally {
    rl.close();
    d.resume();
    d.stop();
  }
});
