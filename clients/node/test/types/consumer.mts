// Compiled (not run) by types.test.js: the .d.ts serves an ESM TypeScript consumer.
import { Client, middleware } from 'ratelimitd';
import ratelimitd from 'ratelimitd';

const rl = new Client();
const r = await rl.check('api', 'k');
const allowed: boolean = r.allowed;
const mw: ReturnType<typeof middleware> = ratelimitd.middleware(rl, { checks: () => [['api', 'k', 1]] });
export { allowed, mw };
