'use strict';
/**
 * Several limits in one request (CHECKALL: all or nothing) and refunds, added to the
 * Client: `await rl.checkAll([['burst', user, 1], ['daily', user, 1]])` is allowed only
 * if every limit allows, and then each is taken; on a deny none is. Its result is the
 * binding limit's, `rule` naming it. `await rl.refund('daily', user, 1)` gives a unit
 * back (never beyond the limit) and resolves to the key's state after it.
 */

const { Client, Batch } = require('./client');
const { RequestError, encodeKey } = require('./result');

/** Most triples one checkAll may carry. */
const MAX_TRIPLES = 8;

/**
 * @param {Array<[string, string, number?]>} triples 1 to 8 [rule, key, cost = 1]
 * @returns {Promise<Result>} the binding triple's result, `rule` set to its rule
 */
Client.prototype.checkAll = function checkAll(triples) {
  return new Promise((resolve, reject) => {
    if (!Array.isArray(triples) || triples.length < 1 || triples.length > MAX_TRIPLES) {
      reject(new RequestError('PROTO', `checkAll takes 1 to ${MAX_TRIPLES} [rule, key, cost] triples`));
      return;
    }
    let line = 'CHECKALL';
    for (const [rule, key, cost = 1] of triples) line += ` ${rule} ${encodeKey(key)} ${cost}`;
    const batch = new Batch([triples[0][0]], `${line}\n`, (r) => {
      // The daemon names the binding rule after window_ms (the eighth field).
      const f = (batch.lines[0] || '').trim().split(/[ \t]+/);
      if (!r.fromClient && f.length >= 8) r.rule = f[7];
      resolve(r);
    }, reject, true, Date.now() + this.timeoutMs);
    this._send(batch);
  });
};

/** Gives up to `units` back to `key` under `rule`; resolves to its state after it. */
Client.prototype.refund = function refund(rule, key, units) {
  return new Promise((resolve, reject) => {
    this._send(new Batch([rule], `REFUND ${rule} ${encodeKey(key)} ${units}\n`, resolve, reject,
      true, Date.now() + this.timeoutMs));
  });
};

module.exports = { MAX_TRIPLES };
