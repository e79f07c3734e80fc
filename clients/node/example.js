'use strict';
// A tiny HTTP server rate-limited per client address through ratelimitd; the same
// middleware goes into an Express or Connect app with app.use(limit).
//   npm install ./clients/node   (or the tarball from npm pack)
//   node example.js /run/ratelimitd/ratelimitd.sock 8080 rides_request
const http = require('node:http');
const { Client, middleware } = require('ratelimitd');

const [socket, port, rule] = process.argv.slice(2);
const limit = middleware(new Client({ socket }), { rule, key: (req) => req.socket.remoteAddress });

http.createServer((req, res) => limit(req, res, (err) => {
  res.statusCode = err ? 500 : 200;
  res.end(err ? 'error\n' : 'hello\n');
})).listen(Number(port), '127.0.0.1');
