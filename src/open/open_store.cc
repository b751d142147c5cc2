// Copyright idem authors. SPDX-License-Identifier: Apache-2.0
// OpenStore / OpenClaimStore: the store schemes compiled in. (Scaffolding:
// being filled in with the stores' Options/Open/ParseUrl.)
#include "idem/open.h"

namespace idem {

Result<std::unique_ptr<Store>> OpenStore(std::string_view url) {
  return Status::Internal("OpenStore is not implemented yet: '" + std::string(url) + "'");
}
Result<std::unique_ptr<ClaimStore>> OpenClaimStore(std::string_view url) {
  return Status::Internal("OpenClaimStore is not implemented yet: '" + std::string(url) + "'");
}
std::vector<std::string> StoreSchemes() { return {}; }

}  // namespace idem
