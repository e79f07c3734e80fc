// Compiled (not run) by types.test.js: the .d.ts serves a CommonJS TypeScript consumer.
import {
  Client, middleware, Result, RequestError, responseHeaders, allOrNothingHeaders, statusFor,
} from 'ratelimitd';
import * as http from 'node:http';

const rl = new Client({ socket: '/run/ratelimitd/ratelimitd.sock', timeoutMs: 100, failOpen: false });

export async function handle(req: http.IncomingMessage, res: http.ServerResponse): Promise<void> {
  const r: Result = await rl.check('api', 'user:42', 1);
  const windowMs: number | null = r.windowMs;
  const rs: Result[] = await rl.checkMany([['burst', 'user:42'], ['hourly', Buffer.from('k'), 2]]);
  const status: 200 | 429 = statusFor(rs);
  const headers: Record<string, string> = responseHeaders(rs, { legacyHeaders: true });
  res.writeHead(status, { ...headers, ...r.headers(), 'x-window': String(windowMs) });
  res.end();
}

export async function handleAll(res: http.ServerResponse): Promise<void> {
  const [binding, policies]: [Result, Result[]] = await rl.checkAllPolicies([['burst', 'user:42'], ['daily', 'user:42', 1]]);
  const one: Result = await rl.checkAll([['burst', 'user:42']]);
  const back: Result = await rl.refund('daily', 'user:42', 1);
  res.writeHead(binding.allowed ? 200 : 429, allOrNothingHeaders(binding, policies, { legacyHeaders: false }));
  res.end(`${one.rule} ${back.remaining}`);
}

export const both = middleware(rl, { allOrNothing: true, checks: (req) => [['burst', String(req.headers['x-user'])], ['daily', 'k', 1]] });

export const limit = middleware(rl, {
  rule: (req) => (req.url === '/health' ? null : 'api'),
  key: async (req) => String(req.headers['x-user'] ?? 'anon'),
  legacyHeaders: true,
});

http.createServer((req, res) => limit(req, res, (err?: unknown) => {
  if (err instanceof RequestError) res.statusCode = 500;
  res.end(err instanceof RequestError ? err.code : 'hello');
}));
