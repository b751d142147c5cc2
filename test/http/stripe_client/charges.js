// Stripe's own Node.js client (the npm package `stripe`, vendored as
// stripe-23.2.0.tgz, npm's tarball unchanged) against `idem provider`'s
// /v1/charges, which loses the first response of about half the keys
// (--lose-responses): the client retries on its own (maxNetworkRetries) with
// its Idempotency-Key, and every charge is made once.
//   node charges.js STRIPE_PACKAGE_DIR PROVIDER_URL API_KEY
// Prints one JSON line of what it saw; exit 1 with "FAIL ..." lines when a
// check fails.
'use strict';
const [stripeDir, providerUrl, apiKey] = process.argv.slice(2);
const Stripe = require(stripeDir);
const url = new URL(providerUrl);
const connect = { host: url.hostname, port: url.port, protocol: 'http' };
const stripe = new Stripe(apiKey, { ...connect, maxNetworkRetries: 10 });

const failures = [];
const check = (ok, what) => { if (!ok) failures.push(what); };

// Requests the client sent, per Idempotency-Key (retries included).
const sent = new Map();
stripe.on('request', (e) => sent.set(e.idempotency_key, (sent.get(e.idempotency_key) || 0) + 1));

const N = 40;
const params = (i) => ({ amount: 1000 + i, currency: 'usd', customer: `cus_${i % 4}`,
                         description: `order ${i}, "quoted" & more` });

(async () => {
  // Half with the caller's own keys, half with the keys the client makes.
  const made = await Promise.all(Array.from({ length: N }, (_, i) =>
    i % 2 === 0 ? stripe.charges.create(params(i), { idempotencyKey: `order-${i}` })
                : stripe.charges.create(params(i))));
  const ids = new Set(made.map((c) => c.id));
  check(ids.size === N, `${N} distinct charges expected, got ${ids.size}`);
  made.forEach((c, i) => {
    check(c.object === 'charge' && c.amount === 1000 + i && c.currency === 'usd' && c.status === 'succeeded' &&
          c.customer === `cus_${i % 4}` && c.description === params(i).description,
          `charge ${i} reads back as asked: ${JSON.stringify(c)}`);
  });
  const retried = [...sent.values()].filter((n) => n > 1).length;
  check(retried > 0, 'some responses were lost and retried by the client');

  // The caller retries later with the same key: the same charge, replayed.
  const again = await stripe.charges.create(params(0), { idempotencyKey: 'order-0' });
  check(again.id === made[0].id, 'a later retry with the key gets the same charge');
  check(again.lastResponse.headers['idempotent-replayed'] === 'true', 'the retry is marked Idempotent-Replayed');
  // The same parameters in another order are the same request (the form body is canonicalised).
  const p2 = params(2);
  const reordered = await stripe.charges.create(
      { description: p2.description, customer: p2.customer, currency: p2.currency, amount: p2.amount },
      { idempotencyKey: 'order-2' });
  check(reordered.id === made[2].id, 'the same parameters in another order replay the charge');

  // The key with other parameters: Stripe's idempotency error, not a second charge.
  let conflict = null;
  try {
    await stripe.charges.create({ ...params(4), amount: 1 }, { idempotencyKey: 'order-4' });
  } catch (e) {
    conflict = e;
  }
  check(conflict && conflict.type === 'StripeIdempotencyError' && conflict.statusCode === 400,
        `a reused key is StripeIdempotencyError 400, got ${conflict && conflict.type} ${conflict && conflict.statusCode}`);

  // Bad parameters: StripeInvalidRequestError naming the parameter, nothing made.
  for (const [bad, param] of [[{ amount: -5, currency: 'usd' }, 'amount'], [{ currency: 'usd' }, 'amount'],
                              [{ amount: 5, currency: 'usd', shipping_rate: 'x' }, 'shipping_rate']]) {
    let err = null;
    try {
      await stripe.charges.create(bad, { idempotencyKey: `bad-${param}-${Object.keys(bad).length}` });
    } catch (e) {
      err = e;
    }
    check(err && err.type === 'StripeInvalidRequestError' && err.param === param,
          `${JSON.stringify(bad)} is refused naming ${param}, got ${err && err.type} ${err && err.param}`);
  }
  // A wrong API key: StripeAuthenticationError.
  let auth = null;
  try {
    await new Stripe('sk_test_wrong', { ...connect, maxNetworkRetries: 0 }).charges.create(params(0));
  } catch (e) {
    auth = e;
  }
  check(auth && auth.type === 'StripeAuthenticationError', `a wrong key is StripeAuthenticationError, got ${auth && auth.type}`);

  // Reading back: one charge per create, through the client's own pagination.
  const listed = await stripe.charges.list({ limit: 7 }).autoPagingToArray({ limit: 1000 });
  check(listed.length === N, `the provider lists ${N} charges, got ${listed.length}`);
  check(listed.every((c) => ids.has(c.id)), 'every listed charge is one the client got');
  const one = await stripe.charges.retrieve(made[5].id);
  check(one.id === made[5].id && one.amount === 1005, 'charges.retrieve reads a charge');
  let missing = null;
  try {
    await stripe.charges.retrieve('ch_missing');
  } catch (e) {
    missing = e;
  }
  check(missing && missing.type === 'StripeInvalidRequestError' && missing.code === 'resource_missing',
        'a missing charge is resource_missing');

  console.log(JSON.stringify({ charges: N, listed: listed.length, keys: sent.size, retried_keys: retried,
                               requests: [...sent.values()].reduce((a, b) => a + b, 0) }));
  for (const f of failures) console.log(`FAIL ${f}`);
  process.exit(failures.length ? 1 : 0);
})().catch((e) => {
  console.log(`FAIL unexpected error: ${e.type || ''} ${e.message}`);
  process.exit(1);
});
