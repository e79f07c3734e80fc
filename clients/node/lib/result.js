'use strict';
/**
 * What a decision is and how it reads on the wire and in HTTP: the reply parser, the
 * key encoding, the choice of the most restrictive result and the response headers.
 * Shared by the client and the middleware; no I/O here.
 */

const DEFAULT_SOCKET = '/run/ratelimitd/ratelimitd.sock';
// Daemon error codes that mean "this request is wrong" (reject) rather than "the
// daemon cannot serve you now" (fail open/closed).
const REQUEST_ERRORS = new Set(['PROTO', 'RULE', 'KEY', 'COST', 'TOO_LONG']);

/** The daemon rejected the request itself (ERR PROTO/RULE/KEY/COST/TOO_LONG): a caller bug. */
class RequestError extends Error {
  constructor(code, message) {
    super(`ratelimitd: ERR ${code} ${message}`);
    this.name = 'RequestError';
    this.code = code;
  }
}

/** A reply the client cannot use (ERR BUSY/PERM/INTERNAL, or unreadable): a daemon failure. */
class ReplyError extends Error {
  constructor(message) {
    super(message);
    this.name = 'ReplyError';
  }
}

/** One decision; times in ms. `source` is the daemon's or `client_fail_open|closed`. */
class Result {
  constructor(fields) {
    this.allowed = false;
    this.limit = 0;
    this.remaining = 0;
    this.resetMs = 0;
    this.waitMs = 0;
    this.windowMs = null;
    this.source = '';
    this.rule = '';
    this.error = null;
    if (fields !== undefined) Object.assign(this, fields);
  }

  /** True when the daemon did not decide (the client failed open or closed). */
  get fromClient() {
    return this.source.startsWith('client_');
  }

  /** The HTTP headers for this one result (see responseHeaders). */
  headers(opts) {
    return responseHeaders([this], opts);
  }
}

/** Percent-encodes every byte outside 0x21..0x7E, and `%` itself. */
function encodeKey(key) {
  const s = String(key);
  // Fast path: already printable ASCII without '%'.
  if (!Buffer.isBuffer(key) && /^[\x21-\x24\x26-\x7e]+$/.test(s)) return s;
  const bytes = Buffer.isBuffer(key) ? key : Buffer.from(s, 'utf8');
  let out = '';
  for (const b of bytes) {
    out += b >= 0x21 && b <= 0x7e && b !== 0x25
      ? String.fromCharCode(b)
      : '%' + b.toString(16).toUpperCase().padStart(2, '0');
  }
  return out;
}

function requestLine(rule, key, cost) {
  return `CHECK ${rule} ${encodeKey(key)} ${cost}\n`;
}

const INT = /^[0-9]+$/;
// A well-formed decision as the daemon writes it (single spaces): read with one match.
// Anything else goes through the general parser below, which says what is wrong.
const DECISION = /^(ALLOW|DENY) ([0-9]{1,15}) ([0-9]{1,15}) ([0-9]{1,15}) ([0-9]{1,15}) ([^ \t\r]+)(?: ([0-9]+))?(?:[ \t\r]|$)/;

/**
 * Parses a CHECK reply: six fields, an optional seventh window_ms (null when absent or
 * not a number), further trailing fields ignored. Throws RequestError for a request-error ERR, ReplyError otherwise.
 */
function parseReply(line, rule = '') {
  const m = DECISION.exec(line);
  if (m !== null) {
    // Up to 15 digits: a safe integer (longer ones take the general path).
    const r = new Result();
    r.allowed = m[1] === 'ALLOW';
    r.limit = +m[2];
    r.remaining = +m[3];
    r.resetMs = +m[4];
    r.waitMs = +m[5];
    r.source = m[6];
    r.rule = rule;
    if (m[7] !== undefined && Number.isSafeInteger(+m[7])) r.windowMs = +m[7];
    return r;
  }
  const f = line.trim().split(/[ \t]+/);
  if (f[0] === 'ERR') {
    const code = f[1] || 'INTERNAL';
    if (REQUEST_ERRORS.has(code)) throw new RequestError(code, f.slice(2).join(' '));
    throw new ReplyError(`daemon said: ${line.trim()}`);
  }
  const nums = f.slice(1, 5);
  if (f.length < 6 || (f[0] !== 'ALLOW' && f[0] !== 'DENY') || !nums.every((x) => INT.test(x))) {
    throw new ReplyError(`unexpected reply ${JSON.stringify(line)}`);
  }
  const n = nums.map(Number);
  if (!n.every(Number.isSafeInteger)) throw new ReplyError(`unexpected reply ${JSON.stringify(line)}`);
  return new Result({
    allowed: f[0] === 'ALLOW',
    limit: n[0],
    remaining: n[1],
    resetMs: n[2],
    waitMs: n[3],
    source: f[5],
    rule,
    // A seventh field that is not a count (from some later protocol) means "unknown".
    windowMs: f.length > 6 && INT.test(f[6]) && Number.isSafeInteger(Number(f[6])) ? Number(f[6]) : null,
  });
}

