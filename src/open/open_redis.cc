// Copyright idem authors. SPDX-License-Identifier: Apache-2.0
// OpenClaimStore's redis:// (src/open/openers.h).
#include "idem/redis/claim_store.h"
#include "open/openers.h"

extern "C" void idem_open_link_redis() {}

namespace idem::open_internal {

Result<std::unique_ptr<ClaimStore>> OpenRedisClaimStore(std::string_view url, const StoreOptions& settings) {
  IDEM_ASSIGN_OR_RETURN(redis::ClaimStore::Options o, redis::ClaimStore::ParseUrl(url));
  if (settings.pool_size > 0) o.pool_size = settings.pool_size;
  IDEM_ASSIGN_OR_RETURN(std::unique_ptr<redis::ClaimStore> store, redis::ClaimStore::Open(o));
  return std::unique_ptr<ClaimStore>(std::move(store));
}

}  // namespace idem::open_internal
