// An application on an install with only SQLite and the embedded queue: a
// message published twice, consumed through an Inbox, applied once.
#if defined(IDEM_KILL_POINTS) || defined(IDEM_HAVE_TESTING)
#error "a build define of idem reached the application"
#endif
#include <iostream>
#include <string>

#include "idem/consumer.h"
#include "idem/embedded/queue.h"
#include "idem/inbox.h"
#include "idem/sqlite/store.h"

int main(int argc, char** argv) {
  const std::string dir = argc > 1 ? argv[1] : ".";
  auto store = idem::sqlite::Store::Open({.path = dir + "/app.db"});
  auto queue = idem::embedded::Queue::Open({.path = dir + "/queue.db", .queue = "orders"});
  if (!store.ok() || !queue.ok()) {
    std::cerr << (!store.ok() ? store.status() : queue.status()) << "\n";
    return 1;
  }
  for (int i = 0; i < 2; ++i) (void)(*queue)->Publish({.id = "order-1", .payload = "4000"});
  int applied = 0;
  auto inbox = idem::Inbox::Open(**store, {.consumer = "app"});
  if (!inbox.ok()) {
    std::cerr << inbox.status() << "\n";
    return 1;
  }
  auto consumer = idem::Consumer::Open(**queue, **inbox,
                                       [&](idem::Transaction&, const idem::Message&) -> idem::Status {
                                         ++applied;
                                         return idem::Status::OK();
                                       },
                                       {.stop_when_idle = true});
  if (!consumer.ok()) {
    std::cerr << consumer.status() << "\n";
    return 1;
  }
  if (auto s = (*consumer)->Run(); !s.ok()) {
    std::cerr << s << "\n";
    return 1;
  }
  std::cout << "applied " << applied << " of 2 deliveries\n";
  return applied == 1 ? 0 : 1;
}
