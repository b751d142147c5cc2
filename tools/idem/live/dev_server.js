#!/usr/bin/env node
// Copyright idem authors. SPDX-License-Identifier: Apache-2.0
//
// A stand-in for the live view's server (tools/idem/live/web.cc and feed.cc),
// for working on index.html without building idem: serves the page on
// 127.0.0.1:PORT and GET /events (server-sent events: a snapshot, then a
// batch every 100 ms) replaying a scripted story: the demo's four steps,
// then a flood of ~1000 events/s from 4 consumer processes with bursts that
// make the server coalesce and drop, then it starts over.
//
//   node tools/idem/live/dev_server.js 8123 [--once] [--fast] [--cut=SECONDS]
//
//   --once        the story and the flood once, then nothing more
//   --fast        no pauses in the story (every step at once: tests the page's queueing)
//   --cut=N       after N seconds, end every /events stream once (the page reconnects)
//   --flood-only  skip the story
//   --consumers=N the flood's consumer processes (4; more than 8 folds into a "+N more" lane)
// Plain node, no packages. Binds 127.0.0.1 only.
'use strict';
const http = require('http');
const fs = require('fs');
const path = require('path');

const args = process.argv.slice(2);
const port = Number(args.find((a) => /^\d+$/.test(a)) || 8123);
const flag = (name) => args.includes('--' + name);
const opt = (name) => { const a = args.find((x) => x.startsWith('--' + name + '=')); return a ? a.split('=')[1] : null; };
const page = path.join(__dirname, 'index.html');
const consumers = Math.max(1, Number(opt('consumers')) || 4);

// ------------------------------------------------------------ the Feed
const RING = 4096, RECENT = 200, MAX_PER_BATCH = 300, BATCH_EVERY_MS = 100;
const started = Date.now();
let nextSeq = 1, lastStep = null;
const ring = [], counts = {};
function push(ev) {
  const e = Object.assign({ seq: nextSeq++, at_ms: Date.now() }, ev);
  const whole = JSON.stringify(e);
  ring.push([e.seq, whole]);
  if (ring.length > RING) ring.shift();
  counts[e.kind] = (counts[e.kind] || 0) + 1;
  if (e.kind === 'step') lastStep = whole;
}
function snapshot(stream) {
  if (stream) stream.next = nextSeq;
  const recent = ring.slice(-RECENT).map((r) => r[1]);
  if (lastStep && !recent.includes(lastStep)) recent.unshift(lastStep);
  return `{"process":"idem demo (dev_server.js)","started_ms":${started},"now_ms":${Date.now()},` +
    `"counts":${JSON.stringify(counts)},"recent":[${recent.join(',')}],"dropped":0}`;
}
function batch(s) {
  if (nextSeq <= s.next) return '';
  if (ring.length && ring[0][0] > s.next) { s.dropped += ring[0][0] - s.next; s.next = ring[0][0]; }
  const pending = nextSeq - s.next, coalesced = Math.max(0, pending - MAX_PER_BATCH);
  s.next += coalesced; s.dropped += coalesced;
  const out = ring.slice(ring.length - (nextSeq - s.next)).map((r) => r[1]);
  s.next = nextSeq;
  return `{"now_ms":${Date.now()},"counts":${JSON.stringify(counts)},"events":[${out.join(',')}],` +
    `"dropped":${s.dropped},"coalesced":${coalesced}}`;
}

