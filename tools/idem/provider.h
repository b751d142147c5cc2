// Copyright idem authors. SPDX-License-Identifier: Apache-2.0
//
// The demo's payment provider: an external system with its own database,
// which no transaction of the consumer covers. It honours an idempotency key:
// the first call with a key charges and stores the result; every later call
// with that key returns the stored result and charges nothing.
//
// Thread safety: one Provider per thread or process; many processes may share
// the file.
#ifndef IDEM_TOOLS_IDEM_PROVIDER_H_
#define IDEM_TOOLS_IDEM_PROVIDER_H_

#include <cstdint>
#include <memory>
#include <string>

#include "idem/result.h"
#include "idem/store.h"

namespace idem::cli {

struct ChargeResult {
  std::string charge_id;  // "ch_<n>"
  int64_t cents = 0;
  bool replayed = false;  // the key was seen before: stored result returned
};

class Provider {
 public:
  // Opens (creating) the provider's own database at `path`.
  static Result<std::unique_ptr<Provider>> Open(const std::string& path);

  // Charges `cents` for `order` once per idempotency key. With
  // `lose_response`, the charge is made and stored but the caller gets
  // Code::kUnavailable, as when the response is lost on the network.
  Result<ChargeResult> Charge(const std::string& key, const std::string& order, int64_t cents,
                              bool lose_response = false);
  // Charges made (rows) and their total.
  Result<std::pair<int64_t, int64_t>> Totals();
  // Calls received, including replays.
  Result<int64_t> Calls();

 private:
  explicit Provider(std::unique_ptr<Store> db) : db_(std::move(db)) {}
  std::unique_ptr<Store> db_;
};

}  // namespace idem::cli

#endif  // IDEM_TOOLS_IDEM_PROVIDER_H_
