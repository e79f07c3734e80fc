'use strict';
// rate-limiter-flexible (RateLimiterRedis on an ioredis Cluster) deciding one hot key,
// IN_FLIGHT callers each awaiting one decision after another, for SECONDS after a 1 s
// warm-up. Run by benches/leases.sh, three at once, as three application processes.
//   node peer_hot.js <host:port,...> <seconds>
// Prints one JSON line: decisions, seconds, errors.
const Redis = require('ioredis');
const { RateLimiterRedis } = require('rate-limiter-flexible');

const [nodeList, seconds] = process.argv.slice(2);
const IN_FLIGHT = Number(process.env.IN_FLIGHT || 64);

async function run(consume, ms) {
  let n = 0;
  let errors = 0;
  const end = Date.now() + ms;
  const t0 = process.hrtime.bigint();
  async function worker() {
    while (Date.now() < end) {
      try {
        await consume('hot');
        n += 1;
      } catch (e) {
        errors += 1;
      }
    }
  }
  await Promise.all(Array.from({ length: IN_FLIGHT }, worker));
  return { n, secs: Number(process.hrtime.bigint() - t0) / 1e9, errors };
}

async function main() {
  const nodes = nodeList.split(',').map((hp) => ({ host: hp.split(':')[0], port: Number(hp.split(':')[1]) }));
  const cluster = new Redis.Cluster(nodes);
  const limiter = new RateLimiterRedis({ storeClient: cluster, points: 1e9, duration: 3600, keyPrefix: 'rlf' });
  const consume = (key) => limiter.consume(key);
  await run(consume, 1000);
  const r = await run(consume, Number(seconds) * 1000);
  console.log(JSON.stringify(r));
  cluster.disconnect();
}

main().catch((e) => {
  console.error(e);
  process.exit(1);
});
