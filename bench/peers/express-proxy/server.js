'use strict';
// The peer proxy `idem gateway` is compared with: what a user could put in
// front of an API from npm instead. express 5 + express-idempotency (its
// records in Redis through express-idempotency-redis-adapter, as the
// express peer of bench/peers/http-vs-express.sh runs it) in front of
// http-proxy-middleware. express-idempotency stores what res.send() sends,
// so the proxy buffers the upstream's answer and sends it with res.send();
// a replay is answered by the middleware and not proxied (isHit); a proxy
// error frees the key (reportError), as the package's README asks.
//   PORT=8081 UPSTREAM=http://127.0.0.1:3000 UPSTREAM_TIMEOUT_MS=400 REDIS_URL=redis://127.0.0.1:6379/3 \
//     NODE_PATH=<dir>/node_modules node server.js
const express = require('express');
const { idempotency, getSharedIdempotencyService } = require('express-idempotency');
const RedisAdapter = require('express-idempotency-redis-adapter').default;
const { createProxyMiddleware, fixRequestBody } = require('http-proxy-middleware');

const PORT = Number(process.env.PORT);
const UPSTREAM = process.env.UPSTREAM;
const TIMEOUT = Number(process.env.UPSTREAM_TIMEOUT_MS || 30000);
const REDIS_URL = process.env.REDIS_URL;

async function main() {
  let dataAdapter;
  if (REDIS_URL) {
    dataAdapter = new RedisAdapter({ connectionConfig: { url: REDIS_URL } });
    await dataAdapter.connect();
  }
  const service = () => getSharedIdempotencyService();
  const proxy = createProxyMiddleware({
    target: UPSTREAM,
    proxyTimeout: TIMEOUT,
    selfHandleResponse: true,
    on: {
      proxyReq: fixRequestBody,
      proxyRes: (proxyRes, _req, res) => {
        const chunks = [];
        proxyRes.on('data', (c) => chunks.push(c));
        proxyRes.on('end', () => {
          res.status(proxyRes.statusCode);
          if (proxyRes.headers['content-type']) res.set('Content-Type', proxyRes.headers['content-type']);
          res.send(Buffer.concat(chunks).toString('utf8'));  // a string: stored and replayed as it is
        });
      },
      error: (err, req, res) => {
        service().reportError(req).catch(() => {}).finally(() => {
          if (!res.headersSent) res.status(502).type('text').send(`upstream: ${err.code || err.message}`);
        });
      },
    },
  });
  const app = express();
  app.get('/health', (_req, res) => res.type('text').send('ok'));
  app.use(express.json());
  app.post(/.*/, idempotency(dataAdapter ? { dataAdapter } : {}), (req, res, next) => {
    if (service().isHit(req)) return;  // replayed by the middleware
    proxy(req, res, next);
  });
  // Keep the status the middleware chose (409 in progress, 417 misuse).
  app.use((err, _req, res, _next) => {
    if (res.statusCode < 400) res.status(500);
    res.type('text').send(String(err.message));
  });
  app.listen(PORT, '127.0.0.1');
}

main().catch((e) => {
  console.error(e);
  process.exit(1);
});
