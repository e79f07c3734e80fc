// The package's ESM entry point: the CommonJS implementation, re-exported by name.
import cjs from './index.js';

export const {
  Client, middleware, clientAddress, Result, RequestError, ReplyError, parseReply, encodeKey,
  mostRestrictive, responseHeaders, allOrNothingHeaders, statusFor, DEFAULT_SOCKET,
  acquire, release, withSlot, concurrencyMiddleware, Slot,
} = cjs;
export default cjs;
