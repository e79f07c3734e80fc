'use strict';
// rate-limiter-flexible (RateLimiterRedis on an ioredis Cluster) deciding one hot key,
// IN_FLIGHT callers each awaiting one decision after another, for SECONDS after a 1 s
// warm-up. Run by benches/leases.sh, three at once, as three application processes.
//   node peer_hot.js <host:port,...> <seconds>
// Prints one JSON line: decisions, seconds, errors.
const { closedLoop, rlfLimiter } = require('./closed_loop');

const [nodeList, seconds] = process.argv.slice(2);
const IN_FLIGHT = Number(process.env.IN_FLIGHT || 64);

async function main() {
  const { cluster, consume } = rlfLimiter(nodeList);
  const hot = () => 'hot';
  await closedLoop(consume, hot, 1000, IN_FLIGHT, false);
  const r = await closedLoop(consume, hot, Number(seconds) * 1000, IN_FLIGHT, false);
  console.log(JSON.stringify(r));
  cluster.disconnect();
}

main().catch((e) => {
  console.error(e);
  process.exit(1);
});
