// Copyright idem authors. SPDX-License-Identifier: Apache-2.0
//
// The kill-point registry: compiled into idem::core only by a build with
// IDEM_WITH_KILL_POINTS (src/core/kill_point.h).
#include "core/kill_point.h"

#include <signal.h>
#include <unistd.h>

#include <mutex>
#include <string>
#include <utility>

namespace idem::internal {
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

void SetKillPoint(std::string_view name, int hit, std::function<void()> action) {
  KillState& k = Kill();
  std::lock_guard<std::mutex> l(k.mu);
  k.name = std::string(name);
  k.hit = hit < 1 ? 1 : hit;
  k.seen = 0;
  k.action = std::move(action);
  g_kill_point_armed.store(true);
}

void ClearKillPoint() {
  KillState& k = Kill();
  std::lock_guard<std::mutex> l(k.mu);
  g_kill_point_armed.store(false);
  k.name.clear();
  k.action = nullptr;
}

}  // namespace idem::internal
