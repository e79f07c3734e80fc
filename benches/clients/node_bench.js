'use strict';
// Node: ratelimitd's client against rate-limiter-flexible (RateLimiterRedis on an
// ioredis Cluster), from one process, IN_FLIGHT callers each awaiting one decision
// after another. The two are measured in alternating slices (A B B A ...) of SLICE
// seconds, PAIRS pairs, after a warm-up of each, so that load from anything else on
// the machine falls on both alike; the ratio is the median of the per-pair ratios.
//   node node_bench.js <socket> <rule> <host:port,...> spread|hot
// Prints one JSON line.
const { Client } = require('ratelimitd');
const Redis = require('ioredis');
const { RateLimiterRedis } = require('rate-limiter-flexible');

const [socket, rule, nodeList, keys] = process.argv.slice(2);
const SLICE = Number(process.env.SLICE || 2) * 1000;
const PAIRS = Number(process.env.PAIRS || 5);
const IN_FLIGHT = Number(process.env.IN_FLIGHT || 64);
const KEYSPACE = 100000;
const keyOf = keys === 'hot' ? () => 'hot' : () => `k${Math.floor(Math.random() * KEYSPACE)}`;

async function measure(decide, ms) {
  let n = 0;
  let errors = 0;
  const end = Date.now() + ms;
  const t0 = process.hrtime.bigint();
  async function worker() {
    while (Date.now() < end) {
      try {
        await decide(keyOf());
        n += 1;
      } catch (e) {
        errors += 1;
        if (errors < 3) console.error(String(e && e.message ? e.message : e));
      }
    }
  }
  await Promise.all(Array.from({ length: IN_FLIGHT }, worker));
  return { rate: n / (Number(process.hrtime.bigint() - t0) / 1e9), errors };
}

function median(xs) {
  const s = [...xs].sort((x, y) => x - y);
  const m = Math.floor(s.length / 2);
  return s.length % 2 ? s[m] : (s[m - 1] + s[m]) / 2;
}

async function main() {
  const rl = new Client({ socket, timeoutMs: 2000 });
  const sources = {};
  const rld = async (key) => {
    const r = await rl.check(rule, key);
    sources[r.source] = (sources[r.source] || 0) + 1;
    if (!r.allowed) throw new Error(`denied: ${r.source} ${r.error}`);
  };
  const nodes = nodeList.split(',').map((hp) => ({ host: hp.split(':')[0], port: Number(hp.split(':')[1]) }));
  const cluster = new Redis.Cluster(nodes);
  const limiter = new RateLimiterRedis({ storeClient: cluster, points: 1e9, duration: 3600, keyPrefix: 'rlf' });
  const rlf = (key) => limiter.consume(key);
  await measure(rld, 1000);
  await measure(rlf, 1000);
  for (const k of Object.keys(sources)) delete sources[k];
  const a = [];
  const b = [];
  let errors = 0;
  for (let i = 0; i < PAIRS; i++) {
    const order = i % 2 === 0 ? [[rld, a], [rlf, b]] : [[rlf, b], [rld, a]];
    for (const [decide, out] of order) {
      const m = await measure(decide, SLICE);
      out.push(m.rate);
      errors += m.errors;
    }
  }
  rl.close();
  cluster.disconnect();
  const ratios = a.map((x, i) => x / b[i]);
  console.log(JSON.stringify({
    lang: 'node',
    keys: process.env.LABEL || keys,
    in_flight: IN_FLIGHT,
    ratelimitd: Math.round(median(a)),
    peer: Math.round(median(b)),
    ratio: Number(median(ratios).toFixed(2)),
    ratios: ratios.map((r) => Number(r.toFixed(2))),
    sources,
    errors,
  }));
}

main().catch((e) => { console.error(e); process.exit(1); });
