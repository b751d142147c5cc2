// Copyright idem authors. SPDX-License-Identifier: Apache-2.0
//
// Internal: an environment variable's value, "" when it is unset (the cloud
// adapters' credentials, endpoints and tokens).
#ifndef IDEM_SRC_CORE_ENV_VAR_H_
#define IDEM_SRC_CORE_ENV_VAR_H_

#include <cstdlib>
#include <string>

namespace idem::internal {

inline std::string EnvVar(const char* name) {
  const char* v = std::getenv(name);
  return v == nullptr ? std::string() : std::string(v);
}

}  // namespace idem::internal

#endif  // IDEM_SRC_CORE_ENV_VAR_H_
