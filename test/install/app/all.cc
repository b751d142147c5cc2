// An application on an install with every component: one call (or one
// symbol) of each, so each library is linked, and its public headers compile.
#if defined(IDEM_KILL_POINTS) || defined(IDEM_HAVE_TESTING)
#error "a build define of idem reached the application"
#endif
#include <iostream>

#include "idem/amqp/publisher.h"
#include "idem/amqp/source.h"
#include "idem/embedded/queue.h"
#include "idem/http/client.h"
#include "idem/http/idempotency.h"
#include "idem/httplib/gateway.h"
#include "idem/httplib/server.h"
#include "idem/inbox.h"
#include "idem/kafka/source.h"
#include "idem/open.h"
#include "idem/postgres/store.h"
#include "idem/redis/claim_store.h"
#include "idem/redis/prefilter.h"
#include "idem/redis/stream_publisher.h"
#include "idem/redis/stream_source.h"
#include "idem/sqlite/store.h"

int main() {
  int failed = 0;
  auto check = [&](const char* what, bool ok) {
    std::cout << what << ": " << (ok ? "ok" : "FAILED") << "\n";
    failed += ok ? 0 : 1;
  };
  // Every adapter by the one shape: T::ParseUrl gives T::Options for T::Open.
  check("sqlite", idem::sqlite::Store::ParseUrl("sqlite:app.db").ok());
  check("embedded", idem::embedded::Queue::ParseUrl("embedded:queue.db?queue=q").ok());
  check("postgres", idem::postgres::Store::ParseUrl("postgres://u@127.0.0.1/db").ok());
  check("redis", idem::redis::ClaimStore::ParseUrl("redis://127.0.0.1:6379").ok());
  check("redis prefilter", idem::redis::Prefilter::ParseUrl("redis://127.0.0.1:6379").ok());
  check("redis_streams", idem::redis::StreamSource::ParseUrl("redis://127.0.0.1:6379?stream=s&group=g").ok());
  check("redis_streams publisher", idem::redis::StreamPublisher::ParseUrl("redis://127.0.0.1:6379?stream=s").ok());
  check("http", idem::http::ParseKey("\"k-1\"").ok());
  check("http client", !idem::http::Client::Open({.base_url = "ftp://x"}).ok());
  volatile auto server_fibers = &idem::httplib::Server::set_fibers;
  check("httplib", server_fibers != nullptr);
  check("httplib keep-alive", idem::httplib::Server::Check({.keep_alive_requests = 100}).ok() &&
                                  !idem::httplib::Server::Check({.keep_alive_requests = 0}).ok());
  check("httplib gateway", !idem::httplib::Gateway::Open({.upstream = "ftp://x"}).ok());
  check("httplib gateway keys", idem::httplib::Gateway::Options{}.max_keys_per_principal == 0);
  check("amqp", idem::amqp::Source::ParseUrl("amqp://u:p@127.0.0.1:5672/%2f?queue=q").ok());
  check("amqp publisher", idem::amqp::Publisher::ParseUrl("amqp://u:p@127.0.0.1:5672/%2f?queue=q").ok());
  check("kafka", idem::kafka::Source::ParseUrl("kafka://127.0.0.1:9092?topic=t&group=g").ok());
  check("kafka publisher", idem::kafka::Publisher::ParseUrl("kafka://127.0.0.1:9092?topic=t").ok());
  // Opening by URL: a bad URL is refused by name, before any connection.
  check("open", !idem::OpenStore("nosuch://x").ok() && !idem::OpenSource("nosuch://x").ok());
  return failed == 0 ? 0 : 1;
}