// ------------------------------------------------------------ the story
const P = { consumer: 'payments' };
const ev = (kind, more) => Object.assign({ kind }, more);
const step = (t) => ev('step', { detail: t });
const say = (t) => ev('say', { detail: t });
const c1 = (kind, id, more) => ev(kind, Object.assign({ who: 'consumer-1', id }, P, more));
const A = (kind, id, more) => ev(kind, Object.assign({ who: 'consumer-A', id }, P, more));
const B = (kind, id, more) => ev(kind, Object.assign({ who: 'consumer-B', id }, P, more));
// [pause before (ms), event]
const STORY = [
  [500, step('Step 1 · Why duplicates arrive')],
  [300, say('Payments handles m-7f3 (charge $40) with no check for duplicates')],
  [1200, c1('received', 'm-7f3', { attempt: 1 })],
  [1300, c1('unguarded_effect', 'm-7f3', { detail: 'charge $40 for order 1042' })],
  [1200, c1('ack_lost', 'm-7f3')],
  [300, say('the ack is lost: the broker cannot tell, so it delivers m-7f3 again')],
  [1400, c1('received', 'm-7f3', { attempt: 2 })],
  [1200, c1('unguarded_effect', 'm-7f3', { detail: 'charge $40 for order 1042' })],
  [900, c1('acked', 'm-7f3')],
  [300, say('read back: 2 payment rows for order 1042, $80 charged ✕ charged twice')],
  [3000, step('Step 2 · Save the ID with the work')],
  [300, say('BEGIN; INSERT m-7f3 INTO processed_messages; INSERT payment; COMMIT; then ack')],
  [1200, c1('received', 'm-7f3', { attempt: 1 })],
  [1300, c1('applied', 'm-7f3', { handler_us: 41, commit_us: 183 })],
  [300, c1('outbox_added', 'o-1042-ship')],
  [1000, c1('ack_lost', 'm-7f3')],
  [300, say('the acknowledgement is not part of the transaction: it is lost again')],
  [2500, step('Step 3 · Redelivery changes nothing')],
  [300, say('the broker delivers m-7f3 again; the insert hits the unique key')],
  [1200, c1('received', 'm-7f3', { attempt: 2 })],
  [1300, c1('duplicate', 'm-7f3', { handler_us: 0, commit_us: 95 })],
  [1100, c1('acked', 'm-7f3')],
  [300, say('work skipped, acknowledged: still $40')],
  [1500, say('a race: consumer A stalls past its lease on m-8a1, the broker hands it to consumer B')],
  [800, A('received', 'm-8a1', { attempt: 1 })],
  [700, A('lease_overrun', 'm-8a1', { handler_us: 412000 })],
  [200, B('received', 'm-8a1', { attempt: 2 })],
  [1200, A('applied', 'm-8a1', { handler_us: 50211, commit_us: 240 })],
  [150, B('duplicate', 'm-8a1', { handler_us: 0, commit_us: 51000 })],
  [600, A('acked', 'm-8a1')],
  [100, B('acked', 'm-8a1')],
  [300, say('the unique key is the arbiter: exactly one insert wins')],
  [600, ev('outbox_published', { consumer: 'relay', who: 'relay', id: 'o-1042-ship', detail: 'shipping' })],
  [2500, step('Step 4 · Beyond your own database')],
  [300, say('POST /charges with Idempotency-Key: m-7f3:charge, outside the local transaction')],
  [1200, c1('received', 'm-7f3', { attempt: 1 })],
  [1100, ev('claim_started', { consumer: 'charges', id: 'm-7f3:charge' })],
  [900, ev('claim_completed', { consumer: 'charges', id: 'm-7f3:charge', detail: 'ch_81' })],
  [300, ev('provider_response_lost', { who: 'consumer-1', consumer: 'payments', id: 'm-7f3:charge' })],
  [1300, say('no response: the client retries with the same key')],
  [300, ev('claim_replayed', { consumer: 'charges', id: 'm-7f3:charge' })],
  [1800, c1('applied', 'm-7f3', { handler_us: 8123, commit_us: 201 })],
  [400, c1('outbox_added', 'o-1042-ship2')],
  [900, c1('acked', 'm-7f3')],
  [300, say('✓ charged once, committed: one charge ch_81 at the provider')],
  [1200, ev('outbox_published', { consumer: 'relay', who: 'relay', id: 'o-1042-ship2', detail: 'shipping' })],
  [900, ev('outbox_republished', { consumer: 'relay', who: 'relay', id: 'o-1042-ship2', detail: 'shipping' })],
  [300, say('the relay crashed between confirm and record: it publishes again, the next inbox absorbs it')],
  [1000, ev('some_future_kind', { detail: 'an unknown kind: logged only' })],
  // Events with fields missing or of the wrong type: the page logs them and never throws.
  [100, ev('received', {})],
  [100, ev('applied', { id: 42, attempt: 'two', who: null, handler_us: 'slow' })],
  [100, ev('claim_replayed', { detail: { nested: true } })],
  [100, ev('', { id: '<b>not html</b>' })],
  [2500, step('Under load · 4 consumer processes')],
  [300, say('~1000 events/s, with bursts the server coalesces for the page')],
];

