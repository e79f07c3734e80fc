// Types for the ratelimitd client (CommonJS and ESM entry points alike).
import type { IncomingMessage, ServerResponse } from 'node:http';

export declare const DEFAULT_SOCKET: string;

/** One decision; times in ms. */
export declare class Result {
  allowed: boolean;
  limit: number;
  remaining: number;
  resetMs: number;
  /** On DENY: ms until the same request could pass. On ALLOW: ms to wait first (leaky_bucket). */
  waitMs: number;
  /** The rule's policy window in ms; null from a daemon that does not send it. */
  windowMs: number | null;
  /** The daemon's (redis, cache, local, lease, fail_open, fail_closed) or client_fail_open / client_fail_closed. */
  source: string;
  rule: string;
  /** Why the client decided (daemon absent, timeout, ERR BUSY...); null when the daemon decided. */
  error: string | null;
  readonly fromClient: boolean;
  constructor(fields?: Partial<Result>);
  headers(opts?: HeaderOptions): Record<string, string>;
}

export interface HeaderOptions {
  /** Add X-RateLimit-Limit, X-RateLimit-Remaining, X-RateLimit-Reset. */
  legacyHeaders?: boolean;
}

/** The daemon rejected the request itself: ERR PROTO, RULE, KEY, COST or TOO_LONG. */
export declare class RequestError extends Error {
  code: 'PROTO' | 'RULE' | 'KEY' | 'COST' | 'TOO_LONG' | string;
  constructor(code: string, message: string);
}

/** A reply the client cannot use (ERR BUSY/PERM/INTERNAL, unreadable). */
export declare class ReplyError extends Error {}

/** [rule, key] or [rule, key, cost]. */
export type Check = [rule: string, key: string | Buffer, cost?: number];

export interface ClientOptions {
  /** Unix socket path; default /run/ratelimitd/ratelimitd.sock. */
  socket?: string;
  /** Bound on each call, connecting included; default 200. Never retried. */
  timeoutMs?: number;
  /** true (default): failures allow (client_fail_open); false: they deny (client_fail_closed). */
  failOpen?: boolean;
}

export declare class Client {
  path: string;
  timeoutMs: number;
  failOpen: boolean;
  /** The socket's path, or options. */
  constructor(opts?: ClientOptions | string);
  check(rule: string, key: string | Buffer, cost?: number): Promise<Result>;
  checkMany(checks: Check[]): Promise<Result[]>;
  /** 1 to 8 limits, all or nothing; the binding one's result (`rule` names it). */
  checkAll(triples: Check[]): Promise<Result>;
  /** checkAll plus one cost-0 check per distinct rule: [binding, each rule's state]. */
  checkAllPolicies(triples: Check[]): Promise<[Result, Result[]]>;
  /** Gives up to `units` back; the key's state after it. */
  refund(rule: string, key: string | Buffer, units: number): Promise<Result>;
  close(): void;
}

type Awaitable<T> = T | Promise<T>;

export interface MiddlewareOptions<Req = IncomingMessage> extends HeaderOptions {
  rule?: string | ((req: Req) => Awaitable<string | null | undefined>);
  /** null/undefined: this request is not checked. Default: the peer address. */
  key?: (req: Req) => Awaitable<string | Buffer | null | undefined>;
  cost?: number;
  /** Several rules per request instead of rule/key/cost. */
  checks?: (req: Req) => Awaitable<Check[] | null | undefined>;
  /** Decide the checks as one CHECKALL: a denied request takes nothing from any rule. */
  allOrNothing?: boolean;
  denyBody?: string;
}

export type NextFunction = (err?: unknown) => void;

export declare function middleware<Req extends IncomingMessage = IncomingMessage, Res extends ServerResponse = ServerResponse>(
  client: Client,
  opts: MiddlewareOptions<Req>,
): (req: Req, res: Res, next: NextFunction) => void;

export declare function clientAddress(req: IncomingMessage): string;
export declare function parseReply(line: string, rule?: string): Result;
export declare function encodeKey(key: string | Buffer): string;
export declare function mostRestrictive(results: Result[]): Result;
export declare function responseHeaders(results: Result[], opts?: HeaderOptions): Record<string, string>;
/** Headers of a checkAllPolicies decision: RateLimit-Policy lists every rule. */
export declare function allOrNothingHeaders(binding: Result, policies: Result[], opts?: HeaderOptions): Record<string, string>;
export declare function statusFor(results: Result[]): 200 | 429;

/** One ACQUIRE's answer (concurrency rules). */
export declare class Slot {
  allowed: boolean;
  rule: string;
  key: string;
  limit: number;
  remaining: number;
  waitMs: number;
  source: string;
  /** Names the slot for release; null when denied or decided by the client. */
  token: string | null;
  error: string | null;
  headers(): Record<string, string>;
}

export declare function acquire(client: Client, rule: string, key: string | Buffer): Promise<Slot>;
export declare function release(client: Client, slot: Slot): Promise<boolean>;
export declare function withSlot<T>(client: Client, rule: string, key: string | Buffer, fn: (slot: Slot) => Awaitable<T>): Promise<T>;
export declare function concurrencyMiddleware<Req extends IncomingMessage = IncomingMessage, Res extends ServerResponse = ServerResponse>(
  client: Client,
  opts: { rule: string; key: (req: Req) => string | Buffer | null | undefined; denyBody?: string },
): (req: Req, res: Res, next: NextFunction) => void;
