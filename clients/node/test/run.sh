#!/usr/bin/env bash
# Installs the Node client the way its users do (npm pack, then npm install of the
# tarball into a scratch project, with Express, TypeScript and @types/node from npm
# for the Express and type tests when the registry answers) and runs its tests there with node's test runner (TAP
# summary). Needs RATELIMITD_BIN; RL_TEST_ROOT (default a new temp dir) holds the
# scratch project.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
pkg=$(cd "$here/.." && pwd)
root=${RL_TEST_ROOT:-$(mktemp -d)}
scratch=$root/node-scratch
[ -n "${HOME:-}" ] || export npm_config_cache=$root/npm-cache
rm -rf "$scratch"
mkdir -p "$scratch/test"
tgz=$(cd "$scratch" && npm pack --silent "$pkg")
cd "$scratch"
printf '{ "name": "scratch", "private": true, "version": "0.0.0" }\n' >package.json
npm install --silent --no-audit --no-fund "./$tgz"
npm install --silent --no-audit --no-fund express@4 typescript@5 @types/node@20 ||
  echo "node: express/typescript could not be installed; their tests are skipped" >&2
cp -r "$here"/*.js "$here"/*.mjs "$here/types" test/
RL_REQUIRE_INSTALLED=1 RL_CLIENTS_DIR=$(cd "$pkg/.." && pwd) node --test --test-reporter=tap test/ 2>&1
