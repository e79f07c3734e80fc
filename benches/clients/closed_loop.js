'use strict';
// What the Node benchmarks share (node_bench.js, peer_hot.js; copied next to them into
// the directory where the peers are installed): the closed loop that drives a limiter,
// and rate-limiter-flexible set up as both measure it.
const Redis = require('ioredis');
const { RateLimiterRedis } = require('rate-limiter-flexible');

// `inFlight` callers, each awaiting `decide(keyOf())` one after another, for `ms` ms.
// A decision that throws counts as an error; the first two are printed to stderr when
// `logErrors`. Returns { n: decisions, secs: elapsed seconds, errors }.
async function closedLoop(decide, keyOf, ms, inFlight, logErrors) {
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
        if (logErrors && errors < 3) console.error(String(e && e.message ? e.message : e));
      }
    }
  }
  await Promise.all(Array.from({ length: inFlight }, worker));
  return { n, secs: Number(process.hrtime.bigint() - t0) / 1e9, errors };
}

// rate-limiter-flexible's RateLimiterRedis on an ioredis Cluster of `nodeList`
// ("host:port,..."), with a limit never reached (1e9 points an hour).
// Returns { cluster, consume(key) }.
function rlfLimiter(nodeList) {
  const nodes = nodeList.split(',').map((hp) => ({ host: hp.split(':')[0], port: Number(hp.split(':')[1]) }));
  const cluster = new Redis.Cluster(nodes);
  const limiter = new RateLimiterRedis({ storeClient: cluster, points: 1e9, duration: 3600, keyPrefix: 'rlf' });
  return { cluster, consume: (key) => limiter.consume(key) };
}

module.exports = { closedLoop, rlfLimiter };
