'use strict';
// Test helpers: the package under test (the installed copy when run from the scratch
// project), a real daemon driven by clients/testdaemon.sh, the shared conformance
// table and its scripted stand-in daemon.
const { execFileSync } = require('node:child_process');
const fs = require('node:fs');
const net = require('node:net');
const os = require('node:os');
const path = require('node:path');

const pkg = require('ratelimitd');

const CLIENTS = process.env.RL_CLIENTS_DIR || path.join(__dirname, '..', '..');
const TESTDAEMON = path.join(CLIENTS, 'testdaemon.sh');

function tmpdir(prefix) {
  return fs.mkdtempSync(path.join(process.env.RL_TEST_ROOT || os.tmpdir(), prefix));
}

/** One table of clients/conformance.json: cases, several_cases, several_header_cases. */
function loadCases(table = 'cases') {
  return JSON.parse(fs.readFileSync(path.join(CLIENTS, 'conformance.json'), 'utf8'))[table];
}

/** A real daemon (redis.mode = "none") in a temp dir. */
class Daemon {
  constructor() {
    this.dir = tmpdir('rl-node-');
    this.socket = path.join(this.dir, 'rl.sock');
    this.start();
  }

  run(cmd) { execFileSync('bash', [TESTDAEMON, cmd, this.dir], { stdio: 'inherit', timeout: 30000 }); }

  start() { this.run('start'); }

  stop() { this.run('stop'); }

  pause() { this.run('pause'); }

  resume() { this.run('resume'); }
}

/**
 * The conformance table's stand-in daemon: 'reply' answers the i-th request line of a
 * connection with replies[i] (closing after ERR BUSY/PERM), 'stall' never answers,
 * 'close' closes after reading, 'absent' has no socket. Records the request lines.
 */
class FakeDaemon {
  constructor(mode, replies = []) {
    this.mode = mode;
    this.replies = replies;
    this.path = path.join(tmpdir('rl-node-fake-'), 'fake.sock');
    this.requests = [];
    this.connections = 0;
    this.socks = new Set();
    this.server = null;
  }

  async listen() {
    if (this.mode === 'absent') return this;
    this.server = net.createServer((sock) => this._serve(sock));
    await new Promise((resolve) => this.server.listen(this.path, resolve));
    return this;
  }

  _serve(sock) {
    this.connections += 1;
    this.socks.add(sock);
    sock.on('close', () => this.socks.delete(sock));
    sock.on('error', () => {});
    let buf = '';
    let i = 0;
    sock.on('data', (chunk) => {
      buf += chunk.toString('latin1');
      let nl;
      while ((nl = buf.indexOf('\n')) >= 0) {
        const line = buf.slice(0, nl);
        buf = buf.slice(nl + 1);
        this.requests.push(line);
        if (this.mode === 'close') { sock.destroy(); return; }
        if (this.mode === 'stall' || i >= this.replies.length) continue;
        const reply = this.replies[i++];
        sock.write(`${reply}\n`);
        if (/^ERR (BUSY|PERM)/.test(reply)) { sock.end(); return; }
      }
    });
  }

  async close() {
    for (const s of this.socks) s.destroy();
    if (this.server) await new Promise((resolve) => this.server.close(resolve));
  }
}

module.exports = { pkg, Daemon, FakeDaemon, loadCases, tmpdir };
