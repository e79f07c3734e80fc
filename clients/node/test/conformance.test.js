'use strict';
// The shared conformance table (clients/conformance.json) run through the client and
// the middleware: one test per case and way, named after the case.
const test = require('node:test');
const assert = require('node:assert/strict');
const { pkg, FakeDaemon, loadCases } = require('./support');

const { Client, RequestError, middleware } = pkg;

const RL = /^(ratelimit|ratelimit-policy|retry-after|x-ratelimit-.*)$/;

function asPlain(r) {
  return {
    allowed: r.allowed,
    limit: r.limit,
    remaining: r.remaining,
    reset_ms: r.resetMs,
    wait_ms: r.waitMs,
    window_ms: r.windowMs,
    source: r.source,
    error: Boolean(r.error),
  };
}

async function viaClient(c, rl) {
  return c.checks.length === 1 ? [await rl.check(...c.checks[0])] : rl.checkMany(c.checks);
}

// The middleware with a stand-in response: status 200 when it calls next().
function viaMiddleware(c, rl, opts) {
  return new Promise((resolve, reject) => {
    const headers = {};
    const res = {
      statusCode: 200,
      setHeader(name, value) { headers[name.toLowerCase()] = String(value); },
      end() { resolve({ status: this.statusCode, headers }); },
    };
    const mw = middleware(rl, { checks: () => c.checks, legacyHeaders: opts.legacy_headers });
    mw({ socket: {} }, res, (err) => (err ? reject(err) : resolve({ status: 200, headers })));
  }).then(({ status, headers }) => ({
    status,
    headers: Object.fromEntries(Object.entries(headers).filter(([k]) => RL.test(k))),
  }));
}

for (const c of loadCases()) {
  for (const way of ['client', 'middleware']) {
    test(`${way} ${c.name}`, async () => {
      const opts = { fail_open: true, legacy_headers: false, timeout_ms: 5000, ...(c.options || {}) };
      const fake = await new FakeDaemon(c.daemon, c.replies).listen();
      const rl = new Client({ socket: fake.path, timeoutMs: opts.timeout_ms, failOpen: opts.fail_open });
      try {
        const run = way === 'client' ? () => viaClient(c, rl) : () => viaMiddleware(c, rl, opts);
        const e = c.expect;
        if (e.raises) {
          await assert.rejects(run(), (err) => err instanceof RequestError && err.code === e.raises);
        } else if (way === 'client') {
          assert.deepEqual((await run()).map(asPlain), e.results);
        } else {
          const got = await run();
          assert.equal(got.status, e.status);
          const want = Object.fromEntries(Object.entries(e.headers).map(([k, v]) => [k.toLowerCase(), v]));
          assert.deepEqual(got.headers, want);
        }
        if (c.requests) assert.deepEqual(fake.requests, c.requests);
        if (c.daemon === 'stall' || c.daemon === 'close') assert.equal(fake.connections, 1, 'no retry');
      } finally {
        rl.close();
        await fake.close();
      }
    });
  }
}
