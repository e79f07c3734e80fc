'use strict';
// A tiny HTTP server rate-limited per client address through ratelimitd.
//   node example.js /run/ratelimitd/ratelimitd.sock 8080 rides_request
const http = require('node:http');
const { Client } = require('./ratelimitd');

const [socket, port, rule] = process.argv.slice(2);
const rl = new Client({ socket });

http.createServer(async (req, res) => {
  const r = await rl.check(rule, req.socket.remoteAddress);
  res.writeHead(r.allowed ? 200 : 429, r.headers());
  res.end(r.allowed ? 'hello\n' : 'slow down\n');
}).listen(Number(port), '127.0.0.1');
