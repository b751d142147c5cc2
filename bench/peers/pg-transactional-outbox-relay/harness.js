'use strict';
// Peer: pg-transactional-outbox (npm) 0.5.7, OUTBOX side, PostgreSQL -> RabbitMQ.
//
// Real library path, as its README's "transactional outbox producer" shows:
//  1. produce: each producer transaction inserts one `payments` row and stores
//     the outgoing message with the library's outbox storage
//     (initializeMessageStorage -> INSERT INTO outbox), then commits.
//     aggregateId = segment = the message's key, concurrency 'sequential'
//     (the default): the library keeps one key's messages in order.
//  2. relay: the library's outbox listener (polling: next_outbox_messages()
//     from DatabaseSetup; replication: pgoutput slot + publication, with the
//     per-segment mutex concurrency controller) runs our GeneralMessageHandler,
//     which publishes the message on an amqplib confirm channel (persistent,
//     mandatory) and awaits the broker's confirm; the library then marks the
//     outbox row processed in the same transaction that locked it.
//  3. consume: a separate process (its own amqplib connection) consumes the
//     queue and records, per message id, the receipt time; it counts
//     duplicates and per-key order violations.
// Modes:
//  RATE=0 (default): preloaded. Producers commit all N first, then the relay
//    starts; the clock runs from the relay start until the consumer holds all
//    N distinct ids. messages_per_s = N / seconds.
//  RATE=R: producers commit at R/s in total while the relay runs; latency =
//    consumer receipt - producer commit (same CLOCK_MONOTONIC in both
//    processes), p50/p99. seconds = first commit .. last receipt.
const { fork } = require('child_process');

const N = Number(process.env.N || 20000);
const K = Number(process.env.K || 1000);
const RATE = Number(process.env.RATE || 0);
const PAYLOAD_BYTES = Number(process.env.PAYLOAD_BYTES || 100);
const PRODUCERS = Number(process.env.PRODUCERS || 16);
const MODE = process.env.MODE || 'polling'; // polling | replication
const BATCH = Number(process.env.BATCH || 16); // polling: nextMessagesBatchSize
const POLL_MS = Number(process.env.POLL_MS || 10); // polling: nextMessagesPollingIntervalInMs
const POOL = Number(process.env.POOL || 16); // handler pg pool (the relay's transactions)
const AMQP_URL = process.env.AMQP_URL || 'amqp://idem:secret@127.0.0.1:56741/%2f';
const QUEUE = process.env.QUEUE || 'pto_relay';
const TIMEOUT_S = Number(process.env.TIMEOUT_S || 600);

const msgId = (i) => `00000000-0000-4000-8000-${i.toString(16).padStart(12, '0')}`;
const idIndex = (id) => parseInt(id.slice(24), 16);
const keyOf = (i) => i % K; // message i is the (i / K)-th message of key i % K
const nowMs = () => Number(process.hrtime.bigint()) / 1e6; // CLOCK_MONOTONIC, shared by both processes
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

if (process.argv[2] === 'consumer') {
  consumer().catch((e) => { console.error(e); process.exit(1); });
} else {
  main().catch((e) => { console.error(e); process.exit(1); });
}

// The separate consumer: receipt time of each id's first copy, duplicates,
// per-key order (each key's first receipts must come as seq 0, 1, 2, ...).
async function consumer() {
  const amqp = require('amqplib');
  const conn = await amqp.connect(AMQP_URL);
  const ch = await conn.createChannel();
  await ch.prefetch(1000);
  const recv = new Float64Array(N).fill(-1);
  const nextSeq = new Int32Array(K);
  let distinct = 0, duplicates = 0, violations = 0, foreign = 0;
  let pendingAck = 0;
  await ch.consume(QUEUE, (m) => {
    const t = nowMs();
    const i = idIndex(m.properties.messageId || '');
    if (!(i >= 0 && i < N)) foreign++;
    else if (recv[i] >= 0) duplicates++;
    else {
      recv[i] = t;
      distinct++;
      const k = keyOf(i), seq = Math.floor(i / K);
      if (seq !== nextSeq[k]) violations++;
      if (seq >= nextSeq[k]) nextSeq[k] = seq + 1;
      if (distinct === N) process.send({ type: 'all', at: t });
    }
    if (++pendingAck >= 100) { ch.ack(m, true); pendingAck = 0; }
  });
  setInterval(() => { if (pendingAck) { ch.ackAll(); pendingAck = 0; } }, 50);
  process.on('message', async (msg) => {
    if (msg.type !== 'report') return;
    await sleep(300); // let late republishes arrive
    await conn.close().catch(() => {});
    // the parent ends this process once it has the report
    process.send({ type: 'report', recv: Array.from(recv), distinct, duplicates, violations, foreign });
  });
  process.send({ type: 'ready' });
}

