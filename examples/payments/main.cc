// The seed's payments consumer, written as a user would write it: messages
// from the embedded queue, the charge and the marker in one SQLite
// transaction, the ack after the commit.
//
//   payments DIR     (DIR must exist; prints the payments table at the end)
#include <cstdlib>
#include <iostream>
#include <string>

#include "idem/consumer.h"
#include "idem/embedded/queue.h"
#include "idem/inbox.h"
#include "idem/sqlite/store.h"

int main(int argc, char** argv) {
  std::string dir = argc > 1 ? argv[1] : ".";
  auto store = idem::sqlite::Open({.path = dir + "/payments.db"});
  auto queue = idem::embedded::Queue::Open({.path = dir + "/queue.db", .queue = "payments"});
  if (!store.ok() || !queue.ok()) {
    std::cerr << (store.ok() ? queue.status() : store.status()) << "\n";
    return 1;
  }
  {
    auto tx = (*store)->Begin();
    if (!tx.ok() ||
        !(*tx)->Exec("CREATE TABLE IF NOT EXISTS payments(order_id TEXT, cents INTEGER)").ok() ||
        !(*tx)->Commit().ok())
      return 1;
  }

  // A producer that retries: every fact is published twice.
  for (int i = 0; i < 2; ++i) {
    (void)(*queue)->Publish({.id = "order-1042-charge", .payload = "4000"});
    (void)(*queue)->Publish({.id = "order-1043-charge", .payload = "2500"});
  }

  // The consumer: the handler's SQL runs in the transaction that holds the marker.
  idem::Inbox inbox(**store, {.consumer = "payments"});
  idem::Consumer consumer(**queue, inbox,
                          [](idem::Transaction& tx, const idem::Message& m) {
                            return tx.Exec("INSERT INTO payments(order_id, cents) VALUES ($1, $2)",
                                           {m.id.substr(0, 10), std::atoll(m.payload.c_str())})
                                .status();
                          },
                          {.stop_when_idle = true});
  idem::StopOnSignals(&consumer);
  if (auto s = consumer.Run(); !s.ok()) {
    std::cerr << s << "\n";
    return 1;
  }

  auto tx = (*store)->Begin();
  auto rows = (*tx)->Query("SELECT order_id, sum(cents), count(*) FROM payments GROUP BY order_id ORDER BY 1");
  for (const auto& r : rows->rows)
    std::cout << r[0].AsText() << " charged " << r[1].AsInt() << " cents in " << r[2].AsInt() << " row(s)\n";
  idem::InboxCounters c = inbox.counters();
  std::cout << "applied " << c.applied << ", duplicates skipped " << c.duplicates << "\n";
  return c.applied == 2 ? 0 : 1;
}
