// AWS Powertools' idempotency utility (TypeScript, @aws-lambda-powertools/idempotency
// with its DynamoDB persistence layer) handling N messages, each writing one item, at a
// given concurrency, on a DynamoDB endpoint: the other side of idem_dynamodb_guarded
// (bench/dynamodb-vs-powertools.sh runs both). Prints one JSON line.
//   node dynamodb-vs-powertools.mjs ENDPOINT MESSAGES CONCURRENCY ROUND
// Node resolves the packages from NODE_PATH's folder (the script installs them).
import { CreateTableCommand, DynamoDBClient, PutItemCommand } from '@aws-sdk/client-dynamodb';
import { IdempotencyConfig, makeIdempotent } from '@aws-lambda-powertools/idempotency';
import { DynamoDBPersistenceLayer } from '@aws-lambda-powertools/idempotency/dynamodb';

const [endpoint, messages = '2000', concurrency = '8', round = '0'] = process.argv.slice(2);
const client = new DynamoDBClient({
  endpoint, region: 'us-east-1', credentials: { accessKeyId: 'bench', secretAccessKey: 'bench-secret' },
  maxAttempts: 5,
});
const run = `${Date.now()}-${round}`;
const idemTable = `pt-idem-${run}`, itemsTable = `pt-items-${run}`;
for (const t of [idemTable, itemsTable]) {
  await client.send(new CreateTableCommand({
    TableName: t, BillingMode: 'PAY_PER_REQUEST',
    AttributeDefinitions: [{ AttributeName: 'id', AttributeType: 'S' }],
    KeySchema: [{ AttributeName: 'id', KeyType: 'HASH' }],
  }));
}
// As in a Lambda function: the context tells how long the invocation has left.
const config = new IdempotencyConfig({ eventKeyJmesPath: 'id' });
config.registerLambdaContext({ getRemainingTimeInMillis: () => 900_000 });
const handle = makeIdempotent(
  async (message) => {
    await client.send(new PutItemCommand({
      TableName: itemsTable, Item: { id: { S: message.id }, cents: { N: '4000' } },
    }));
    return { ok: true };
  },
  {
    persistenceStore: new DynamoDBPersistenceLayer({ tableName: idemTable, awsSdkV3Client: client }),
    config,
  });

const n = Number(messages);
let next = 0, failed = 0;
const t0 = process.hrtime.bigint();
await Promise.all(Array.from({ length: Number(concurrency) }, async () => {
  for (;;) {
    const i = next++;
    if (i >= n) return;
    try {
      await handle({ id: `m-${i}`, payload: '4000' });
    } catch (e) {
      failed++;
    }
  }
}));
const seconds = Number(process.hrtime.bigint() - t0) / 1e9;
console.log(JSON.stringify({ side: 'powertools', messages: n, concurrency: Number(concurrency), failed,
  msg_per_s: Math.round(n / seconds) }));
process.exit(failed ? 1 : 0);
