'use strict';
// Node: ratelimitd's client against rate-limiter-flexible (RateLimiterRedis on an
// ioredis Cluster), from one process, IN_FLIGHT callers each awaiting one decision
// after another. The two are measured in alternating slices (A B B A ...) of SLICE
// seconds, PAIRS pairs, after a warm-up of each, so that load from anything else on
// the machine falls on both alike; the ratio is the median of the per-pair ratios.
//   node node_bench.js <socket> <rule> <host:port,...> spread|hot
// Prints one JSON line.
const { Client } = require('ratelimitd');
const { closedLoop, rlfLimiter } = require('./closed_loop');

const [socket, rule, nodeList, keys] = process.argv.slice(2);
const SLICE = Number(process.env.SLICE || 2) * 1000;
const PAIRS = Number(process.env.PAIRS || 5);
const IN_FLIGHT = Number(process.env.IN_FLIGHT || 64);
const KEYSPACE = 100000;
const keyOf = keys === 'hot' ? () => 'hot' : () => `k${Math.floor(Math.random() * KEYSPACE)}`;

async function measure(decide, ms) {
  const { n, secs, errors } = await closedLoop(decide, keyOf, ms, IN_FLIGHT, true);
  return { rate: n / secs, errors };
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
  const { cluster, consume: rlf } = rlfLimiter(nodeList);
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
