// Copyright idem authors. SPDX-License-Identifier: Apache-2.0
//
// The components this idem command was built with (IDEM_HAVE_<COMPONENT>,
// set by tools/idem/CMakeLists.txt from the IDEM_WITH_<COMPONENT> options),
// and the error a command gives for one that was not: kInvalidArgument, so
// exit status 2, naming the configure flag that builds it.
#ifndef IDEM_TOOLS_IDEM_COMPONENTS_H_
#define IDEM_TOOLS_IDEM_COMPONENTS_H_

#include <string>
#include <string_view>

#include "idem/status.h"
#include "idem/url.h"

namespace idem::cli {

inline Status NotBuilt(std::string_view what, std::string_view option) {
  return Status::InvalidArgument(std::string(what) + " is not built into this idem: configure idem with -D" +
                                 std::string(option) + "=ON (see doc/install.md)");
}

// Whether `url` names a PostgreSQL server, whether or not its component is built.
inline bool IsPostgresScheme(std::string_view url) {
  const std::string scheme = UrlScheme(url);
  return scheme == "postgres" || scheme == "postgresql";
}

}  // namespace idem::cli

#endif  // IDEM_TOOLS_IDEM_COMPONENTS_H_
