// Copyright idem authors. SPDX-License-Identifier: Apache-2.0
#include "idem/env.h"

#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <random>
#include <string>
#include <thread>

namespace idem {
namespace {

class RealEnv final : public Env {
 public:
  int64_t NowMs() override {
    using namespace std::chrono;
    return duration_cast<milliseconds>(system_clock::now().time_since_epoch()).count();
  }
  void SleepMs(int64_t ms) override {
    if (ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(ms));
  }
  uint64_t Random() override {
    // Reseeded when the process changes: a child forked after the parent
    // drew numbers must not repeat the parent's sequence.
    thread_local pid_t seeded_for = 0;
    thread_local std::mt19937_64 rng;
    if (seeded_for != ::getpid()) {
      seeded_for = ::getpid();
      rng.seed(std::random_device{}() ^ (uint64_t(seeded_for) << 32) ^
               uint64_t(std::hash<std::thread::id>{}(std::this_thread::get_id())));
    }
    return rng();
  }
};

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

Env* Env::Default() {
  static auto* env = new RealEnv;
  return env;
}

uint64_t FakeEnv::Random() {
  std::lock_guard<std::mutex> l(mu_);
  // splitmix64: deterministic for a seed.
  uint64_t z = (rng_ += 0x9e3779b97f4a7c15ULL);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

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
  std::string s(v);
  int hit = 1;
  if (auto colon = s.rfind(':'); colon != std::string::npos) {
    hit = std::atoi(s.c_str() + colon + 1);
    s.resize(colon);
  }
  ArmKillPoint(s, hit);
  return true;
}

}  // namespace idem
