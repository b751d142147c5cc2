// An application on an install with every component: one call (or one
// symbol) of each, so each library is linked, and its public headers compile.
#if defined(IDEM_KILL_POINTS) || defined(IDEM_HAVE_TESTING)
#error "a build define of idem reached the application"
#endif
#include <iostream>

#include "idem/amqp/source.h"
#include "idem/embedded/queue.h"
#include "idem/http/client.h"
#include "idem/http/idempotency.h"
#include "idem/inbox.h"
#include "idem/kafka/source.h"
#include "idem/open.h"
#include "idem/postgres/store.h"
#include "idem/redis/claim_store.h"
#include "idem/redis/stream_source.h"
#include "idem/sqlite/store.h"

int main() {
  int failed = 0;
  auto check = [&](const char* what, bool ok) {
    std::cout << what << ": " << (ok ? "ok" : "FAILED") << "\n";
    failed += ok ? 0 : 1;
  };
  check("sqlite", idem::sqlite::ParseUrl("sqlite:app.db").ok());
  check("embedded", idem::embedded::Queue::ParseUrl("embedded:queue.db?queue=q").ok());
  check("postgres", idem::postgres::IsUrl("postgres://u@127.0.0.1/db"));
  check("redis", idem::redis::IsUrl("redis://127.0.0.1:6379"));
  volatile auto stream_open = &idem::redis::StreamSource::Open;
  check("redis_streams", stream_open != nullptr);
  check("http", idem::http::ParseKey("\"k-1\"").ok());
  check("amqp", idem::amqp::ParseUrl("amqp://u:p@127.0.0.1:5672/%2f").ok());
  volatile auto decode = &idem::kafka::DecodeReceipt;
  check("kafka", decode != nullptr);
  volatile auto open_store = &idem::OpenStore;
  check("open", open_store != nullptr);
  return failed == 0 ? 0 : 1;
}
