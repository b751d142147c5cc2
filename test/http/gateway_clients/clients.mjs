// Real HTTP clients with retries through `idem gateway` (in
// gateway_clients_test.sh), with the first answer for every key lost on
// its way back (a TCP proxy here cuts the connection once the gateway has
// answered): Stripe's Node client (`stripe`, maxNetworkRetries; it adds an
// Idempotency-Key to every POST itself), and got (retry for POST, our own
// Idempotency-Key). Every key must run once upstream, every client must get
// the answer of that one run, and a later repeat must replay it byte for
// byte with Idempotent-Replayed: true.
//   node clients.mjs NPM_DIR GATEWAY_PORT UPSTREAM_PORT
// Prints one JSON line; "FAIL ..." lines and exit 1 when a check fails.
import net from 'node:net';
import { createRequire } from 'node:module';
import path from 'node:path';

const [npmDir, gatewayPort, upstreamPort] = process.argv.slice(2);
const require = createRequire(path.join(npmDir, 'node_modules', 'x.js'));
const Stripe = require('stripe');
const { default: got } = await import(path.join(npmDir, 'node_modules', 'got', 'dist', 'source', 'index.js'));

const failures = [];
const check = (ok, what) => { if (!ok) failures.push(what); };

// The lossy hop to `port`: the first answer to a request carrying a key
// not seen before is cut (RST both ways) once it is on its way back.
let lost = 0;
async function lossyProxy(port) {
  const seenKeys = new Set();
  const proxy = net.createServer((client) => {
    const server = net.connect(Number(port), '127.0.0.1');
    let loseNext = false;
    client.on('data', (d) => {
      const m = /^idempotency-key:\s*(.+?)\r$/im.exec(d.toString('latin1'));
      if (m && !seenKeys.has(m[1])) { seenKeys.add(m[1]); loseNext = true; }
      server.write(d);
    });
    server.on('data', (d) => {
      if (loseNext) {
        loseNext = false;
        lost += 1;
        client.resetAndDestroy();
        server.destroy();
        return;
      }
      client.write(d);
    });
    const end = () => { client.destroy(); server.destroy(); };
    client.on('error', end); server.on('error', end); client.on('close', end); server.on('close', end);
  });
  await new Promise((r) => proxy.listen(0, '127.0.0.1', r));
  return proxy;
}
const lossy = await lossyProxy(gatewayPort);
const lossyPort = lossy.address().port;

const N = 30;
const gatewayUrl = `http://127.0.0.1:${gatewayPort}`;

// Stripe's client: half with the caller's keys, half with the keys it makes.
const connect = (port) => ({ host: '127.0.0.1', port, protocol: 'http' });
const stripe = new Stripe('sk_test_gateway', { ...connect(lossyPort), maxNetworkRetries: 8 });
const stripeKeys = new Map();  // key -> requests sent with it
stripe.on('request', (e) => stripeKeys.set(e.idempotency_key, (stripeKeys.get(e.idempotency_key) || 0) + 1));
const params = (i) => ({ amount: 1000 + i, currency: 'usd', customer: `cus_${i % 3}` });
const charges = await Promise.all(Array.from({ length: N }, (_, i) =>
  i % 2 === 0 ? stripe.charges.create(params(i), { idempotencyKey: `stripe-${i}` })
              : stripe.charges.create(params(i))));
check(new Set(charges.map((c) => c.id)).size === N, `stripe: ${N} distinct charges`);
charges.forEach((c, i) => check(c.object === 'charge' && c.amount === 1000 + i, `stripe: charge ${i} as asked`));
check([...stripeKeys.values()].every((n) => n >= 2), 'stripe: every key was sent again after its lost answer');
// A later repeat (straight to the gateway) replays the charge.
const direct = new Stripe('sk_test_gateway', { ...connect(Number(gatewayPort)), maxNetworkRetries: 0 });
for (let i = 0; i < N; i += 2) {
  const again = await direct.charges.create(params(i), { idempotencyKey: `stripe-${i}` });
  check(again.id === charges[i].id, `stripe: a repeat of stripe-${i} is the same charge`);
  check(again.lastResponse.headers['idempotent-replayed'] === 'true', `stripe: stripe-${i} replayed`);
}

// got: POST retried on a reset connection, with our key.
const gotKeys = Array.from({ length: N }, (_, i) => `"got-${i}"`);
const gotRetries = new Map();
const post = (url, i) => got.post(`${url}/v1/charges`, {
  json: { amount: 2000 + i, currency: 'eur' },
  headers: { 'Idempotency-Key': gotKeys[i], Authorization: 'Bearer got-client' },
  retry: { limit: 8, methods: ['POST'], backoffLimit: 200 },
  hooks: { beforeRetry: [() => gotRetries.set(i, (gotRetries.get(i) || 0) + 1)] },
});
const gotAnswers = await Promise.all(gotKeys.map((_, i) => post(`http://127.0.0.1:${lossyPort}`, i)));
check(gotAnswers.every((r) => r.statusCode === 201), 'got: every POST 201');
check(gotRetries.size === N, `got: every key retried after its lost answer (${gotRetries.size} of ${N})`);
for (let i = 0; i < N; i += 1) {
  const again = await post(gatewayUrl, i);
  check(again.body === gotAnswers[i].body, `got: a repeat of ${gotKeys[i]} has the same body`);
  check(again.headers['idempotent-replayed'] === 'true', `got: ${gotKeys[i]} replayed`);
}

// The upstream ran each key once: Stripe's keys and ours.
const stats = await got(`http://127.0.0.1:${upstreamPort}/stats`).json();
const keys = [...stripeKeys.keys(), ...gotKeys];
for (const k of keys) check(stats.executions[k] === 1, `upstream ran ${k} ${stats.executions[k] || 0} times, not once`);
check(stats.total === keys.length, `upstream executions ${stats.total}, keys ${keys.length}`);
check(lost >= 2 * N, `answers lost: ${lost}`);

// The control: the same retries straight at the upstream (no gateway) run
// each key twice, so the counts above are the gateway's doing.
const bare = await lossyProxy(upstreamPort);
const controlKeys = [0, 1, 2, 3].map((i) => `"control-${i}"`);
await Promise.all(controlKeys.map((k, i) => got.post(`http://127.0.0.1:${bare.address().port}/v1/charges`, {
  json: { amount: 3000 + i, currency: 'eur' }, headers: { 'Idempotency-Key': k },
  retry: { limit: 8, methods: ['POST'], backoffLimit: 200 },
})));
const after = await got(`http://127.0.0.1:${upstreamPort}/stats`).json();
for (const k of controlKeys) check(after.executions[k] === 2, `control: without the gateway ${k} ran ${after.executions[k]} times, 2 expected`);
bare.close();

console.log(JSON.stringify({ keys: keys.length, upstream_executions: stats.total, answers_lost: lost,
  stripe_requests: [...stripeKeys.values()].reduce((a, b) => a + b, 0),
  got_retries: [...gotRetries.values()].reduce((a, b) => a + b, 0) }));
for (const f of failures) console.log(`FAIL ${f}`);
lossy.close();
process.exit(failures.length ? 1 : 0);
