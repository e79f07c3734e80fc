'use strict';
// Concurrency slots against a real daemon (redis.mode = "none"; rule "inflight": 2
// slots per key): acquire/release, withSlot releasing on a throw, a closed connection
// freeing its slots, and the middleware releasing after the response, after a handler
// that throws, and answering 429 with the policy headers.
const test = require('node:test');
const assert = require('node:assert/strict');
const http = require('node:http');
const { pkg, Daemon } = require('./support');

const { Client, acquire, release, withSlot, concurrencyMiddleware, RequestError } = pkg;

test('slots: two, then a denial, then a release frees one', async () => {
  const d = new Daemon();
  const rl = new Client({ socket: d.socket, timeoutMs: 5000 });
  try {
    const a = await acquire(rl, 'inflight', 'k1');
    const b = await acquire(rl, 'inflight', 'k1');
    assert.ok(a.allowed && b.allowed && a.token && b.token);
    assert.deepEqual([a.limit, a.remaining, b.remaining, a.source], [2, 1, 0, 'local']);
    const denied = await acquire(rl, 'inflight', 'k1');
    assert.equal(denied.allowed, false);
    assert.ok(denied.waitMs > 55000);
    assert.deepEqual(denied.headers(), {
      'RateLimit-Policy': '"inflight";q=2;qu="concurrent-requests"',
      RateLimit: '"inflight";r=0',
      'Retry-After': String(Math.ceil(denied.waitMs / 1000)),
    });
    assert.equal(await release(rl, a), true);
    assert.equal(await release(rl, a), false);
    assert.equal((await acquire(rl, 'inflight', 'k1')).allowed, true);
    await assert.rejects(acquire(rl, 'api', 'k'), (e) => e instanceof RequestError && e.code === 'RULE');
    // withSlot gives the slot back when its function throws.
    for (let i = 0; i < 3; i++) {
      await assert.rejects(withSlot(rl, 'inflight', 'k2', async (s) => {
        assert.ok(s.allowed);
        throw new Error('handler failed');
      }), /handler failed/);
    }
    // A closed connection frees its slots.
    await acquire(rl, 'inflight', 'k3');
    await acquire(rl, 'inflight', 'k3');
    rl.close();
    const other = new Client({ socket: d.socket, timeoutMs: 5000 });
    let back = false;
    for (let i = 0; i < 100 && !back; i++) back = (await acquire(other, 'inflight', 'k3')).allowed;
    assert.ok(back, "the closed connection's slots never came back");
    other.close();
  } finally {
    rl.close();
    d.stop();
  }
});

test('slots: the middleware releases after the response and after a throw', async () => {
  const d = new Daemon();
  const rl = new Client({ socket: d.socket, timeoutMs: 5000 });
  const mw = concurrencyMiddleware(rl, { rule: 'inflight', key: () => 'web' });
  const server = http.createServer((req, res) => mw(req, res, (err) => {
    if (err || req.url === '/boom') {
      res.statusCode = 500;
      res.end('failed');
      return;
    }
    res.end('hello');
  }));
  await new Promise((resolve) => server.listen(0, '127.0.0.1', resolve));
  const { port } = server.address();
  const get = (p) => new Promise((resolve, reject) => {
    http.get({ host: '127.0.0.1', port, path: p }, (res) => {
      let body = '';
      res.on('data', (c) => { body += c; });
      res.on('end', () => resolve({ status: res.statusCode, headers: res.headers, body }));
    }).on('error', reject);
  });
  try {
    for (let i = 0; i < 5; i++) {
      const ok = await get('/');
      assert.equal(ok.status, 200);
      assert.equal(ok.headers['ratelimit-policy'], '"inflight";q=2;qu="concurrent-requests"');
      assert.equal((await get('/boom')).status, 500);
    }
    // Give the releases a moment (they follow 'finish').
    await new Promise((r) => setTimeout(r, 50));
    const held = [await acquire(rl, 'inflight', 'web'), await acquire(rl, 'inflight', 'web')];
    assert.ok(held.every((s) => s.allowed), 'every request gave its slot back');
    const full = await get('/');
    assert.equal(full.status, 429);
    assert.match(full.headers['retry-after'], /^\d+$/);
    for (const s of held) assert.equal(await release(rl, s), true);
  } finally {
    server.close();
    rl.close();
    d.stop();
  }
});
