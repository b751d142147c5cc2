// Copyright idem authors. SPDX-License-Identifier: Apache-2.0
#include "idem/testing/fake_env.h"

namespace idem {

uint64_t FakeEnv::Random() {
  std::lock_guard<std::mutex> l(mu_);
  // splitmix64: deterministic for a seed.
  uint64_t z = (rng_ += 0x9e3779b97f4a7c15ULL);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

}  // namespace idem
