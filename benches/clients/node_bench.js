'use strict';
// One closed-loop measurement from one Node process: IN_FLIGHT concurrent callers,
// each awaiting one decision after another, for DURATION seconds after a warm-up.
//   node node_bench.js rld <socket> <rule> spread|hot
//   node node_bench.js rlf <host:port,...> - spread|hot     (rate-limiter-flexible, ioredis Cluster)
// Prints one JSON line: decisions per second, the sources seen (ratelimitd), errors.
const [impl, target, rule, keys] = process.argv.slice(2);
const DURATION = Number(process.env.DURATION || 5) * 1000;
const WARMUP = Number(process.env.WARMUP || 1) * 1000;
const IN_FLIGHT = Number(process.env.IN_FLIGHT || 64);
const KEYSPACE = 100000;

async function main() {
  let decide;
  let close = () => {};
  const sources = {};
  if (impl === 'rld') {
    const { Client } = require('ratelimitd');
    const rl = new Client({ socket: target, timeoutMs: 2000 });
    decide = async (key) => {
      const r = await rl.check(rule, key);
      sources[r.source] = (sources[r.source] || 0) + 1;
      if (!r.allowed) throw new Error(`denied: ${r.source} ${r.error}`);
    };
    close = () => rl.close();
  } else {
    const Redis = require('ioredis');
    const { RateLimiterRedis } = require('rate-limiter-flexible');
    const nodes = target.split(',').map((hp) => ({ host: hp.split(':')[0], port: Number(hp.split(':')[1]) }));
    const cluster = new Redis.Cluster(nodes, { enableOfflineQueue: true });
    const limiter = new RateLimiterRedis({ storeClient: cluster, points: 1e9, duration: 3600, keyPrefix: 'rlf' });
    decide = (key) => limiter.consume(key);
    close = () => cluster.disconnect();
  }
  const keyOf = keys === 'hot' ? () => 'hot' : () => `k${Math.floor(Math.random() * KEYSPACE)}`;
  let counting = false;
  let n = 0;
  let errors = 0;
  let stop = false;
  async function worker() {
    while (!stop) {
      try {
        await decide(keyOf());
        if (counting) n += 1;
      } catch (e) {
        errors += 1;
        if (errors < 3) console.error(String(e && e.message ? e.message : e));
      }
    }
  }
  const workers = Array.from({ length: IN_FLIGHT }, worker);
  await new Promise((r) => setTimeout(r, WARMUP));
  for (const k of Object.keys(sources)) delete sources[k];
  counting = true;
  const t0 = process.hrtime.bigint();
  await new Promise((r) => setTimeout(r, DURATION));
  counting = false;
  const secs = Number(process.hrtime.bigint() - t0) / 1e9;
  const done = n;
  stop = true;
  await Promise.all(workers);
  close();
  console.log(JSON.stringify({ impl, keys, in_flight: IN_FLIGHT, decisions_per_s: Math.round(done / secs), sources, errors }));
}

main().catch((e) => { console.error(e); process.exit(1); });
