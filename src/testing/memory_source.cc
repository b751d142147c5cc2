// Copyright idem authors. SPDX-License-Identifier: Apache-2.0
#include "idem/testing/memory_source.h"

#include <algorithm>
#include <chrono>
#include <string>

namespace idem::testing {

MemorySource::MemorySource() : MemorySource(Options{}) {}
MemorySource::MemorySource(Options options) : options_(options) {}

void MemorySource::Push(Message message) {
  std::lock_guard<std::mutex> l(mu_);
  Entry e;
  e.message = std::move(message);
  entries_.emplace(next_seq_++, std::move(e));
  cv_.notify_all();
}

void MemorySource::LoseAcks(int n) {
  std::lock_guard<std::mutex> l(mu_);
  lose_acks_ += n;
}

Result<std::vector<Delivery>> MemorySource::Receive(int max, int64_t wait_ms) {
  if (max <= 0) return Status::InvalidArgument("MemorySource::Receive: max must be > 0, not " + std::to_string(max));
  // The wait is on the real clock (a FakeEnv moves only when told); leases
  // and delays are on the source's.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(std::max<int64_t>(0, wait_ms));
  std::unique_lock<std::mutex> l(mu_);
  for (;;) {
    std::vector<Delivery> out;
    const int64_t now = env().NowMs();
    for (auto& [seq, e] : entries_) {
      if (static_cast<int>(out.size()) >= max) break;
      if (e.visible_at_ms > now) continue;
      e.receipt = next_receipt_++;
      e.attempts++;
      // Out until acked, nacked or (with a lease) its lease runs out.
      e.visible_at_ms = options_.lease_ms > 0 ? now + options_.lease_ms : INT64_MAX;
      Delivery d;
      d.message = e.message;
      d.message.attempt = e.attempts;
      d.receipt = std::to_string(seq) + ":" + std::to_string(e.receipt);
      out.push_back(std::move(d));
      deliveries_++;
    }
    if (!out.empty() || std::chrono::steady_clock::now() >= deadline) return out;
    // A short wait at a time: a message's time may come on the source's
    // clock without anything to notify.
    cv_.wait_until(l, std::min(deadline, std::chrono::steady_clock::now() + std::chrono::milliseconds(10)));
  }
}

namespace {
// "<seq>:<receipt>" back into its numbers; false when malformed.
bool ParseReceipt(const std::string& r, uint64_t& seq, uint64_t& receipt) {
  size_t colon = r.find(':');
  if (colon == std::string::npos) return false;
  try {
    seq = std::stoull(r.substr(0, colon));
    receipt = std::stoull(r.substr(colon + 1));
  } catch (...) {
    return false;
  }
  return true;
}
}  // namespace

Status MemorySource::Ack(const Delivery& delivery) {
  uint64_t seq = 0, receipt = 0;
  if (!ParseReceipt(delivery.receipt, seq, receipt)) {
    return Status::InvalidArgument("MemorySource::Ack: not a receipt of this source: " + delivery.receipt);
  }
  std::lock_guard<std::mutex> l(mu_);
  auto it = entries_.find(seq);
  if (it == entries_.end() || it->second.receipt != receipt) {
    return Status::LeaseLost("MemorySource::Ack: the delivery of " + delivery.message.id +
                             " is no longer this receiver's (acked, or delivered again since)");
  }
  if (lose_acks_ > 0) {
    lose_acks_--;
    lost_acks_++;
    it->second.receipt = 0;
    if (options_.lease_ms == 0) it->second.visible_at_ms = 0;  // comes again at once
    cv_.notify_all();
    return Status::OK();
  }
  acked_++;
  acked_ids_.push_back(it->second.message.id);
  entries_.erase(it);
  return Status::OK();
}

Status MemorySource::Nack(const Delivery& delivery, int64_t delay_ms) {
  uint64_t seq = 0, receipt = 0;
  if (!ParseReceipt(delivery.receipt, seq, receipt)) {
    return Status::InvalidArgument("MemorySource::Nack: not a receipt of this source: " + delivery.receipt);
  }
  std::lock_guard<std::mutex> l(mu_);
  auto it = entries_.find(seq);
  if (it == entries_.end() || it->second.receipt != receipt) {
    return Status::LeaseLost("MemorySource::Nack: the delivery of " + delivery.message.id +
                             " is no longer this receiver's");
  }
  nacked_++;
  it->second.receipt = 0;
  it->second.visible_at_ms = env().NowMs() + std::max<int64_t>(0, delay_ms);
  cv_.notify_all();
  return Status::OK();
}

Status MemorySource::ExtendLease(const Delivery& delivery) {
  uint64_t seq = 0, receipt = 0;
  if (!ParseReceipt(delivery.receipt, seq, receipt)) {
    return Status::InvalidArgument("MemorySource::ExtendLease: not a receipt of this source: " + delivery.receipt);
  }
  std::lock_guard<std::mutex> l(mu_);
  auto it = entries_.find(seq);
  if (it == entries_.end() || it->second.receipt != receipt) {
    return Status::LeaseLost("MemorySource::ExtendLease: " + delivery.message.id + " was delivered again");
  }
  if (options_.lease_ms > 0) it->second.visible_at_ms = env().NowMs() + options_.lease_ms;
  return Status::OK();
}

int64_t MemorySource::deliveries() const {
  std::lock_guard<std::mutex> l(mu_);
  return deliveries_;
}
int64_t MemorySource::acked() const {
  std::lock_guard<std::mutex> l(mu_);
  return acked_;
}
int64_t MemorySource::lost_acks() const {
  std::lock_guard<std::mutex> l(mu_);
  return lost_acks_;
}
int64_t MemorySource::nacked() const {
  std::lock_guard<std::mutex> l(mu_);
  return nacked_;
}
int64_t MemorySource::pending() const {
  std::lock_guard<std::mutex> l(mu_);
  return static_cast<int64_t>(entries_.size());
}
std::vector<std::string> MemorySource::acked_ids() const {
  std::lock_guard<std::mutex> l(mu_);
  return acked_ids_;
}

}  // namespace idem::testing
