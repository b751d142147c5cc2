// Copyright idem authors. SPDX-License-Identifier: Apache-2.0
//
// FaultVfs: a SQLite VFS that breaks things on purpose, for tests and
// `idem chaos`. NEVER for production. It exists to show that exactly-once
// effects survive I/O errors, a full disk, a process killed halfway through a
// commit, and a power cut.
//
// It wraps the default VFS ("unix") under the name "idem-fault" (never as the
// default) and forwards everything, except what its one process-wide
// controller says. Install() registers it with SQLite; then open a store or a
// queue through it with Options::vfs or the URL option "?vfs=idem-fault" (the
// idem command of a build with kill points registers it at start):
//
//   idem::sqlite::FaultVfs* vfs = *idem::sqlite::FaultVfs::Install();
//   vfs->Arm({.action = FaultVfs::Action::kIoError, .op = FaultVfs::Op::kSync, .at = 3});
//   ...                      // the 3rd sync after Arm() fails: SQLITE_IOERR_FSYNC
//   vfs->Disarm();
//
// Counting. Reads, writes, syncs and truncates of main database, WAL and
// rollback-journal files are counted per class across every file opened
// through the VFS, in the order they happen. A fault fires at the at-th
// operation after Arm() that matches it (class and file kind). Temporary files
// and the WAL index (-shm) are forwarded untouched and never counted.
//
// Power-loss mode. Writes and truncates are held back in this process's
// memory, per file, until that file is synced; reads and sizes see them, as
// they would see the OS page cache (every connection of the process shares
// them). A sync applies the file's held-back changes to the file; it does not
// call fsync(2), because the simulated cut is the only one the files must
// survive. PowerCut() then drops every held-back change, removes the files
// that were created and never synced, and kills every file opened so far:
// each further call on them fails (SQLITE_IOERR_*), so closing their
// connections writes nothing. Revive(), once every such connection is closed,
// deletes the -shm files of the databases that were open (their WAL index
// described writes that are gone; the next open rebuilds it from the WAL, as
// after a real power cut) and lets files be opened again. Held-back changes
// die with the process, so Action::kKill in power-loss mode is a machine
// crash: only what was synced is on disk (and the next process to open the
// database rebuilds the WAL index: SQLite resets a -shm no live process holds).
// Limits of the model: one process per file (another process would not see
// the held-back writes, nor they its); a write is lost or kept whole, never
// torn; deleting a file is durable at once.
//
// Part of the test kit (idem::testing) of a build with IDEM_WITH_KILL_POINTS.
//
// From outside a process: set IDEM_FAULT_VFS to a spec (see Parse), e.g.
// IDEM_FAULT_VFS="powerloss,kill:sync:5"; the first Install() applies it.
//
// Thread safety: every method may be called from any thread. Operations of
// the VFS are serialised by one mutex (it is a test tool).
#ifndef IDEM_TESTING_FAULT_VFS_H_
#define IDEM_TESTING_FAULT_VFS_H_

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "idem/result.h"
#include "idem/status.h"

namespace idem::sqlite {

class FaultVfs {
 public:
  // The name to give Options::vfs or "?vfs=" once Install() registered it.
  static constexpr const char* kName = "idem-fault";
  // The environment variable the first Install() reads.
  static constexpr const char* kEnvVar = "IDEM_FAULT_VFS";

  // The operations counted and failed. kAnyWrite matches the write path: a
  // write, a sync or a truncate (not a read).
  enum class Op { kRead, kWrite, kSync, kTruncate, kAnyWrite };
  // Which files a fault matches.
  enum class FileKind { kAny, kDb, kWal, kJournal };
  enum class Action {
    kIoError,   // the operation fails: SQLITE_IOERR_READ/_WRITE/_FSYNC/_TRUNCATE
    kFull,      // the operation fails: SQLITE_FULL (disk full)
    kKill,      // the process sends itself SIGKILL instead of doing it
    kPowerCut,  // PowerCut(); the operation fails like every later one
  };
  struct Fault {
    Action action = Action::kIoError;
    Op op = Op::kAnyWrite;
    FileKind file = FileKind::kAny;
    // The matching operation that fires, counted from 1 after Arm().
    int64_t at = 1;
    // kIoError and kFull: also fail every later matching operation, until
    // Disarm(). Otherwise only the at-th fails.
    bool persistent = false;
  };
  struct Config {
    bool power_loss = false;
    std::optional<Fault> fault{};  // none: nothing fails
  };
  struct Counters {
    // Operations seen on database, WAL and journal files.
    int64_t reads = 0, writes = 0, syncs = 0, truncates = 0;
    int64_t faults = 0;  // operations failed on purpose (kIoError, kFull)
    int64_t power_cuts = 0;
    int64_t dropped_writes = 0;  // held-back writes (and truncates) that power cuts discarded
  };

  // Registers the VFS (once per process; later calls return the same
  // controller) and, on that first call, applies IDEM_FAULT_VFS when it is
  // set. Errors: kInvalidArgument (a malformed IDEM_FAULT_VFS: the VFS is
  // registered but nothing is armed), kInternal (SQLite refused).
  static Result<FaultVfs*> Install();

  // Parses a spec: items separated by ','. Empty: nothing. Items:
  //   powerloss                                power-loss mode
  //   fail:<op>:<n>[:transient|:persistent]    kIoError at the n-th <op>
  //   full:<op>:<n>[:transient|:persistent]    kFull at the n-th <op>
  //   kill:<op>:<n>                            kKill at the n-th <op>
  //   cut:<op>:<n>                             kPowerCut at the n-th <op>
  // <op> is read, write, sync, truncate or any (kAnyWrite), optionally
  // followed by @db, @wal or @journal. n >= 1. At most one fault item.
  // Default persistence: transient. kInvalidArgument names what is wrong.
  // E.g. "fail:write:37:transient", "powerloss,kill:sync@wal:5".
  static Result<Config> Parse(std::string_view spec);
  // The spec Parse reads back as `config`.
  static std::string Format(const Config& config);

  // Sets power-loss mode and arms (or disarms) the fault.
  Status Configure(const Config& config);
  // Configures from IDEM_FAULT_VFS; returns whether it was set.
  Result<bool> ConfigureFromEnv();

  // Arms `fault` (replacing any other); its count starts at 0.
  void Arm(const Fault& fault);
  void Disarm();

  // Leaving power-loss mode writes what is held back to the files (as the OS
  // would, in time); kIoError if that fails.
  Status SetPowerLoss(bool on);
  bool power_loss() const;

  // Simulates a power cut (see above). Also what Action::kPowerCut does.
  void PowerCut();
  // Ends the dead state. kBusy while files opened before the cut are still
  // open (close their connections first: they would read stale caches).
  Status Revive();
  // Between PowerCut() and Revive().
  bool dead() const;

  Counters counters() const;
  void ResetCounters();

  // Back to a plain pass-through: Disarm(), Revive() if dead, power-loss
  // mode off, counters zero. Errors as Revive() and SetPowerLoss().
  Status Reset();

  FaultVfs(const FaultVfs&) = delete;
  FaultVfs& operator=(const FaultVfs&) = delete;

 private:
  FaultVfs() = default;
};

}  // namespace idem::sqlite

#endif  // IDEM_TESTING_FAULT_VFS_H_
