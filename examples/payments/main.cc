// The seed's payments consumer, written as a user would write it: messages
// from the embedded queue, the marker and the payment row in one SQLite
// transaction, the ack after the commit. The charge itself is a POST over
// HTTP to a payment provider that no transaction of ours covers, so it
// carries the idempotency key DownstreamKey(message, "charge"): the same key
// on every retry of the request and every redelivery of the message, and the
// provider charges once per key.
//
// The provider is a stand-in, served from this process on 127.0.0.1 (any
// free port) with a database of its own: an idem::httplib::Server (cpp-httplib's) whose
// POST /charges is guarded by idem::http::Idempotency (idem::httplib::Wrap), as a real provider
// (Stripe, say) honours the Idempotency-Key header.
//
//   payments DIR     (DIR must exist; prints the payments table at the end)
#include <httplib.h>

#include <cstdlib>
#include <iostream>
#include <memory>
#include <string>
#include <thread>

#include "idem/claims.h"
#include "idem/consumer.h"
#include "idem/embedded/queue.h"
#include "idem/http/client.h"
#include "idem/http/idempotency.h"
#include "idem/httplib/middleware.h"
#include "idem/httplib/server.h"
#include "idem/inbox.h"
#include "idem/sqlite/store.h"

namespace {

// ------------------------------------------------------------ the provider

// POST /charges (form-encoded amount, currency, description) creates one
// charge per Idempotency-Key and answers 201 with Location: /charges/<id>;
// a repeat of the key gets that answer again (Idempotent-Replayed: true).
class Provider {
 public:
  static idem::Result<std::unique_ptr<Provider>> Start(const std::string& path) {
    auto p = std::unique_ptr<Provider>(new Provider());
    IDEM_ASSIGN_OR_RETURN(p->db_, idem::sqlite::Store::Open({.path = path}));
    {
      IDEM_ASSIGN_OR_RETURN(auto tx, p->db_->Begin());
      IDEM_RETURN_IF_ERROR(tx->Exec("CREATE TABLE IF NOT EXISTS charges(id INTEGER PRIMARY KEY,"
                                    " idem_key TEXT NOT NULL UNIQUE, cents INTEGER NOT NULL, description TEXT)")
                               .status());
      IDEM_RETURN_IF_ERROR(tx->Commit());
    }
    p->claims_ = std::make_unique<idem::Claims>(*p->db_->claim_store());
    IDEM_ASSIGN_OR_RETURN(
        p->idempotency_,
        idem::http::Idempotency::Open({.claims = p->claims_.get(),
                                       .authenticate = idem::http::BearerKeys({{"sk_test_example", "acct_example"}})}));
    Provider* self = p.get();
    // A bad amount is refused before the key is claimed: nothing is stored,
    // and the client may send the corrected request with the same key.
    auto validate = [](const httplib::Request& req, httplib::Response& res) {
      if (Cents(req) > 0) return true;
      res.status = 400;
      res.set_content(R"({"error":"amount must be a positive integer, in cents"})", "application/json");
      return false;
    };
    IDEM_ASSIGN_OR_RETURN(
        auto charge,
        idem::httplib::Wrap(
            *p->idempotency_, "/charges", {},
            [self](const httplib::Request& req, httplib::Response& res) { self->Charge(req, res); }, validate));
    p->server_.native().Post("/charges", charge);
    p->port_ = p->server_.native().bind_to_any_port("127.0.0.1");
    if (p->port_ <= 0) return idem::Status::Unavailable("cannot bind 127.0.0.1");
    p->thread_ = std::thread([self] { self->server_.native().listen_after_bind(); });
    return p;
  }
  ~Provider() {
    server_.native().stop();
    if (thread_.joinable()) thread_.join();
  }
  std::string url() const { return "http://127.0.0.1:" + std::to_string(port_); }
  // Charges made and their total, from the provider's database.
  std::pair<int64_t, int64_t> Totals() {
    auto tx = db_->Begin();
    auto r = (*tx)->Query("SELECT count(*), coalesce(sum(cents), 0) FROM charges");
    return {r->rows[0][0].AsInt(), r->rows[0][1].AsInt()};
  }

 private:
  Provider() = default;
  static long long Cents(const httplib::Request& req) { return std::atoll(req.get_param_value("amount").c_str()); }
  // Runs once per key (the middleware replays every repeat), for a request
  // the policy's validate let through.
  void Charge(const httplib::Request& req, httplib::Response& res) {
    const long long cents = Cents(req);
    auto tx = db_->Begin();
    if (!tx.ok()) return Unavailable(res);
    auto ins = (*tx)->Query(
        "INSERT INTO charges(idem_key, cents, description) VALUES ($1, $2, $3) RETURNING id",
        {idem::http::CurrentClaim()->key, static_cast<int64_t>(cents), req.get_param_value("description")});
    if (!ins.ok() || !(*tx)->Commit().ok()) return Unavailable(res);
    const std::string id = "ch_" + ins->rows[0][0].AsText();
    res.status = 201;
    res.set_header("Location", "/charges/" + id);
    res.set_content(R"({"id":")" + id + R"(","amount":)" + std::to_string(cents) + "}", "application/json");
  }
  static void Unavailable(httplib::Response& res) {  // 5xx: not stored, the client retries
    res.status = 503;
    res.set_content(R"({"error":"store unavailable"})", "application/json");
  }

