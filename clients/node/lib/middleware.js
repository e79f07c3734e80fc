'use strict';
/**
 * Express/Connect-style middleware `(req, res, next)`, also usable from a plain
 * `http` server: checks each request; a denied one gets 429 with the rate-limit
 * headers and never reaches the handler, an allowed one carries the headers.
 */

const { responseHeaders, statusFor } = require('./result');
const { allOrNothingHeaders } = require('./several');

const DENY_BODY = 'Too Many Requests\n';

/** The default key: the peer address (Express' req.ip when a proxy is trusted). */
function clientAddress(req) {
  return req.ip || (req.socket && req.socket.remoteAddress) || 'unknown';
}

/**
 * @param {import('./client').Client} client
 * @param {object} opts  rule (a name or (req) => name|null), key ((req) => key|null;
 *   null skips the check; default the peer address), cost (default 1); or checks
 *   ((req) => [[rule, key, cost], ...]) for several rules in one round trip, the most
 *   restrictive setting the headers; allOrNothing decides them as one CHECKALL instead
 *   (a denied request takes nothing from any rule; at most 8 checks, no lease = "auto"
 *   or concurrency rule): RateLimit names the binding rule, RateLimit-Policy lists every
 *   rule; legacyHeaders adds X-RateLimit-*. Callables may return promises.
 */
function middleware(client, opts = {}) {
  const {
    rule, key = clientAddress, cost = 1, checks, legacyHeaders = false, denyBody = DENY_BODY, allOrNothing = false,
  } = opts;
  if (checks && rule !== undefined) throw new TypeError('give either checks or rule/key, not both');
  if (!checks && rule === undefined) throw new TypeError('rule (a name or a function) or checks is required');
  const checksOf = checks
    ? async (req) => (await checks(req)) || []
    : async (req) => {
      const r = typeof rule === 'function' ? await rule(req) : rule;
      const k = await key(req);
      return r == null || k == null ? [] : [[r, k, cost]];
    };

  // The status and headers for one request's checks.
  const decide = allOrNothing
    ? (list) => client.checkAllPolicies(list).then(([binding, policies]) => ({
      status: binding.allowed ? 200 : 429, headers: allOrNothingHeaders(binding, policies, { legacyHeaders }),
    }))
    : (list) => client.checkMany(list).then((results) => ({
      status: statusFor(results), headers: responseHeaders(results, { legacyHeaders }),
    }));

  return function rateLimit(req, res, next) {
    checksOf(req)
      .then((list) => (list.length === 0 ? null : decide(list)))
      .then((decided) => {
        if (decided === null) return next();
        for (const [name, value] of Object.entries(decided.headers)) res.setHeader(name, value);
        if (decided.status !== 429) return next();
        res.statusCode = 429;
        res.setHeader('Content-Type', 'text/plain; charset=utf-8');
        res.end(denyBody);
        return undefined;
        // A RequestError (a caller bug) or a throwing callable goes to next(err); an
        // error thrown by the next handler itself is not caught here.
      }, next);
  };
}

module.exports = { middleware, clientAddress };