/** The client's own decision when the daemon could not give one. */
function fallback(rule, failOpen, error) {
  return new Result({
    allowed: failOpen,
    source: failOpen ? 'client_fail_open' : 'client_fail_closed',
    rule,
    error: String(error),
  });
}

// Negative when a is more restrictive than b: any deny before any allow; a daemon's
// answer before the client's own; the longest wait (denied) or the fewest remaining
// (allowed); then the lowest remaining/limit ratio. Equal: 0 (the first one stays).
function compare(a, b) {
  if (a.allowed !== b.allowed) return a.allowed ? 1 : -1;
  if (a.fromClient !== b.fromClient) return a.fromClient ? 1 : -1;
  const main = a.allowed ? a.remaining - b.remaining : b.waitMs - a.waitMs;
  if (main !== 0) return main;
  const ratio = (r) => (r.limit > 0 ? r.remaining / r.limit : 0);
  return ratio(a) - ratio(b);
}

/** The result that sets the HTTP headers when one request checked several rules. */
function mostRestrictive(results) {
  if (results.length === 0) throw new Error('no results');
  let best = results[0];
  for (const r of results) if (compare(r, best) < 0) best = r;
  return best;
}

/** 429 when any result is denied, else 200. */
function statusFor(results) {
  return results.some((r) => !r.allowed) ? 429 : 200;
}

const ceilS = (ms) => Math.ceil(ms / 1000);
const sfString = (s) => `"${String(s).replace(/\\/g, '\\\\').replace(/"/g, '\\"')}"`;

/**
 * The RateLimit-Policy value: every distinct rule of `results` once, in order, joined by
 * ', '; the binding rule's `"<rule>";q=<limit>;w=<window_s>` from `binding`, another's from
 * its first daemon-decided result (a rule with none is left out). A binding rule not among
 * them (a composite rule's member) comes first.
 */
function policyList(binding, results) {
  const names = [];
  const first = new Map([[binding.rule, binding]]);
  for (const r of results) {
    if (!names.includes(r.rule)) names.push(r.rule);
    if (!r.fromClient && !first.has(r.rule)) first.set(r.rule, r);
  }
  if (!names.includes(binding.rule)) names.unshift(binding.rule);
  return names.filter((n) => first.has(n)).map((n) => {
    const r = first.get(n);
    return `${sfString(n)};q=${r.limit}${r.windowMs ? `;w=${ceilS(r.windowMs)}` : ''}`;
  }).join(', ');
}

/**
 * HTTP headers for one request's results: `RateLimit-Policy` listing every rule
 * (`"<rule>";q=<limit>;w=<window_s>`, see policyList), and from the most restrictive result
 * `RateLimit: "<rule>";r=<remaining>;t=<reset_s>` (IETF draft-ietf-httpapi-ratelimit-headers),
 * `Retry-After` (seconds) when denied, and with `legacyHeaders` the X-RateLimit-* trio.
 * None when the client failed open; only `Retry-After: 1` when it failed closed.
 */
function responseHeaders(results, { legacyHeaders = false } = {}) {
  if (results.length === 0) return {};
  const r = mostRestrictive(results);
  if (r.fromClient) return r.allowed ? {} : { 'Retry-After': '1' };
  const name = sfString(r.rule);
  const resetS = ceilS(r.resetMs);
  const h = {
    'RateLimit-Policy': policyList(r, results),
    'RateLimit': `${name};r=${r.remaining};t=${resetS}`,
  };
  if (!r.allowed) h['Retry-After'] = String(Math.max(1, ceilS(r.waitMs)));
  if (legacyHeaders) {
    h['X-RateLimit-Limit'] = String(r.limit);
    h['X-RateLimit-Remaining'] = String(r.remaining);
    h['X-RateLimit-Reset'] = String(resetS);
  }
  return h;
}

module.exports = {
  DEFAULT_SOCKET,
  REQUEST_ERRORS,
  RequestError,
  ReplyError,
  Result,
  encodeKey,
  requestLine,
  parseReply,
  fallback,
  mostRestrictive,
  statusFor,
  responseHeaders,
  policyList,
};
