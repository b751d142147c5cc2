// Copyright idem authors. SPDX-License-Identifier: Apache-2.0
#include "idem/env.h"

#include <unistd.h>

#include <chrono>
#include <random>
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

}  // namespace

Env* Env::Default() {
  static auto* env = new RealEnv;
  return env;
}

}  // namespace idem
