'use strict';
/**
 * Express/Connect-style middleware `(req, res, next)`, also usable from a plain
 * `http` server: checks each request; a denied one gets 429 with the rate-limit
 * headers and never reaches the handler, an allowed one carries the headers.
 */

const { responseHeaders, statusFor } = require('./result');

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
 *   restrictive setting the headers; legacyHeaders adds X-RateLimit-*. Callables may
 *   return promises.
 */
function middleware(client, opts = {}) {
  const { rule, key = clientAddress, cost = 1, checks, legacyHeaders = false, denyBody = DENY_BODY } = opts;
  if (checks && rule !== undefined) throw new TypeError('give either checks or rule/key, not both');
  if (!checks && rule === undefined) throw new TypeError('rule (a name or a function) or checks is required');
  const checksOf = checks
    ? async (req) => (await checks(req)) || []
    : async (req) => {
      const r = typeof rule === 'function' ? await rule(req) : rule;
      const k = await key(req);
      return r == null || k == null ? [] : [[r, k, cost]];
    };

  return function rateLimit(req, res, next) {
    checksOf(req)
      .then((list) => (list.length === 0 ? null : client.checkMany(list)))
      .then((results) => {
        if (results === null) return next();
        const headers = responseHeaders(results, { legacyHeaders });
        for (const [name, value] of Object.entries(headers)) res.setHeader(name, value);
        if (statusFor(results) !== 429) return next();
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
