'use strict';
// The client against a real daemon (redis.mode = "none"; rule "api": a token bucket of
// 5 refilling one token every ~17 minutes, so counts are exact; "fast": unlimited).
const test = require('node:test');
const assert = require('node:assert/strict');
const path = require('node:path');
const { pkg, Daemon, tmpdir } = require('./support');

const { Client, RequestError, encodeKey } = pkg;
const API_POLICY = '"api";q=5;w=5000'; // w = ceil(capacity 5 / refill 0.001 per s)

test('the installed package is the one under test', () => {
  if (process.env.RL_REQUIRE_INSTALLED) assert.match(require.resolve('ratelimitd'), /node_modules/);
});

test('counts down, denies with draft headers, one reused connection', async () => {
  const d = new Daemon();
  const rl = new Client({ socket: d.socket, timeoutMs: 5000 });
  try {
    for (const left of [4, 3, 2, 1, 0]) {
      const r = await rl.check('api', 'node:count');
      assert.deepEqual([r.allowed, r.limit, r.remaining, r.source], [true, 5, left, 'local']);
    }
    const { sock } = rl.conn;
    const r = await rl.check('api', 'node:count');
    assert.equal(rl.conn.sock, sock, 'same connection');
    assert.equal(r.allowed, false);
    assert.equal(r.windowMs, 5000000);
    const h = r.headers();
    assert.equal(h['RateLimit-Policy'], API_POLICY);
    assert.match(h.RateLimit, /^"api";r=0;t=\d+$/);
    assert.equal(h['Retry-After'], String(Math.ceil(r.waitMs / 1000)));
    assert.equal(h['X-RateLimit-Limit'], undefined);
    assert.equal(r.headers({ legacyHeaders: true })['X-RateLimit-Remaining'], '0');
    assert.equal((await rl.check('api', 'node:other')).headers()['Retry-After'], undefined);
  } finally {
    rl.close();
    d.stop();
  }
});

test('checkMany keeps order; concurrent calls pipeline on one connection, exactly', async () => {
  const d = new Daemon();
  const rl = new Client({ socket: d.socket, timeoutMs: 5000 });
  try {
    const checks = Array(7).fill(['api', 'node:pipe']).concat([['api', 'node:pipe2', 2], ['fast', 'x', 0]]);
    const rs = await rl.checkMany(checks);
    assert.deepEqual(rs.map((r) => r.allowed), [true, true, true, true, true, false, false, true, true]);
    assert.deepEqual(rs.slice(0, 5).map((r) => r.remaining), [4, 3, 2, 1, 0]);
    assert.equal(rs[7].remaining, 3);
    const { sock } = rl.conn;
    const many = await Promise.all([
      ...Array.from({ length: 50 }, () => rl.check('api', 'node:conc')),
      ...Array.from({ length: 200 }, (_, i) => rl.check('fast', `k${i}`)),
    ]);
    assert.equal(rl.conn.sock, sock, 'one connection for every call');
    assert.equal(many.slice(0, 50).filter((r) => r.allowed).length, 5);
    assert.ok(many.slice(50).every((r) => r.allowed && r.source === 'local'));
  } finally {
    rl.close();
    d.stop();
  }
});

test('request errors reject and the connection stays in step; keys are encoded', async () => {
  const d = new Daemon();
  const rl = new Client({ socket: d.socket, timeoutMs: 5000 });
  try {
    await assert.rejects(rl.check('nope', 'k'), (e) => e instanceof RequestError && e.code === 'RULE');
    await assert.rejects(rl.check('api', 'k', 6), (e) => e.code === 'COST');
    assert.equal((await rl.check('api', 'user name/é')).allowed, true);
    assert.equal(encodeKey('user name/é%'), 'user%20name/%C3%A9%25');
  } finally {
    rl.close();
    d.stop();
  }
});

test('absent daemon: fail open with the cause, or closed', async () => {
  const p = path.join(tmpdir('rl-node-none-'), 'none.sock');
  const r = await new Client({ socket: p }).check('api', 'k');
  assert.deepEqual([r.allowed, r.source], [true, 'client_fail_open']);
  assert.match(r.error, /ENOENT/);
  const c = await new Client({ socket: p, failOpen: false }).check('api', 'k');
  assert.deepEqual([c.allowed, c.source, c.headers()], [false, 'client_fail_closed', { 'Retry-After': '1' }]);
});

test('reconnects after a daemon restart; a stall times out without retry', async () => {
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
    d.start(); // restarted under a kept connection: one silent retry
    assert.equal((await rl.check('api', 'k')).source, 'local');
    rl.timeoutMs = 300;
    d.pause();
    const t0 = Date.now();
    const rs = await Promise.all(Array.from({ length: 10 }, (_, i) => rl.check('fast', `s${i}`)));
    assert.ok(rs.every((x) => x.source === 'client_fail_open' && /Timeout/.test(x.error)));
    assert.ok(Date.now() - t0 < 2000, 'bounded by the timeout (the margin is for a loaded machine)');
    d.resume();
    rl.timeoutMs = 5000;
    assert.equal((await rl.check('fast', 'k')).source, 'local');
  } finally {
    rl.close();
    d.resume();
    d.stop();
  }
});

test('the socket is unref\'d: a client never keeps the process alive', async () => {
  const d = new Daemon();
  try {
    const { execFileSync } = require('node:child_process');
    const script = `const { Client } = require(${JSON.stringify(require.resolve('ratelimitd'))});
      new Client({ socket: ${JSON.stringify(d.socket)} }).check('fast', 'k').then((r) => console.log(r.source));`;
    const t0 = Date.now();
    const out = execFileSync(process.execPath, ['-e', script], { timeout: 10000 }).toString().trim();
    assert.equal(out, 'local');
    assert.ok(Date.now() - t0 < 5000);
  } finally {
    d.stop();
  }
});
