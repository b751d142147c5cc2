// Publishes two orders to an SQS queue (each twice: a producer's retry),
// consumes them with the Consumer and an Inbox on SQLite, and prints what
// was applied: two charges, two duplicates skipped.
//   sqs_app ENDPOINT QUEUE DIR     (credentials from the environment)
#include <iostream>
#include <string>

#include "idem/consumer.h"
#include "idem/inbox.h"
#include "idem/sqlite/store.h"
#include "idem/sqs/publisher.h"
#include "idem/sqs/source.h"

namespace {

int Fail(const idem::Status& s) {
  std::cerr << "sqs_app: " << s << "\n";
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 4) return 2;
  const std::string endpoint = argv[1], queue = argv[2], dir = argv[3];
  idem::sqs::ConnectOptions connect{.region = "us-east-1", .endpoint = endpoint};
  auto pub = idem::sqs::Publisher::Open({.queue = queue, .connect = connect, .create_queue = true});
  if (!pub.ok()) return Fail(pub.status());
  for (int copy = 0; copy < 2; ++copy)
    for (const char* id : {"order-1", "order-2"}) {
      idem::Message m;
      m.id = id;
      m.payload = "4000";
      if (idem::Status s = (*pub)->Publish(m); !s.ok()) return Fail(s);
    }
  auto src = idem::sqs::Source::Open({.queue = queue, .connect = connect, .lease_ms = 30'000});
  if (!src.ok()) return Fail(src.status());
  auto store = idem::sqlite::Store::Open({.path = dir + "/store.db"});
  if (!store.ok()) return Fail(store.status());
  {
    auto tx = (*store)->Begin();
    if (!tx.ok()) return Fail(tx.status());
    if (auto r = (*tx)->Exec("CREATE TABLE charges(order_id TEXT NOT NULL)"); !r.ok()) return Fail(r.status());
    if (idem::Status s = (*tx)->Commit(); !s.ok()) return Fail(s);
  }
  auto inbox = idem::Inbox::Open(**store, {.consumer = "billing"});
  if (!inbox.ok()) return Fail(inbox.status());
  auto consumer = idem::Consumer::Open(**src, **inbox,
                                       [](idem::Transaction& tx, const idem::Message& m) {
                                         return tx.Exec("INSERT INTO charges(order_id) VALUES ($1)", {m.id}).status();
                                       },
                                       {.batch = 10, .receive_wait_ms = 1'000, .stop_when_idle = true});
  if (!consumer.ok()) return Fail(consumer.status());
  if (idem::Status s = (*consumer)->Run(); !s.ok()) return Fail(s);
  const idem::InboxCounters c = (*inbox)->counters();
  std::cout << "sqs: applied " << c.applied << ", duplicates skipped " << c.duplicates << ", acked "
            << (*consumer)->stats().acked << "\n";
  return c.applied == 2 && c.duplicates == 2 ? 0 : 1;
}
