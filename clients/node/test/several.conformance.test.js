'use strict';
// conformance.json's several_cases (checkAll and refund) through the client, and its
// several_header_cases through the middleware with allOrNothing, each against the
// scripted stand-in daemon; then that middleware against a real daemon.
const test = require('node:test');
const assert = require('node:assert/strict');
const { pkg, Daemon, FakeDaemon, loadCases } = require('./support');

const { Client, RequestError, middleware } = pkg;

const RL = /^(ratelimit|ratelimit-policy|retry-after|x-ratelimit-.*)$/;

// One request through the all-or-nothing middleware: status, headers, whether next() ran.
function viaMiddleware(checks, rl, legacyHeaders) {
  return new Promise((resolve, reject) => {
    const headers = {};
    const res = {
      statusCode: 200,
      setHeader(name, value) { headers[name.toLowerCase()] = String(value); },
      end() { resolve({ status: this.statusCode, headers, ran: false }); },
    };
    const mw = middleware(rl, { checks: () => checks, legacyHeaders, allOrNothing: true });
    mw({ socket: {} }, res, (err) => (err ? reject(err) : resolve({ status: 200, headers, ran: true })));
  }).then(({ status, headers, ran }) => ({
    status,
    ran,
    headers: Object.fromEntries(Object.entries(headers).filter(([k]) => RL.test(k))),
  }));
}

async function withFake(c, run) {
  const opts = { fail_open: true, legacy_headers: false, timeout_ms: 5000, ...(c.options || {}) };
  const fake = await new FakeDaemon(c.daemon, c.replies).listen();
  const rl = new Client({ socket: fake.path, timeoutMs: opts.timeout_ms, failOpen: opts.fail_open });
  const warn = console.warn;
  console.warn = () => {}; // absent daemons: the one warning is tested in several.test.js
  try {
    const e = c.expect;
    if (e.raises) {
      await assert.rejects(run(rl, opts), (err) => err instanceof RequestError && err.code === e.raises);
    } else {
      await run(rl, opts, e);
    }
    if (c.requests) assert.deepEqual(fake.requests, c.requests);
    if (c.daemon === 'stall' || c.daemon === 'close') assert.equal(fake.connections, 1, 'no retry');
  } finally {
    console.warn = warn;
    rl.close();
    await fake.close();
  }
}

for (const c of loadCases('several_cases')) {
  test(`several ${c.name}`, () => withFake(c, async (rl, opts, e) => {
    const r = c.call === 'refund' ? await rl.refund(...c.checks[0]) : await rl.checkAll(c.checks);
    if (!e) return;
    assert.deepEqual({
      allowed: r.allowed,
      limit: r.limit,
      remaining: r.remaining,
      reset_ms: r.resetMs,
      wait_ms: r.waitMs,
      window_ms: r.windowMs,
      source: r.source,
      rule: r.rule,
      error: Boolean(r.error),
    }, e.result);
  }));
}

for (const c of loadCases('several_header_cases')) {
  test(`all-or-nothing middleware ${c.name}`, () => withFake(c, async (rl, opts, e) => {
    const got = await viaMiddleware(c.checks, rl, opts.legacy_headers);
    if (!e) return;
    assert.equal(got.status, e.status);
    assert.equal(got.ran, e.status === 200, 'next() runs exactly when allowed');
    const want = Object.fromEntries(Object.entries(e.headers).map(([k, v]) => [k.toLowerCase(), v]));
    assert.deepEqual(got.headers, want);
  }));
}

test('all-or-nothing middleware: a denied request takes nothing from the other rule', async () => {
  const d = new Daemon();
  const rl = new Client({ socket: d.socket, timeoutMs: 5000 });
  try {
    await rl.check('api', 'n:mw:a', 3); // "a" has 2 left, "b" 5
    const checks = [['api', 'n:mw:a', 1], ['fast', 'n:mw:a', 1], ['api', 'n:mw:b', 1]];
    for (const [i, want] of [200, 200, 429, 429, 429].entries()) {
      const got = await viaMiddleware(checks, rl, false);
      assert.equal(got.status, want, `request ${i}`);
      assert.match(got.headers['ratelimit-policy'], /^"api";q=5;w=5000, "fast";q=1000000;w=\d+$/);
      assert.match(got.headers.ratelimit, /^"api";r=\d+;t=\d+$/);
      assert.equal('retry-after' in got.headers, want === 429);
    }
    // Two allowed requests took 2 of b's 5; the three denied ones took nothing.
    assert.equal((await rl.check('api', 'n:mw:b', 0)).remaining, 3);
  } finally {
    rl.close();
    d.stop();
  }
});
