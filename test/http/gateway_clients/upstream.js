'use strict';
// The API behind `idem gateway` in gateway_clients_test.sh: an express app
// (npm) whose POST /v1/charges makes a charge each time it runs, counted
// per Idempotency-Key (as the gateway forwards it); GET /stats gives the
// counts. Nothing here deduplicates: the gateway must.
//   NODE_PATH=<dir>/node_modules node upstream.js PORT
const express = require('express');

const port = Number(process.argv[2]);
const executions = {};
let seq = 0;
const app = express();
app.use(express.json());
app.use(express.urlencoded({ extended: true }));
app.post('/v1/charges', (req, res) => {
  const key = req.get('idempotency-key') || '';
  executions[key] = (executions[key] || 0) + 1;
  seq += 1;
  // A moment of work, so the answer comes after the request was handled.
  setTimeout(() => res.status(201).json({
    id: `ch_${seq}_${Math.random().toString(36).slice(2, 10)}`, object: 'charge', amount: Number(req.body.amount),
    currency: req.body.currency, customer: req.body.customer || null, status: 'succeeded', created: Date.now(),
  }), 2);
});
app.get('/stats', (_req, res) => res.json({ executions, total: seq }));
app.get('/health', (_req, res) => res.type('text').send('ok'));
app.listen(port, '127.0.0.1');