  std::unique_ptr<idem::Store> db_;
  std::unique_ptr<idem::Claims> claims_;
  std::unique_ptr<idem::http::Idempotency> idempotency_;
  idem::httplib::Server server_;
  std::thread thread_;
  int port_ = 0;
};

}  // namespace

// ------------------------------------------------------------ the consumer

int main(int argc, char** argv) {
  std::string dir = argc > 1 ? argv[1] : ".";
  auto provider = Provider::Start(dir + "/provider.db");
  auto store = idem::sqlite::Store::Open({.path = dir + "/payments.db"});
  auto queue = idem::embedded::Queue::Open({.path = dir + "/queue.db", .queue = "payments"});
  if (!provider.ok() || !store.ok() || !queue.ok()) {
    std::cerr << (!provider.ok() ? provider.status() : !store.ok() ? store.status() : queue.status()) << "\n";
    return 1;
  }
  {
    auto tx = (*store)->Begin();
    if (!tx.ok() ||
        !(*tx)->Exec("CREATE TABLE IF NOT EXISTS payments(order_id TEXT, cents INTEGER, charge_id TEXT)").ok() ||
        !(*tx)->Commit().ok())
      return 1;
  }

  // A producer that retries: every fact is published twice.
  for (int i = 0; i < 2; ++i) {
    (void)(*queue)->Publish({.id = "order-1042-charge", .payload = "4000"});
    (void)(*queue)->Publish({.id = "order-1043-charge", .payload = "2500"});
  }

  // The provider's client: retries lost responses, timeouts, 409 and 5xx
  // with the same key. One per thread; the consumer runs one worker.
  auto client = idem::http::Client::Open({.base_url = (*provider)->url(), .bearer = "sk_test_example"});
  if (!client.ok()) {
    std::cerr << client.status() << "\n";
    return 1;
  }

  // The consumer: the provider call carries the message's key; the handler's
  // SQL runs in the transaction that holds the marker.
  auto inbox = idem::Inbox::Open(**store, {.consumer = "payments"});
  if (!inbox.ok()) {
    std::cerr << inbox.status() << "\n";
    return 1;
  }
  auto consumer = idem::Consumer::Open(
      **queue, **inbox,
      [&](idem::Transaction& tx, const idem::Message& m) -> idem::Status {
        auto charged = (*client)->Post("/charges", "amount=" + m.payload + "&currency=usd&description=" + m.id,
                                       idem::DownstreamKey(m, "charge"), "application/x-www-form-urlencoded");
        if (!charged.ok()) return charged.status();  // rolled back; the redelivery sends the same key
        if (charged->status != 201)
          return idem::Status::HandlerFailed("the provider answered " + std::to_string(charged->status) + ": " +
                                             charged->body);
        const std::string location = charged->header("Location");  // "/charges/ch_1"
        return tx
            .Exec("INSERT INTO payments(order_id, cents, charge_id) VALUES ($1, $2, $3)",
                  {m.id.substr(0, 10), std::atoll(m.payload.c_str()), location.substr(location.rfind('/') + 1)})
            .status();
      },
      {.stop_when_idle = true});
  if (!consumer.ok()) {
    std::cerr << consumer.status() << "\n";
    return 1;
  }
  idem::StopOnSignals(consumer->get());
  if (auto s = (*consumer)->Run(); !s.ok()) {
    std::cerr << s << "\n";
    return 1;
  }

  auto tx = (*store)->Begin();
  auto rows = (*tx)->Query(
      "SELECT order_id, sum(cents), count(*), group_concat(charge_id) FROM payments GROUP BY order_id ORDER BY 1");
  for (const auto& r : rows->rows)
    std::cout << r[0].AsText() << " charged " << r[1].AsInt() << " cents in " << r[2].AsInt() << " row(s) ("
              << r[3].AsText() << ")\n";
  idem::InboxCounters c = (*inbox)->counters();
  std::cout << "applied " << c.applied << ", duplicates skipped " << c.duplicates << "\n";
  auto [charges, cents] = (*provider)->Totals();
  std::cout << "provider (HTTP on " << (*provider)->url() << "): " << charges << " charge(s), " << cents << " cents\n";
  return c.applied == 2 && charges == 2 && cents == 6500 ? 0 : 1;
}
