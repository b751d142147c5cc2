// Copyright idem authors. SPDX-License-Identifier: Apache-2.0
//
// The seed's payments workload, shared by `idem demo` and `idem chaos`: a
// payment message ("ORDER:CENTS"), the effect row it commits with its
// marker, the call to the payment provider over HTTP with the key
// DownstreamKey(message, "charge"), and a source wrapper that loses acks and
// stalls past the lease as networks and slow consumers do.
#ifndef IDEM_TOOLS_IDEM_PAYMENTS_H_
#define IDEM_TOOLS_IDEM_PAYMENTS_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "idem/http/client.h"
#include "idem/message.h"
#include "idem/result.h"
#include "idem/source.h"
#include "idem/store.h"

namespace idem::cli {

// A payment message's payload: "<order>:<cents>".
std::string PaymentPayload(const std::string& order, int64_t cents);
Result<std::pair<std::string, int64_t>> ParsePayment(const Message& m);
Message PaymentMessage(const std::string& id, const std::string& order, int64_t cents);

// The effect: one row in `table` (order_id, message_id, cents, charge_id),
// in the transaction that also holds the message's marker. The table has no
// unique key on message_id on purpose: a second application would show as a
// second row.
std::string CreatePaymentsSql(const std::string& table);
Status InsertPayment(Transaction& tx, const Message& m, const std::string& charge_id = "",
                     const std::string& table = "demo_payments");
// The effect table of `store` emptied (created when missing). On DynamoDB
// a table of the store's account and region, key (message_id, row).
Status ResetPayments(Store& store, const std::string& table);
// The same, created when missing and otherwise left as it is.
Status EnsurePayments(Store& store, const std::string& table);
// The effect rows, all of them or those of one message, read in a
// transaction of their own.
struct PaymentRow {
  std::string order_id{}, message_id{}, charge_id{};  // charge_id: "" when none
  int64_t cents = 0;
};
Result<std::vector<PaymentRow>> ReadPayments(Store& store, const std::string& table,
                                             const std::string& message_id = "");
// The consumer's failure counts and dead letters forgotten (a run that
// starts again on a store an earlier run used).
Status ForgetFailures(Store& store, const std::string& consumer);

// The API key the demo and chaos consumers send, and the account it is at
// the provider.
inline constexpr const char* kApiKey = "sk_demo";
inline constexpr const char* kPrincipal = "acct_demo";

// A client of the provider at `url`: the same key on every retry, backoff
// with jitter; a dropped connection fails at once and is retried within a
// few milliseconds. `max_attempts` bounds one call (a redelivery makes more).
Result<std::unique_ptr<http::Client>> ProviderClient(const std::string& url, int max_attempts = 8,
                                                     int64_t read_timeout_ms = 10'000);

// POST /charges's body for a payment message.
std::string ChargeBody(const std::string& order, int64_t cents);

struct ChargeReply {
  std::string charge_id;
  int attempts = 0;       // requests the client sent, the answered one included
  bool replayed = false;  // Idempotent-Replayed: true
};
// Charges the message's amount once, whatever happens to the responses: the
// key is the same on every retry and every redelivery of the message.
Result<ChargeReply> Charge(http::Client& client, const Message& m);

// Charges made and their total, read from the provider's own SQLite file.
struct ProviderTotals {
  int64_t charges = 0, cents = 0, keys = 0;
};
Result<ProviderTotals> ProviderCharges(const std::string& path);

// One provider client per calling thread (each keeps its connection).
class ThreadClients {
 public:
  explicit ThreadClients(std::string url, int max_attempts = 8, int64_t read_timeout_ms = 10'000)
      : url_(std::move(url)), max_attempts_(max_attempts), read_timeout_ms_(read_timeout_ms) {}
  Result<http::Client*> Get();

 private:
  std::string url_;
  int max_attempts_;
  int64_t read_timeout_ms_;
  std::mutex mu_;
  std::map<std::thread::id, std::unique_ptr<http::Client>> clients_;
};

// Breaks the source the way networks and slow consumers do: a fraction of
// acks are lost (the consumer is told OK, the broker never hears, and the
// message comes back after its lease), and a fraction of receives stall past
// the lease (the message goes to a competing consumer while this one still
// works on it). Seeded.
class FaultySource final : public Source {
 public:
  FaultySource(Source& inner, uint64_t seed, double lost_ack_rate, double stall_rate, int64_t stall_ms)
      : inner_(inner), rng_(seed), lost_ack_rate_(lost_ack_rate), stall_rate_(stall_rate), stall_ms_(stall_ms) {}
  Result<std::vector<Delivery>> Receive(int max, int64_t wait_ms) override;
  Status Ack(const Delivery& d) override;
  Status Nack(const Delivery& d, int64_t delay_ms) override { return inner_.Nack(d, delay_ms); }
  std::string_view Kind() const override { return inner_.Kind(); }
  // The lease is the inner source's: the consumer renews it through here.
  int64_t lease_ms() const override { return inner_.lease_ms(); }
  Status ExtendLease(const Delivery& d) override;
  // A lost ack leaves the message in the inner source: its horizon holds.
  Result<RedeliveryHorizon> Horizon() override { return inner_.Horizon(); }

  std::atomic<uint64_t> received{0}, lost_acks{0}, stalls{0}, stale_acks{0};
  // Called (when set, before Run) for each delivery received ('R'), each
  // stall ('S', with the first delivery of the batch), each ack lost ('L'),
  // each ack passed to the broker ('A') and each ack or lease renewal the
  // broker refused because the lease was lost ('X').
  std::function<void(char event, const Delivery& d)> on_event;

 private:
  bool Roll(double p);
  Source& inner_;
  std::mutex mu_;
  std::mt19937_64 rng_;
  double lost_ack_rate_, stall_rate_;
  int64_t stall_ms_;
};

}  // namespace idem::cli

#endif  // IDEM_TOOLS_IDEM_PAYMENTS_H_
