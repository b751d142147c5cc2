// Copyright idem authors. SPDX-License-Identifier: Apache-2.0
// OpenSource / OpenPublisher: the source schemes compiled in. (Scaffolding:
// being filled in with the sources' Options/Open/ParseUrl.)
#include "idem/open.h"

namespace idem {

Result<std::unique_ptr<Source>> OpenSource(std::string_view url, const SourceSettings&) {
  return Status::Internal("OpenSource is not implemented yet: '" + std::string(url) + "'");
}
Result<std::unique_ptr<Publisher>> OpenPublisher(std::string_view url) {
  return Status::Internal("OpenPublisher is not implemented yet: '" + std::string(url) + "'");
}
std::vector<std::string> SourceSchemes() { return {}; }

}  // namespace idem
