// Copyright idem authors. SPDX-License-Identifier: Apache-2.0
#include "idem/env.h"

#include <pthread.h>
#include <unistd.h>

#include <atomic>
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
    // Reseeded in a child after fork(): a child forked after the parent drew
    // numbers must not repeat the parent's sequence. fork() bumps the
    // generation (pthread_atfork), so a draw costs no getpid() call.
    thread_local uint64_t seeded_for = 0;  // generations start at 1
    thread_local std::mt19937_64 rng;
    const uint64_t gen = ForkGeneration();
    if (seeded_for != gen) {
      seeded_for = gen;
      rng.seed(std::random_device{}() ^ (uint64_t(::getpid()) << 32) ^
               uint64_t(std::hash<std::thread::id>{}(std::this_thread::get_id())));
    }
    return rng();
  }

 private:
  static std::atomic<uint64_t>& Generation() {
    static std::atomic<uint64_t> g{1};
    return g;
  }
  static uint64_t ForkGeneration() {
    static const bool registered = [] {
      (void)::pthread_atfork(nullptr, nullptr, [] { Generation().fetch_add(1, std::memory_order_relaxed); });
      return true;
    }();
    (void)registered;
    return Generation().load(std::memory_order_relaxed);
  }
};

}  // namespace

Env* Env::Default() {
  static auto* env = new RealEnv;
  return env;
}

}  // namespace idem
