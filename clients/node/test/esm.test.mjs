// The ESM entry point: named imports work and reach the daemon.
import test from 'node:test';
import assert from 'node:assert/strict';
import { createRequire } from 'node:module';
import { Client, middleware, responseHeaders } from 'ratelimitd';
import def from 'ratelimitd';

const require = createRequire(import.meta.url);
const { Daemon } = require('./support.js');

test('ESM import: same classes as CommonJS, checks against the daemon', async () => {
  assert.equal(Client, require('ratelimitd').Client);
  assert.equal(typeof middleware, 'function');
  assert.equal(def.responseHeaders, responseHeaders);
  const d = new Daemon();
  const rl = new Client({ socket: d.socket, timeoutMs: 5000 });
  try {
    const r = await rl.check('api', 'esm');
    assert.deepEqual([r.allowed, r.remaining, r.windowMs], [true, 4, 5000000]);
  } finally {
    rl.close();
    d.stop();
  }
});
