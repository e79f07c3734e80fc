'use strict';
// The package's CommonJS entry point; index.mjs re-exports it for ESM.
const result = require('./lib/result');
const { Client } = require('./lib/client');
const { allOrNothingHeaders } = require('./lib/several'); // also Client#checkAll, #checkAllPolicies, #refund
const { middleware, clientAddress } = require('./lib/middleware');
const slots = require('./lib/slots');

module.exports = {
  Client,
  middleware,
  clientAddress,
  Result: result.Result,
  RequestError: result.RequestError,
  ReplyError: result.ReplyError,
  parseReply: result.parseReply,
  encodeKey: result.encodeKey,
  mostRestrictive: result.mostRestrictive,
  responseHeaders: result.responseHeaders,
  allOrNothingHeaders,
  statusFor: result.statusFor,
  DEFAULT_SOCKET: result.DEFAULT_SOCKET,
  acquire: slots.acquire,
  release: slots.release,
  withSlot: slots.withSlot,
  concurrencyMiddleware: slots.concurrencyMiddleware,
  Slot: slots.Slot,
};
