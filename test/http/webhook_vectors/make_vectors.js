// Makes vectors.json: webhook deliveries signed by the senders' reference
// implementations, which test/http/webhook_test.cc verifies with idem's
// receiver. Run again (npm install in this directory, then
// `node make_vectors.js > vectors.json`) only to refresh them: the tests read
// the committed file, so they need neither node nor the network.
//   standardwebhooks (npm, Standard Webhooks' own JavaScript library): v1 HMAC
//   stripe (npm, Stripe's own client): stripe.webhooks.generateTestHeaderString
//   node:crypto ed25519 for Standard Webhooks' v1a (the library signs v1 only)
//   GitHub: the test vector its documentation publishes
'use strict';
const { Webhook } = require('standardwebhooks');
const Stripe = require('stripe');
const crypto = require('crypto');

const ts = 1700000000;  // the tests' clock is set here
const body = JSON.stringify({ type: 'invoice.paid', data: { invoice: 'in_1042', cents: 4000 } });
const out = { timestamp: ts, standard: [], stripe: [], github: [] };

const secretA = 'whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw';
const secretB = 'whsec_' + Buffer.from('a rotated secret, 32 bytes long!').toString('base64');
const sign = (secret, id, payload) => new Webhook(secret).sign(id, new Date(ts * 1000), payload);
out.standard.push({ name: 'v1', secrets: [secretA], id: 'msg_2KWPBgLlAfxdpx2AI54pPJ85f4W', body,
                    signature: sign(secretA, 'msg_2KWPBgLlAfxdpx2AI54pPJ85f4W', body) });
// Rotation: signed with both the old and the new secret; the receiver knows only the new one.
out.standard.push({ name: 'rotated', secrets: [secretB], id: 'msg_rotated_1', body,
                    signature: sign(secretA, 'msg_rotated_1', body) + ' ' + sign(secretB, 'msg_rotated_1', body) });
// v1a: ed25519 over "<id>.<timestamp>.<body>", the public key as whpk_<base64 raw key>.
const { publicKey, privateKey } = crypto.generateKeyPairSync('ed25519');
const raw = Buffer.from(publicKey.export({ format: 'jwk' }).x, 'base64url');
const content = `msg_ed25519_1.${ts}.${body}`;
out.standard.push({ name: 'v1a', secrets: ['whpk_' + raw.toString('base64')], id: 'msg_ed25519_1', body,
                    signature: 'v1a,' + crypto.sign(null, Buffer.from(content), privateKey).toString('base64') });

const stripe = new Stripe('sk_test_unused');
const stripeSecret = 'whsec_test_secret_for_idem';
const event = JSON.stringify({ id: 'evt_1NG8Du2eZvKYlo2CUI79vXWy', object: 'event', type: 'charge.succeeded',
                               data: { object: { id: 'ch_1', amount: 4000 } } });
out.stripe.push({ name: 'charge.succeeded', secrets: [stripeSecret], body: event,
                  signature: stripe.webhooks.generateTestHeaderString({ payload: event, secret: stripeSecret,
                                                                        timestamp: ts }) });

out.github.push({ name: 'documented', secrets: ["It's a Secret to Everybody"], id: '72d3162e-cc78-11e3-81ab-4c9367dc0958',
                  body: 'Hello, World!',
                  signature: 'sha256=757107ea0eb2509fc211221cce984b8a37570b6d7586c22c46f4379c8b043e17' });
const fs = require('fs'), path = require('path');
const version = (pkg) => JSON.parse(fs.readFileSync(path.join(__dirname, 'node_modules', pkg, 'package.json'))).version;
out.versions = { standardwebhooks: version('standardwebhooks'), stripe: version('stripe'), node: process.version };
console.log(JSON.stringify(out, null, 2));