// ------------------------------------------------------------ the flood
let seqId = 0x1000;
function floodTick(n, t) {
  for (let i = 0; i < n; i++) {
    const who = 'consumer-' + (1 + Math.floor(Math.random() * consumers));
    const id = 'm-' + (seqId++).toString(16);
    const r = Math.random();
    const base = { who, consumer: 'payments', id };
    push(Object.assign({ kind: 'received', attempt: r < 0.06 ? 2 : 1 }, base));
    if (r < 0.05) push(Object.assign({ kind: 'duplicate', handler_us: 0, commit_us: 80 }, base));
    else if (r < 0.055) push(Object.assign({ kind: 'failed', detail: 'database is locked' }, base));
    else if (r < 0.058) push(Object.assign({ kind: 'conflict', detail: 'payload differs' }, base));
    else push(Object.assign({ kind: 'applied', handler_us: 30 + Math.floor(Math.random() * 90), commit_us: 150 + Math.floor(Math.random() * 200) }, base));
    if (r > 0.995) push(Object.assign({ kind: 'ack_lost' }, base));
    else if (r > 0.9975) push(Object.assign({ kind: 'lease_overrun', handler_us: 31000000 }, base));
    else push(Object.assign({ kind: 'acked' }, base));
    if (r > 0.97) push({ kind: 'outbox_added', who, id: 'o-' + id.slice(2) });
    if (r > 0.97) push({ kind: 'outbox_published', who: 'relay', consumer: 'relay', id: 'o-' + id.slice(2), detail: 'shipping' });
    if (r > 0.985) push({ kind: 'claim_replayed', who, consumer: 'charges', id: id + ':charge' });
  }
  if (t % 10 === 0) push({ kind: 'lease_extended', who: 'consumer-3', consumer: 'payments', id: 'm-slow' });
}

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
async function run() {
  const fast = flag('fast');
  do {
    if (!flag('flood-only')) for (const [ms, e] of STORY) { if (!fast) await sleep(ms); push(e); }
    // ~1000 events/s (each message makes ~3 events) for 6 s, with a burst of
    // 2,000 messages (~6,000 events in one instant: coalesced) and one of
    // 5,000 (more than the ring holds: dropped) in the middle.
    for (let t = 0; t < 60; t++) {
      floodTick(t === 20 ? 2000 : t === 40 ? 5000 : 33, t);
      await sleep(100);
    }
    push({ kind: 'step', detail: 'Calm again' });
    push({ kind: 'say', detail: 'the flood is over; the story starts over in a few seconds' });
    await sleep(6000);
  } while (!flag('once'));
}

// ------------------------------------------------------------ HTTP
const streams = new Set();
const server = http.createServer((req, res) => {
  const url = req.url.split('?')[0];
  if (url === '/' || url === '/index.html') {
    fs.readFile(page, (err, body) => {
      if (err) { res.writeHead(500); res.end(String(err)); return; }
      res.writeHead(200, { 'Content-Type': 'text/html; charset=utf-8', 'Cache-Control': 'no-store' });
      res.end(body);
    });
  } else if (url === '/state') {
    res.writeHead(200, { 'Content-Type': 'application/json', 'Cache-Control': 'no-store' });
    res.end(snapshot(null));
  } else if (url === '/metrics') {
    res.writeHead(200, { 'Content-Type': 'text/plain; version=0.0.4' });
    res.end(Object.entries(counts).map(([k, v]) => `idem_dev_${k}_total ${v}`).join('\n') + '\n');
  } else if (url === '/events') {
    res.writeHead(200, { 'Content-Type': 'text/event-stream', 'Cache-Control': 'no-store', Connection: 'keep-alive' });
    const s = { next: 0, dropped: 0, res, idle: 0 };
    res.write('retry: 1000\nevent: snapshot\ndata: ' + snapshot(s) + '\n\n');
    s.timer = setInterval(() => {
      const b = batch(s);
      if (b) { res.write('event: batch\ndata: ' + b + '\n\n'); s.idle = 0; } else if (++s.idle % 10 === 0) res.write(': idle\n\n');
    }, BATCH_EVERY_MS);
    streams.add(s);
    req.on('close', () => { clearInterval(s.timer); streams.delete(s); });
  } else {
    res.writeHead(404, { 'Content-Type': 'text/plain' });
    res.end('not found\n');
  }
});
server.listen(port, '127.0.0.1', () => {
  process.stdout.write(`live dev server: http://127.0.0.1:${port}/\n`);
  run();
});
const cut = Number(opt('cut'));
if (cut > 0) setTimeout(() => { for (const s of streams) { clearInterval(s.timer); s.res.end(); streams.delete(s); } }, cut * 1000);
