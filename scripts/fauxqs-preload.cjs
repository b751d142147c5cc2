// Loaded into fauxqs (node --require) by scripts/test-sqs.sh.
//
// 1. fauxqs listens on 0.0.0.0 and has no bind-address option: every
//    listen() of the process is turned into one on 127.0.0.1.
// 2. With IDEM_FAUXQS_MANUAL_CLOCK=1 the clock fauxqs keeps its visibility
//    timeouts and delays by (Date.now) stands still and is set by the tests:
//    GET /__idem/clock?ms=N sets it to N (ms since the epoch) and answers
//    the clock; GET /__idem/clock reads it. The delivery suite drives it
//    with its fake clock (test/sqs/sqs_delivery_suite_test.cc). Waits
//    (long polling) still take real time.
//
// 3. fauxqs imports node:sqlite (for its optional persistence, unused here),
//    which Node before 22.5 lacks (Debian 12's Node is 18, NodeSource's 20):
//    there the import gets a stub that refuses to open a database.
"use strict";
try {
  require("node:sqlite");
} catch {
  const stub = "export class DatabaseSync { constructor() { throw new Error('node:sqlite is not in this Node'); } }";
  const hooks =
    "export async function resolve(specifier, context, next) {" +
    "  if (specifier === 'node:sqlite') return { url: 'data:text/javascript,' + encodeURIComponent(" +
    JSON.stringify(stub) +
    "), shortCircuit: true };" +
    "  return next(specifier, context); }";
  require("node:module").register("data:text/javascript," + encodeURIComponent(hooks));
}
const net = require("net");
const listen = net.Server.prototype.listen;
net.Server.prototype.listen = function (...args) {
  if (args.length > 0 && args[0] !== null && typeof args[0] === "object" && args[0].path === undefined) {
    args[0] = Object.assign({}, args[0], { host: "127.0.0.1" });
  } else if (typeof args[0] === "number" || (typeof args[0] === "string" && /^\d+$/.test(args[0]))) {
    if (typeof args[1] === "string") args[1] = "127.0.0.1";
    else args.splice(1, 0, "127.0.0.1");
  }
  return listen.apply(this, args);
};

if (process.env.IDEM_FAUXQS_MANUAL_CLOCK === "1") {
  let now = Date.now();
  Date.now = () => now;
  const http = require("http");
  const emit = http.Server.prototype.emit;
  http.Server.prototype.emit = function (event, req, res) {
    if (event === "request" && req.url.startsWith("/__idem/clock")) {
      const m = /[?&]ms=(\d+)/.exec(req.url);
      if (m) now = Number(m[1]);
      res.writeHead(200, { "content-type": "text/plain" });
      res.end(String(now));
      return true;
    }
    return emit.apply(this, arguments);
  };
}
