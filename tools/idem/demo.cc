// Copyright idem authors. SPDX-License-Identifier: Apache-2.0
#include "commands.h"
namespace idem::cli {
const Command& DemoCommand() {
  static const Command c{"demo", "Tell the seed's story by doing it (in progress).", "[--json]", {{"json", "", "", "print one JSON object"}}};
  return c;
}
int RunDemo(const Args&) { return Fail("demo", Status::Internal("not yet implemented")); }
}  // namespace idem::cli