async function main() {
  const { Pool } = require('pg');
  const amqp = require('amqplib');
  const pto = require('pg-transactional-outbox');
  const db = {
    host: process.env.PGHOST, port: Number(process.env.PGPORT),
    user: process.env.PGUSER, password: process.env.PGPASSWORD || undefined,
    database: process.env.PGDATABASE,
  };
  const logger = process.env.LOG ? pto.getDefaultLogger('outbox') : pto.getDisabledLogger();
  const setup = {
    outboxOrInbox: 'outbox', database: db.database, schema: 'public', table: 'outbox',
    listenerRole: db.user, nextMessagesName: 'next_outbox_messages',
    publication: 'pto_relay_pub', replicationSlot: `pto_relay_slot_${db.database}`.replace(/\W/g, '_'),
  };
  const admin = new Pool({ ...db, max: 2 });
  await admin.query('SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name = $1',
    [setup.replicationSlot]);
  await admin.query(`DROP PUBLICATION IF EXISTS ${setup.publication}`);
  await admin.query(pto.DatabaseSetup.dropAndCreateTable(setup));
  await admin.query(`DROP TABLE IF EXISTS payments;
    CREATE TABLE payments (id bigserial PRIMARY KEY, message_id uuid NOT NULL, key integer NOT NULL,
                           amount_cents integer NOT NULL);`);
  if (MODE === 'replication') {
    if ((await admin.query('SHOW wal_level')).rows[0].wal_level !== 'logical') {
      throw new Error('MODE=replication needs wal_level=logical');
    }
    await admin.query(pto.DatabaseSetup.setupReplicationCore(setup));
    // the slot exists before the first producer commits, so it decodes the whole backlog
    await admin.query(`SELECT pg_create_logical_replication_slot('${setup.replicationSlot}', 'pgoutput')`);
  } else {
    await admin.query(pto.DatabaseSetup.createPollingFunction(setup));
    await admin.query(pto.DatabaseSetup.setupPollingIndexes(setup));
  }

  // Broker: a durable queue, emptied; the relay's confirm channel; the consumer process.
  const conn = await amqp.connect(AMQP_URL);
  const setupCh = await conn.createChannel();
  await setupCh.assertQueue(QUEUE, { durable: true });
  await setupCh.purgeQueue(QUEUE);
  await setupCh.close();
  const pub = await conn.createConfirmChannel();
  let returned = 0;
  pub.on('return', () => { returned++; });

  const child = fork(__filename, ['consumer'], { env: process.env });
  const fromChild = (type) => new Promise((resolve) => {
    const on = (m) => { if (m.type === type) { child.off('message', on); resolve(m); } };
    child.on('message', on);
  });
  let reported = false;
  const childExit = new Promise((_, reject) => child.on('exit', (c) => {
    if (!reported) reject(new Error(`consumer exited (${c})`));
  }));
  childExit.catch(() => {});
  await Promise.race([fromChild('ready'), childExit]);
  const allReceived = fromChild('all');

  // The outbox message handler: publish, await the broker's confirm.
  let published = 0;
  const messagePublisher = {
    handle: (message) => new Promise((resolve, reject) => {
      pub.publish('', QUEUE, Buffer.from(JSON.stringify(message.payload)), {
        messageId: message.id, persistent: true, mandatory: true, contentType: 'application/json',
        type: message.messageType, headers: { aggregate_id: message.aggregateId },
      }, (err) => { if (err) reject(err); else { published++; resolve(); } });
    }),
  };
  const settings = {
    dbSchema: 'public', dbTable: 'outbox',
    enableMaxAttemptsProtection: false, // the outbox defaults (README: TRX_OUTBOX_ENABLE_*=false)
    enablePoisonousMessageProtection: false,
    messageCleanupIntervalInMs: 0, // no background cleanup during the measurement
  };
  const handlerDb = { ...db, max: POOL };
  const startRelay = () => {
    if (MODE === 'replication') {
      return pto.initializeReplicationMessageListener({
        outboxOrInbox: 'outbox', dbHandlerConfig: handlerDb, dbListenerConfig: db,
        settings: { ...settings, dbPublication: setup.publication, dbReplicationSlot: setup.replicationSlot },
      }, messagePublisher, logger,
      // the library's per-segment ordered controller: one key's messages in turn, keys in parallel
      { concurrencyStrategy: pto.createReplicationSegmentMutexConcurrencyController() })[0];
    }
    return pto.initializePollingMessageListener({
      outboxOrInbox: 'outbox', dbHandlerConfig: handlerDb, dbListenerConfig: db,
      settings: {
        ...settings, nextMessagesFunctionName: 'next_outbox_messages',
        nextMessagesBatchSize: BATCH, nextMessagesPollingIntervalInMs: POLL_MS,
      },
    }, messagePublisher, logger)[0];
  };

  // Producers: the business row and the outbox message in one transaction.
  // Producer p owns the keys k with k % PRODUCERS == p and commits them in
  // order of i, so each key's messages are committed in sequence.
  const storeOutboxMessage = pto.initializeMessageStorage({ outboxOrInbox: 'outbox', settings }, logger);
  const producerPool = new Pool({ ...db, max: PRODUCERS });
  const filler = 'x'.repeat(Math.max(0, PAYLOAD_BYTES - JSON.stringify({ amountCents: 1000, key: K - 1, pad: '' }).length));
  const committed = new Float64Array(N).fill(-1);
  let tFirstScheduled = 0;
  async function producer(p) {
    for (let i = 0; i < N; i++) {
      if (keyOf(i) % PRODUCERS !== p) continue;
      if (RATE > 0) {
        const due = tFirstScheduled + (i * 1000) / RATE;
        const wait = due - nowMs();
        if (wait > 0) await sleep(wait);
      }
      const message = {
        id: msgId(i), aggregateType: 'payment', messageType: 'payment_received',
        aggregateId: String(keyOf(i)), segment: String(keyOf(i)), concurrency: 'sequential',
        payload: { amountCents: (i % 1000) + 1, key: keyOf(i), pad: filler },
      };
      await pto.executeTransaction(await producerPool.connect(), async (client) => {
        await client.query('INSERT INTO payments (message_id, key, amount_cents) VALUES ($1, $2, $3)',
          [message.id, keyOf(i), (i % 1000) + 1]);
        await storeOutboxMessage(message, client);
      }, pto.IsolationLevel.ReadCommitted);
      committed[i] = nowMs();
    }
  }
  const produceAll = () => Promise.all(Array.from({ length: PRODUCERS }, (_, p) => producer(p)));

  // The library gives up on a message after its retries (marks it abandoned):
  // then the consumer never holds all N, so stop waiting once every row is
  // either processed or abandoned.
  const settled = (async () => {
    for (;;) {
      await sleep(200);
      const { rows: [r] } = await admin.query(`SELECT count(*) FILTER (WHERE processed_at IS NOT NULL)::int AS p,
          count(*) FILTER (WHERE abandoned_at IS NOT NULL)::int AS a FROM outbox`);
      if (r.a > 0 && r.p + r.a >= N) { await sleep(1000); return { at: nowMs(), abandoned: r.a }; }
    }
  })();
  let t0, tEnd, shutdown;
  const deadline = (what) => sleep(TIMEOUT_S * 1000).then(() => { throw new Error(`timeout: ${what}`); });
  if (RATE > 0) {
    shutdown = startRelay();
    await sleep(1000); // let the listener connect before the first commit
    tFirstScheduled = nowMs() + 10;
    t0 = tFirstScheduled;
    await Promise.race([produceAll(), childExit]);
    tEnd = (await Promise.race([allReceived, settled, childExit, deadline('consumer')])).at;
  } else {
    const tp = nowMs();
    await produceAll();
    const produceSeconds = (nowMs() - tp) / 1000;
    console.log(`info: preloaded ${N} messages in ${produceSeconds.toFixed(3)} s ` +
      `(${(N / produceSeconds).toFixed(1)} producer commits/s)`);
    t0 = nowMs();
    shutdown = startRelay();
    tEnd = (await Promise.race([allReceived, settled, childExit, deadline('consumer')])).at;
  }
  // every outbox row marked processed (the relay finishes its transactions)
  for (const until = Date.now() + 30_000; ;) {
    const { rows: [r] } = await admin.query('SELECT count(*)::int AS c FROM outbox WHERE processed_at IS NOT NULL');
    if (r.c >= N || Date.now() > until) break;
    await sleep(20);
  }
  child.send({ type: 'report' });
  const rep = await Promise.race([fromChild('report'), childExit]);
  reported = true;
  child.kill();
  await shutdown();
  await producerPool.end();
  await pub.close().catch(() => {});
  await conn.close().catch(() => {});
  const { rows: [c] } = await admin.query(`SELECT
      (SELECT count(*) FROM payments)::int AS payments,
      (SELECT count(*) FROM outbox)::int AS outbox,
      (SELECT count(*) FROM outbox WHERE processed_at IS NOT NULL)::int AS processed,
      (SELECT count(*) FROM outbox WHERE abandoned_at IS NOT NULL)::int AS abandoned`);
  if (MODE === 'replication') {
    await admin.query('SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name = $1',
      [setup.replicationSlot]);
  }
  await admin.end();

  let missing = 0;
  const lat = [];
  for (let i = 0; i < N; i++) {
    if (rep.recv[i] < 0) missing++;
    else if (RATE > 0) lat.push(rep.recv[i] - committed[i]);
  }
  lat.sort((a, b) => a - b);
  const pct = (q) => (lat.length ? lat[Math.min(lat.length - 1, Math.floor(q * lat.length))].toFixed(2) : 'na');
  const seconds = (tEnd - t0) / 1000;
  const ok = missing === 0 && rep.violations === 0 && rep.foreign === 0 && returned === 0 &&
    c.payments === N && c.outbox === N && c.processed === N && c.abandoned === 0;
  console.log(`info: mode=${MODE}` + (MODE === 'polling' ? ` batch=${BATCH} poll_ms=${POLL_MS}` : ' controller=segment-mutex') +
    ` pool=${POOL} producers=${PRODUCERS} keys=${K} payload_bytes=${PAYLOAD_BYTES}` +
    (RATE > 0 ? ` rate=${RATE}` : ' preloaded') + ` published=${published} returned=${returned}` +
    ` distinct=${rep.distinct} missing=${missing} payments=${c.payments} outbox_rows=${c.outbox}` +
    ` processed=${c.processed} abandoned=${c.abandoned} ok=${ok}`);
  console.log(`peer=pg-transactional-outbox-relay mode=${MODE} messages=${N} seconds=${seconds.toFixed(3)} ` +
    `messages_per_s=${(N / seconds).toFixed(1)} p50_ms=${pct(0.5)} p99_ms=${pct(0.99)} ` +
    `order_violations=${rep.violations} duplicates=${rep.duplicates}`);
  if (!ok) { console.error('CORRECTNESS CHECK FAILED'); process.exit(1); }
  process.exit(0);
}
