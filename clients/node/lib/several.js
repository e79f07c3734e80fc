'use strict';
/**
 * Several limits in one request (CHECKALL: all or nothing) and refunds, added to the
 * Client: `await rl.checkAll([['burst', user, 1], ['daily', user, 1]])` is allowed only
 * if every limit allows, and then each is taken; on a deny none is. Its result is the
 * binding limit's, `rule` naming it. `await rl.refund('daily', user, 1)` gives a unit
 * back (never beyond the limit) and resolves to the key's state after it.
 */

const { Client, Batch } = require('./client');
const { RequestError, encodeKey, requestLine, responseHeaders, policyList } = require('./result');

/** Most triples one checkAll may carry. */
const MAX_TRIPLES = 8;

/**
 * @param {Array<[string, string, number?]>} triples 1 to 8 [rule, key, cost = 1]
 * @returns {Promise<Result>} the binding triple's result, `rule` set to its rule
 */
Client.prototype.checkAll = function checkAll(triples) {
  return this.checkAllPolicies(triples, false).then(([binding]) => binding);
};

/**
 * checkAll plus, in the same round trip, one check of cost 0 (it takes nothing) per
 * distinct rule when the triples name more than one: resolves to [binding, policies],
 * the policies in the order the rules first appear, for allOrNothingHeaders to list
 * every policy. One that could not be read is client-decided (left out of the headers).
 * @param {Array<[string, string, number?]>} triples 1 to 8 [rule, key, cost = 1]
 * @param {boolean} [withPolicies=true]
 */
Client.prototype.checkAllPolicies = function checkAllPolicies(triples, withPolicies = true) {
  return new Promise((resolve, reject) => {
    if (!Array.isArray(triples) || triples.length < 1 || triples.length > MAX_TRIPLES) {
      reject(new RequestError('PROTO', `checkAll takes 1 to ${MAX_TRIPLES} [rule, key, cost] triples`));
      return;
    }
    let line = 'CHECKALL';
    for (const [rule, key, cost = 1] of triples) line += ` ${rule} ${encodeKey(key)} ${cost}`;
    const asks = withPolicies ? policyChecks(triples) : [];
    const payload = `${line}\n${asks.map(([rule, key]) => requestLine(rule, key, 0)).join('')}`;
    const batch = new Batch([triples[0][0], ...asks.map(([rule]) => rule)], payload, (rs) => {
      // The daemon names the binding rule after window_ms (the eighth field).
      const binding = rs[0];
      const f = (batch.lines[0] || '').trim().split(/[ \t]+/);
      if (!binding.fromClient && f.length >= 8) binding.rule = f[7];
      resolve([binding, rs.slice(1)]);
    }, reject, false, Date.now() + this.timeoutMs);
    this._send(batch);
  });
};

/** One [rule, key] per distinct rule (its first key), or none for a single rule. */
function policyChecks(triples) {
  const first = new Map();
  for (const [rule, key] of triples) if (!first.has(rule)) first.set(rule, key);
  return first.size < 2 ? [] : [...first];
}

/** Gives up to `units` back to `key` under `rule`; resolves to its state after it. */
Client.prototype.refund = function refund(rule, key, units) {
  return new Promise((resolve, reject) => {
    this._send(new Batch([rule], `REFUND ${rule} ${encodeKey(key)} ${units}\n`, resolve, reject,
      true, Date.now() + this.timeoutMs));
  });
};

/**
 * The headers of a request decided by checkAllPolicies: those of `binding` (see
 * responseHeaders), with RateLimit-Policy listing every rule from `binding` and the
 * cost-0 results (see policyList in lib/result.js).
 */
function allOrNothingHeaders(binding, policies, opts = {}) {
  const h = responseHeaders([binding], opts);
  if (!binding.fromClient) h['RateLimit-Policy'] = policyList(binding, policies);
  return h;
}

module.exports = { MAX_TRIPLES, allOrNothingHeaders };
