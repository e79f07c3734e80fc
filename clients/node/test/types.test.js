'use strict';
// The package's types (index.d.ts) compile for a CommonJS and an ESM TypeScript
// consumer: tsc --strict, when the scratch project has typescript installed.
const test = require('node:test');
const assert = require('node:assert/strict');
const { spawnSync } = require('node:child_process');
const path = require('node:path');

let tsc = null;
try { tsc = require.resolve('typescript/bin/tsc'); } catch { /* optional */ }

test('index.d.ts compiles for CJS and ESM consumers', { skip: tsc ? false : 'typescript not installed' }, () => {
  const out = spawnSync(process.execPath, [tsc, '-p', path.join(__dirname, 'types')], { encoding: 'utf8' });
  assert.equal(out.status, 0, out.stdout + out.stderr);
});
