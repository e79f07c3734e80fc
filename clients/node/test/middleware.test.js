'use strict';
// A plain node:http server behind the middleware, against a real daemon: 200 until
// the rule's limit (5) is used, then 429 with the headers (and Express, when the
// scratch project has it installed).
const test = require('node:test');
const assert = require('node:assert/strict');
const http = require('node:http');
const { pkg, Daemon } = require('./support');

const { Client, middleware } = pkg;

function get(port, pathname, headers = {}) {
  return new Promise((resolve, reject) => {
    http.get({ host: '127.0.0.1', port, path: pathname, headers }, (res) => {
      let body = '';
      res.on('data', (c) => { body += c; });
      res.on('end', () => resolve({ status: res.statusCode, headers: res.headers, body }));
    }).on('error', reject);
  });
}

async function serve(handler) {
  const server = http.createServer(handler);
  await new Promise((resolve) => server.listen(0, '127.0.0.1', resolve));
  return server;
}

function assertLimited(rs, policy = '"api";q=5;w=5000') {
  assert.deepEqual(rs.map((r) => r.status), [200, 200, 200, 200, 200, 429]);
  assert.equal(rs[0].body, 'hello');
  assert.equal(rs[0].headers.ratelimit, '"api";r=4;t=1000');
  const last = rs[5].headers;
  assert.equal(last['ratelimit-policy'], policy);
  assert.match(last.ratelimit, /^"api";r=0;t=\d+$/);
  assert.match(last['retry-after'], /^\d+$/);
}

test('node:http server gets 429 with headers once the limit is used', async () => {
  const d = new Daemon();
  const rl = new Client({ socket: d.socket, timeoutMs: 5000 });
  const limit = middleware(rl, {
    rule: 'api',
    key: (req) => (req.url === '/health' ? null : req.headers['x-user'] || 'anon'),
    legacyHeaders: true,
  });
  const server = await serve((req, res) => limit(req, res, (err) => {
    if (err) { res.statusCode = 500; res.end(String(err)); return; }
    res.end('hello');
  }));
  try {
    const { port } = server.address();
    const rs = [];
    for (let i = 0; i < 6; i++) rs.push(await get(port, '/', { 'X-User': 'http' }));
    assertLimited(rs);
    assert.equal(rs[5].headers['x-ratelimit-remaining'], '0');
    assert.equal((await get(port, '/health')).status, 200);
    assert.equal((await get(port, '/', { 'X-User': 'other' })).status, 200);
  } finally {
    server.close();
    rl.close();
    d.stop();
  }
});

test('a caller bug (unknown rule) goes to next(err)', async () => {
  const d = new Daemon();
  const rl = new Client({ socket: d.socket, timeoutMs: 5000 });
  try {
    const err = await new Promise((resolve) => {
      middleware(rl, { rule: 'nope', key: () => 'k' })({ socket: {} }, { setHeader() {} }, resolve);
    });
    assert.equal(err.code, 'RULE');
  } finally {
    rl.close();
    d.stop();
  }
});

let express = null;
try { express = require('express'); } catch { /* optional */ }

test('express app gets 429 with headers', { skip: express ? false : 'express not installed' }, async () => {
  const d = new Daemon();
  const rl = new Client({ socket: d.socket, timeoutMs: 5000 });
  const app = express();
  app.use(middleware(rl, { checks: (req) => [['fast', 'express'], ['api', req.get('x-user') || 'anon']] }));
  app.get('/', (req, res) => res.send('hello'));
  const server = await serve(app);
  try {
    const { port } = server.address();
    const rs = [];
    for (let i = 0; i < 6; i++) rs.push(await get(port, '/', { 'X-User': 'express' }));
    // "api" is the most restrictive of the two rules; RateLimit-Policy lists both.
    assertLimited(rs, '"fast";q=1000000;w=1, "api";q=5;w=5000');
  } finally {
    server.close();
    rl.close();
    d.stop();
  }
});
