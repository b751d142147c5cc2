// Copyright idem authors. SPDX-License-Identifier: Apache-2.0
#include "chaos/config.h"

#include <algorithm>
#include <chrono>

namespace idem::cli::chaos {

Consumer::Options ChaosConsumerOptions(const Config& cfg) {
  // Odd slots take batches (the mid-batch kill point lives there). No
  // crash-loop cut-off (max_deliveries): chaos kills consumers on purpose.
  return {.workers = 1,
          .batch = cfg.slot % 2 == 1 ? std::max(1, cfg.batch) : 1,
          .max_attempts = kConsumerMaxAttempts,
          .max_deliveries = 0,
          .backoff_base_ms = kConsumerBackoffBaseMs,
          .backoff_max_ms = kConsumerBackoffMaxMs,
          .receive_wait_ms = 100};
}

int64_t ConsumerRetryBudgetMs() {
  const Consumer::Options o = ChaosConsumerOptions(Config{});
  const int deliveries = o.max_attempts > 0 ? o.max_attempts : 1;
  int64_t between = 0, d = o.backoff_base_ms;
  for (int i = 1; i < deliveries; ++i, d = std::min(o.backoff_max_ms, 2 * d))
    between += std::min(d, o.backoff_max_ms) * 5 / 4;
  return int64_t{deliveries} * (kClientAttempts - 1) * kClientBackoffMaxMs + between;
}

int64_t ProviderLeaseMinMs() { return std::max<int64_t>(50, ConsumerRetryBudgetMs() / 2); }
int64_t ProviderLeaseMaxMs() { return std::max<int64_t>(2'000, 2 * ConsumerRetryBudgetMs()); }

std::string ProviderStore(const Config& cfg) {
  // The provider's durability is its own: WAL without an fsync per commit
  // survives its kills (only a power cut would not).
  return cfg.provider_store.empty() ? "sqlite:" + cfg.dir + "/provider.db?synchronous=normal" : cfg.provider_store;
}

Role RoleOf(const Config& cfg, int slot) {
  if (slot < cfg.consumers) return Role::kStage1;
  return slot < ConsumerSlots(cfg) ? Role::kStage2 : Role::kRelay;
}

const char* RoleName(Role role) {
  switch (role) {
    case Role::kStage1: return "consumer";
    case Role::kStage2: return "stage2";
    case Role::kRelay: return "relay";
  }
  return "consumer";
}

std::string JournalPath(const std::string& dir, Role role, int slot, int64_t life) {
  const char* sub = role == Role::kStage1 ? "/journal/" : role == Role::kStage2 ? "/journal2/" : "/relay/";
  return dir + sub + std::to_string(slot) + "-" + std::to_string(life) + ".log";
}

std::string OrderKey(const Config& cfg, const std::string& order) {
  int64_t n = 0;
  for (char ch : order)
    if (ch >= '0' && ch <= '9') n = n * 10 + (ch - '0');
  return "k" + std::to_string(n % std::max<int64_t>(1, cfg.keys));
}

namespace {
int64_t FaultPart(const Config& cfg) { return std::max<int64_t>(1, cfg.messages / (cfg.faults + 1)); }
}  // namespace

int64_t FaultStartAt(const Config& cfg, int64_t i) { return i * FaultPart(cfg) + FaultPart(cfg) / 2; }

int64_t SteadyMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

}  // namespace idem::cli::chaos
