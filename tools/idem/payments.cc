// Copyright idem authors. SPDX-License-Identifier: Apache-2.0
#include "payments.h"

#include <chrono>
#include <cstdlib>
#include <nlohmann/json.hpp>

#include "idem/env.h"
#include "idem/sqlite/store.h"

namespace idem::cli {

Result<std::unique_ptr<http::Client>> ProviderClient(const std::string& url, int max_attempts,
                                                     int64_t read_timeout_ms) {
  return http::Client::Open({.base_url = url,
                             .bearer = kApiKey,
                             .max_attempts = max_attempts,
                             .backoff_base_ms = 2,
                             .backoff_max_ms = 100,
                             .connect_timeout_ms = 2'000,
                             .read_timeout_ms = read_timeout_ms});
}

std::string ChargeBody(const std::string& order, int64_t cents) {
  return nlohmann::json{
      {"amount", cents}, {"currency", "usd"}, {"customer", "cus_" + order}, {"description", "order " + order}}
      .dump();
}

Result<ChargeReply> Charge(http::Client& client, const Message& m) {
  IDEM_ASSIGN_OR_RETURN(auto pay, ParsePayment(m));
  IDEM_ASSIGN_OR_RETURN(http::Response r,
                        client.Post("/charges", ChargeBody(pay.first, pay.second), DownstreamKey(m, "charge")));
  if (r.status != 201)
    return Status::Internal("the provider answered " + std::to_string(r.status) + ": " + r.body.substr(0, 300));
  nlohmann::json j = nlohmann::json::parse(r.body, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object() || !j.contains("id") || !j["id"].is_string())
    return Status::Internal("the provider's answer has no charge id: " + r.body.substr(0, 300));
  return ChargeReply{j["id"].get<std::string>(), r.attempts, r.replayed};
}

Result<ProviderTotals> ProviderCharges(const std::string& path) {
  IDEM_ASSIGN_OR_RETURN(auto db, sqlite::Store::Open({.path = path}));
  IDEM_ASSIGN_OR_RETURN(auto tx, db->Begin());
  IDEM_ASSIGN_OR_RETURN(Rows r, tx->Query("SELECT count(*), coalesce(sum(amount), 0), count(DISTINCT idem_key)"
                                          " FROM provider_charges"));
  return ProviderTotals{r.rows[0][0].AsInt(), r.rows[0][1].AsInt(), r.rows[0][2].AsInt()};
}

Result<http::Client*> ThreadClients::Get() {
  std::lock_guard lock(mu_);
  auto& c = clients_[std::this_thread::get_id()];
  if (!c) {
    auto made = ProviderClient(url_, max_attempts_, read_timeout_ms_);
    if (!made.ok()) return made.status();
    c = std::move(*made);
  }
  return c.get();
}

Result<std::vector<Delivery>> FaultySource::Receive(int max, int64_t wait_ms) {
  auto got = inner_.Receive(max, wait_ms);
  if (got.ok()) {
    received += got->size();
    if (on_event)
      for (const Delivery& d : *got) on_event('R', d);
    if (!got->empty() && Roll(stall_rate_)) {
      ++stalls;
      if (on_event) on_event('S', got->front());
      std::this_thread::sleep_for(std::chrono::milliseconds(stall_ms_));
    }
  }
  return got;
}

Status FaultySource::Ack(const Delivery& d) {
  if (Roll(lost_ack_rate_)) {
    ++lost_acks;
    if (on_event) on_event('L', d);
    return Status::OK();  // the consumer thinks it acked; the broker never heard
  }
  if (on_event) on_event('A', d);
  Status s = inner_.Ack(d);
  if (s.code() == Code::kLeaseLost) {
    ++stale_acks;
    if (on_event) on_event('X', d);
  }
  return s;
}

Status FaultySource::ExtendLease(const Delivery& d) {
  Status s = inner_.ExtendLease(d);
  if (s.code() == Code::kLeaseLost && on_event) on_event('X', d);
  return s;
}

bool FaultySource::Roll(double p) {
  std::lock_guard<std::mutex> l(mu_);
  return std::uniform_real_distribution<double>(0, 1)(rng_) < p;
}

}  // namespace idem::cli
