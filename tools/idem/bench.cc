// Copyright idem authors. SPDX-License-Identifier: Apache-2.0
#include "commands.h"
namespace idem::cli {
const Command& BenchCommand() {
  static const Command c{"bench", "Benchmarks (in progress).", "marker [flags]", {}};
  return c;
}
int RunBench(const Args&) { return Fail("bench", Status::Internal("not yet implemented")); }
}  // namespace idem::cli
