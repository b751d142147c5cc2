// Copyright idem authors. SPDX-License-Identifier: Apache-2.0
#include "idem/testing/kill_points.h"

#include <signal.h>
#include <unistd.h>

#include <cstdlib>
#include <mutex>
#include <string>
#include <utility>

namespace idem {
namespace {

struct KillState {
  std::mutex mu;
  std::string name;
  int hit = 0;
  int seen = 0;
  std::function<void()> action;
};
KillState& Kill() {
  static auto* k = new KillState;  // never destroyed: hit from any thread until exit
  return *k;
}

}  // namespace

namespace internal {
std::atomic<bool> g_kill_point_armed{false};

void HitKillPoint(std::string_view name) {
  std::function<void()> action;
  {
    KillState& k = Kill();
    std::lock_guard<std::mutex> l(k.mu);
    if (k.name != name) return;
    if (++k.seen != k.hit) return;
    action = k.action;
  }
  if (action) {
    action();
    return;
  }
  ::kill(::getpid(), SIGKILL);
  for (;;) ::pause();  // SIGKILL is not deliverable late, but never return
}
}  // namespace internal

void ArmKillPoint(std::string_view name, int hit, std::function<void()> action) {
  KillState& k = Kill();
  std::lock_guard<std::mutex> l(k.mu);
  k.name = std::string(name);
  k.hit = hit < 1 ? 1 : hit;
  k.seen = 0;
  k.action = std::move(action);
  internal::g_kill_point_armed.store(true);
}

void DisarmKillPoints() {
  KillState& k = Kill();
  std::lock_guard<std::mutex> l(k.mu);
  internal::g_kill_point_armed.store(false);
  k.name.clear();
  k.action = nullptr;
}

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
