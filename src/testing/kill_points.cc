// Copyright idem authors. SPDX-License-Identifier: Apache-2.0
//
// The kill points' arming API (idem/testing/kill_points.h) over the core's
// registry (src/core/kill_point.h). Compiled into idem::testing only by a
// build with IDEM_WITH_KILL_POINTS.
#include "idem/testing/kill_points.h"

#include <signal.h>

#include <cstdlib>
#include <string>
#include <utility>

#include "core/kill_point.h"

namespace idem {

void ArmKillPoint(std::string_view name, int hit, std::function<void()> action) {
  internal::SetKillPoint(name, hit, std::move(action));
}

void DisarmKillPoints() { internal::ClearKillPoint(); }

bool ArmKillPointFromEnv() {
  const char* v = std::getenv("IDEM_KILL_AT");
  if (v == nullptr || *v == '\0') return false;
  // "<name>", "<name>:<n>" or "<name>:<n>:stop".
  std::string s(v);
  std::function<void()> action;
  if (s.ends_with(":stop")) {
    s.resize(s.size() - 5);
    action = [] { ::raise(SIGSTOP); };
  }
  int hit = 1;
  if (auto colon = s.rfind(':'); colon != std::string::npos) {
    hit = std::atoi(s.c_str() + colon + 1);
    s.resize(colon);
  }
  ArmKillPoint(s, hit, std::move(action));
  return true;
}

}  // namespace idem
