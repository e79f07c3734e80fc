'use strict';
// checkAll (CHECKALL: several limits, all or nothing), refund, and a constructor given
// the socket's path as a string, against a real daemon (redis.mode = "none"; "api": a
// token bucket of 5 refilling one token every ~17 minutes; "fast": unlimited).
const test = require('node:test');
const assert = require('node:assert/strict');
const path = require('node:path');
const { pkg, Daemon, tmpdir } = require('./support');

const { Client } = pkg;

test('checkAll is all or nothing and names the binding rule; refund gives back', async () => {
  const d = new Daemon();
  const rl = new Client(d.socket);
  try {
    assert.equal(rl.path, d.socket, 'a string is the socket path');
    for (const left of [4, 3, 2, 1, 0]) {
      const r = await rl.checkAll([['fast', 'n:all', 1], ['api', 'n:all', 1]]);
      assert.deepEqual([r.allowed, r.remaining, r.rule], [true, left, 'api']);
    }
    const denied = await rl.checkAll([['fast', 'n:all', 1], ['api', 'n:all', 1]]);
    assert.deepEqual([denied.allowed, denied.rule], [false, 'api']);
    await assert.rejects(rl.checkAll([]), /1 to 8/);
    // Without Redis (this daemon) nothing is given back: the state after it.
    const r = await rl.refund('api', 'n:all', 2);
    assert.deepEqual([r.allowed, r.limit, r.source], [true, 5, 'local']);
  } finally {
    rl.close();
    d.stop();
  }
});

test('a client that cannot reach the daemon warns once, naming the path', async () => {
  const missing = path.join(tmpdir('rl-node-missing-'), 'nothing.sock');
  const rl = new Client(missing);
  const warnings = [];
  const warn = console.warn;
  console.warn = (m) => warnings.push(String(m));
  try {
    for (let i = 0; i < 3; i++) {
      const r = await rl.check('api', 'k');
      assert.equal(r.source, 'client_fail_open');
    }
  } finally {
    console.warn = warn;
    rl.close();
  }
  assert.equal(warnings.length, 1, warnings.join('\n'));
  assert.ok(warnings[0].includes(missing), warnings[0]);
});
