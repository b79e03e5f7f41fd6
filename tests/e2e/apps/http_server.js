// node tests/e2e/apps/http_server.js ADDR PORT DIR: Node's http server
// (libuv: epoll, accept4, writev, and close(2) through syscall(SYS_close))
// answering GET /NAME with the file DIR/NAME (read once at start), keep-alive
// as the client asks. Prints "listening" once it listens; on SIGTERM or
// SIGINT it stops listening, drops its connections and exits 0 (exit(3):
// the library's exit handlers run and write its report's exit lines).
"use strict";
const http = require("http");
const fs = require("fs");
const path = require("path");

const [addr, port, dir] = process.argv.slice(2);
const files = new Map();
for (const name of fs.readdirSync(dir)) files.set("/" + name, fs.readFileSync(path.join(dir, name)));

let served = 0;
const server = http.createServer((req, res) => {
  const body = files.get(req.url.split("?")[0]);
  if (body === undefined) {
    res.writeHead(404, { "Content-Length": 0 });
    res.end();
    return;
  }
  served++;
  res.writeHead(200, { "Content-Length": body.length, "Content-Type": "application/octet-stream" });
  res.end(body);
});
server.keepAliveTimeout = 30000;
server.listen(Number(port), addr, () => console.log("listening"));

function stop(sig) {
  console.log(`${sig}: ${served} responses served`);
  server.close();
  if (server.closeAllConnections) server.closeAllConnections();
  process.exit(0);
}
process.on("SIGTERM", () => stop("SIGTERM"));
process.on("SIGINT", () => stop("SIGINT"));
