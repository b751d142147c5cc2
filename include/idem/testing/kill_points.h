// Copyright idem authors. SPDX-License-Identifier: Apache-2.0
//
// Kill points: named places in the library's code where a test or
// `idem chaos` can crash the process on purpose (the crash and chaos suites).
// Part of the test kit (idem::testing), and only of a build with
// -DIDEM_WITH_KILL_POINTS=ON (which ./run test and ./run demo do; the default
// is OFF, and the library then has no kill points and this header is not
// installed). Not for a user's production code.
//
// When a kill point is armed, reaching it the n-th time runs its action: by
// default the process sends itself SIGKILL, as a crash or power cut would.
// Arm from a test with ArmKillPoint(), or from outside a process through the
// environment variable IDEM_KILL_AT="<name>" or "<name>:<n>" (read by
// ArmKillPointFromEnv(), which the idem CLI calls at start). With
// "<name>:<n>:stop" the n-th hit stops the process instead (SIGSTOP, as a
// pause of the whole process would) and it carries on where it stopped when
// it gets SIGCONT: `idem chaos` pauses holders of work that way.
//
// The names (inbox.after_marker, relay.after_publish, ...) are listed in
// doc/reliability.md.
//
// Thread safety: safe from many threads.
#ifndef IDEM_TESTING_KILL_POINTS_H_
#define IDEM_TESTING_KILL_POINTS_H_

#include <functional>
#include <string_view>

namespace idem {

// Arms `name`: its `hit`-th hit (1-based) runs `action`, or SIGKILLs the
// process when `action` is empty. Only one point is armed at a time.
void ArmKillPoint(std::string_view name, int hit = 1, std::function<void()> action = {});
// Disarms whatever is armed.
void DisarmKillPoints();
// Arms from IDEM_KILL_AT if set. Returns whether something was armed.
bool ArmKillPointFromEnv();

}  // namespace idem

#endif  // IDEM_TESTING_KILL_POINTS_H_
