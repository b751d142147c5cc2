'use strict';
// Peer: @aws-lambda-powertools/idempotency with its DynamoDB persistence layer,
// outside Lambda, on DynamoDB Local (bench/peers/dynamodb-vs-powertools.sh).
//
// processPayment(message) is wrapped with makeIdempotent; the idempotency key is
// the message id. The wrapped function writes one payments item
// (PutItem {message_id, amount_cents} into <PREFIX>-payments). N unique messages,
// each delivered DUP times in passes (all ids, then all again), CONCURRENCY calls
// in flight. A redelivery returns the stored result without running the function.
// MODE=bare writes the same item for every delivery with no idempotency at all.
// Env: DDB_ENDPOINT (required), PREFIX (table prefix, default "peer"), N (20000),
// DUP (2), CONCURRENCY (16), MODE (powertools | bare).
const { DynamoDBClient, CreateTableCommand, DeleteTableCommand, ScanCommand } =
  require('@aws-sdk/client-dynamodb');
const { DynamoDBDocumentClient, PutCommand } = require('@aws-sdk/lib-dynamodb');
const {
  makeIdempotent, IdempotencyConfig, IdempotencyAlreadyInProgressError,
} = require('@aws-lambda-powertools/idempotency');
const { DynamoDBPersistenceLayer } = require('@aws-lambda-powertools/idempotency/dynamodb');

const N = Number(process.env.N || 20000);
const DUP = Number(process.env.DUP || 2);
const CONCURRENCY = Number(process.env.CONCURRENCY || 16);
const MODE = process.env.MODE || 'powertools';
const PREFIX = process.env.PREFIX || 'peer';
const ENDPOINT = process.env.DDB_ENDPOINT;
if (!ENDPOINT) { console.error('DDB_ENDPOINT is required (DynamoDB Local: http://127.0.0.1:PORT)'); process.exit(2); }
const msgId = (i) => `00000000-0000-4000-8000-${i.toString(16).padStart(12, '0')}`;
const clientConfig = {
  endpoint: ENDPOINT,
  region: process.env.AWS_REGION || 'us-east-1',
  credentials: { accessKeyId: process.env.AWS_ACCESS_KEY_ID || 'idem', secretAccessKey: process.env.AWS_SECRET_ACCESS_KEY || 'idem' },
  maxAttempts: 5,
};

async function recreate(ddb, name, key) {
  try { await ddb.send(new DeleteTableCommand({ TableName: name })); } catch (e) { /* absent */ }
  await ddb.send(new CreateTableCommand({
    TableName: name, BillingMode: 'PAY_PER_REQUEST',
    AttributeDefinitions: [{ AttributeName: key, AttributeType: 'S' }],
    KeySchema: [{ AttributeName: key, KeyType: 'HASH' }],
  }));
}

async function count(ddb, name) {
  let n = 0, start;
  do {
    const r = await ddb.send(new ScanCommand({ TableName: name, Select: 'COUNT', ExclusiveStartKey: start }));
    n += r.Count; start = r.LastEvaluatedKey;
  } while (start);
  return n;
}

async function main() {
  const ddb = new DynamoDBClient(clientConfig);
  const doc = DynamoDBDocumentClient.from(ddb);
  const payments = `${PREFIX}-payments`, records = `${PREFIX}-idempotency`;
  await recreate(ddb, payments, 'message_id');
  if (MODE === 'powertools') await recreate(ddb, records, 'id');

  let calls = 0;
  const processPayment = async (message) => {
    calls++;
    await doc.send(new PutCommand({
      TableName: payments, Item: { message_id: message.messageId, amount_cents: message.amountCents },
    }));
    return { paymentId: message.messageId };
  };
  let handle = processPayment;
  if (MODE === 'powertools') {
    const persistenceStore = new DynamoDBPersistenceLayer({ tableName: records, clientConfig });
    const config = new IdempotencyConfig({ eventKeyJmesPath: 'messageId', expiresAfterSeconds: 3600 });
    // Outside Lambda: a fixed processing budget instead of a Lambda context's deadline.
    config.registerLambdaContext({ getRemainingTimeInMillis: () => 60_000 });
    handle = makeIdempotent(processPayment, { persistenceStore, config, keyPrefix: 'peers.processPayment' });
  }

  const deliveries = [];
  for (let d = 0; d < DUP; d++) for (let i = 0; i < N; i++) deliveries.push(i);
  const firstResult = new Array(N);
  let mismatches = 0, inProgressRetries = 0, next = 0;
  const t0 = process.hrtime.bigint();
  async function worker() {
    while (next < deliveries.length) {
      const i = deliveries[next++];
      let res;
      for (;;) {
        try {
          res = await handle({ messageId: msgId(i), amountCents: (i % 1000) + 1 });
          break;
        } catch (e) {
          if (!(e instanceof IdempotencyAlreadyInProgressError)) throw e;
          inProgressRetries++;
          await new Promise((r) => setTimeout(r, 5));
        }
      }
      if (firstResult[i] === undefined) firstResult[i] = res.paymentId;
      else if (firstResult[i] !== res.paymentId) mismatches++;
    }
  }
  await Promise.all(Array.from({ length: CONCURRENCY }, worker));
  const seconds = Number(process.hrtime.bigint() - t0) / 1e9;

  const items = await count(ddb, payments);
  const expectedCalls = MODE === 'powertools' ? N : N * DUP;
  const ok = calls === expectedCalls && items === N && mismatches === 0;
  console.log(`info: mode=${MODE} concurrency=${CONCURRENCY} function_calls=${calls} payments_items=${items} ` +
    `replay_mismatches=${mismatches} in_progress_retries=${inProgressRetries} ok=${ok}`);
  const peer = MODE === 'powertools' ? 'powertools-idempotency-dynamodb' : 'bare-dynamodb-node';
  console.log(`peer=${peer} store=dynamodb-local unique=${N} deliveries=${deliveries.length} ` +
    `seconds=${seconds.toFixed(3)} deliveries_per_s=${(deliveries.length / seconds).toFixed(1)} effects=${calls}`);
  if (!ok) { console.error('CORRECTNESS CHECK FAILED'); process.exit(1); }
}

main().catch((e) => { console.error(e); process.exit(1); });
