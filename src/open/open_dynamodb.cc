// Copyright idem authors. SPDX-License-Identifier: Apache-2.0
// OpenStore's (and so OpenClaimStore's) dynamodb:// (src/open/openers.h).
#include "idem/dynamodb/store.h"
#include "open/openers.h"

extern "C" void idem_open_link_dynamodb() {}

namespace idem::open_internal {

Result<std::unique_ptr<Store>> OpenDynamodbStore(std::string_view url, const StoreOptions& settings) {
  IDEM_ASSIGN_OR_RETURN(dynamodb::Store::Options o, dynamodb::Store::ParseUrl(url));
  o.create_if_missing = o.create_if_missing && settings.create_if_missing;
  if (settings.pool_size > 0) o.pool_size = settings.pool_size;
  if (settings.env != nullptr) o.env = settings.env;
  return dynamodb::Store::Open(o);
}

}  // namespace idem::open_internal
