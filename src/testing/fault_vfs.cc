// Copyright idem authors. SPDX-License-Identifier: Apache-2.0
//
// The fault VFS: a shim over the default VFS in the manner of SQLite's own
// src/test_vfs.c. Each open file is our File followed by the real VFS's file
// in the same allocation; every method decides (under one mutex) whether the
// call fails, kills, cuts the power or is held back, and forwards otherwise.
#include "idem/testing/fault_vfs.h"

#include <signal.h>
#include <sqlite3.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <new>
#include <set>
#include <string>
#include <vector>

#include "sqlite_driver/db.h"

namespace idem::sqlite {
namespace {

using Op = FaultVfs::Op;
using FileKind = FaultVfs::FileKind;
using Action = FaultVfs::Action;

// Held-back changes are kept in blocks of this size, filled from the file on
// first touch, so a write costs its own size and a WAL append never copies
// what was appended before.
constexpr int64_t kBlock = 4096;

// The state of one path, shared by every handle open on it: held-back changes
// belong to the file, not to a handle (a connection reads what another wrote,
// and a sync through any handle makes the file durable, as with the OS).
struct Node {
  explicit Node(std::string p, FileKind k) : path(std::move(p)), kind(k) {}
  std::string path;
  FileKind kind;
  int handles = 0;
  // Power-loss mode: true once something is held back.
  bool held = false;
  int64_t size = 0;                       // the file's size as the process sees it
  int64_t base_limit = 0;                 // bytes of the real file still visible (truncates lower it)
  std::map<int64_t, std::string> blocks;  // block number -> kBlock bytes
  int64_t held_writes = 0;
  // Created through the VFS in power-loss mode and not yet synced: a power cut
  // removes it (SQLite syncs a new WAL's directory at its first sync).
  bool created_unsynced = false;
};

struct File {
  sqlite3_file base;  // first: SQLite sees a File as a sqlite3_file
  sqlite3_file* real = nullptr;
  bool tracked = false;  // a database, WAL or journal file (else: forwarded only)
  FileKind kind = FileKind::kAny;
  uint64_t generation = 0;  // the power cuts before it was opened
  std::shared_ptr<Node> node;
};
constexpr size_t kFileOffset = (sizeof(File) + 15) & ~size_t{15};

struct State {
  std::mutex mu;
  sqlite3_vfs* real = nullptr;
  sqlite3_vfs vfs{};
  bool power_loss = false;
  bool dead = false;
  uint64_t generation = 0;
  int64_t live_current = 0;  // open handles opened since the last cut
  int64_t live_old = 0;      // open handles opened before it
  std::optional<FaultVfs::Fault> fault;
  int64_t matched = 0;
  FaultVfs::Counters counters;
  std::map<std::string, std::shared_ptr<Node>> nodes;
  std::set<std::string> cut_databases;  // their -shm goes at Revive()
};

State* g_state = nullptr;
FaultVfs* g_instance = nullptr;

State& S() { return *g_state; }
File* AsFile(sqlite3_file* f) { return reinterpret_cast<File*>(f); }
const sqlite3_io_methods* RealMethods(File* f) { return f->real->pMethods; }

int IoErrFor(Op op) {
  switch (op) {
    case Op::kRead: return SQLITE_IOERR_READ;
    case Op::kWrite: return SQLITE_IOERR_WRITE;
    case Op::kSync: return SQLITE_IOERR_FSYNC;
    case Op::kTruncate: return SQLITE_IOERR_TRUNCATE;
    case Op::kAnyWrite: break;
  }
  return SQLITE_IOERR;
}

bool IsDead(const State& s, const File* f) { return s.dead || f->generation != s.generation; }

void PowerCutLocked(State& s) {
  for (auto& [path, node] : s.nodes) {
    if (node->held) {
      s.counters.dropped_writes += node->held_writes;
      node->blocks.clear();
      node->held = false;
      node->held_writes = 0;
    }
    if (node->created_unsynced) {
      (void)s.real->xDelete(s.real, path.c_str(), 0);
      node->created_unsynced = false;
    }
    if (node->kind == FileKind::kDb) s.cut_databases.insert(path);
  }
  // Handles open now keep their nodes, but are dead for good: files opened
  // after Revive() get fresh ones.
  s.nodes.clear();
  s.dead = true;
  ++s.generation;
  s.live_old += s.live_current;
  s.live_current = 0;
  ++s.counters.power_cuts;
}

// Counts `op` on `f` and decides its fate: SQLITE_OK to go on, or the code it
// fails with. May not return (kKill). Called with s.mu held.
int Gate(State& s, File* f, Op op) {
  if (IsDead(s, f)) return IoErrFor(op);
  if (!f->tracked) return SQLITE_OK;
  switch (op) {
    case Op::kRead: ++s.counters.reads; break;
    case Op::kWrite: ++s.counters.writes; break;
    case Op::kSync: ++s.counters.syncs; break;
    case Op::kTruncate: ++s.counters.truncates; break;
    case Op::kAnyWrite: break;
  }
  if (!s.fault.has_value()) return SQLITE_OK;
  const FaultVfs::Fault& fault = *s.fault;
  const bool op_matches = fault.op == op || (fault.op == Op::kAnyWrite && op != Op::kRead);
  if (!op_matches || (fault.file != FileKind::kAny && fault.file != f->kind)) return SQLITE_OK;
  const int64_t n = ++s.matched;
  if (n < fault.at) return SQLITE_OK;
  switch (fault.action) {
    case Action::kIoError:
    case Action::kFull:
      if (n > fault.at && !fault.persistent) return SQLITE_OK;
      ++s.counters.faults;
      return fault.action == Action::kFull ? SQLITE_FULL : IoErrFor(op);
    case Action::kKill:
      if (n > fault.at) return SQLITE_OK;
      ::kill(::getpid(), SIGKILL);
      for (;;) ::pause();  // SIGKILL cannot be blocked; never go on
    case Action::kPowerCut:
      if (n > fault.at) return SQLITE_OK;
      PowerCutLocked(s);
      return IoErrFor(op);
  }
  return SQLITE_OK;
}

// --- held-back changes (power-loss mode); all with s.mu held ----------------

int Hold(Node& n, sqlite3_file* real) {
  if (n.held) return SQLITE_OK;
  sqlite3_int64 size = 0;
  int rc = real->pMethods->xFileSize(real, &size);
  if (rc != SQLITE_OK) return rc;
  n.held = true;
  n.size = n.base_limit = size;
  return SQLITE_OK;
}

// The block, filled from the real file where that is still visible.
Result<std::string*> Block(Node& n, sqlite3_file* real, int64_t b) {
  auto it = n.blocks.find(b);
  if (it != n.blocks.end()) return &it->second;
  std::string data(kBlock, '\0');
  const int64_t start = b * kBlock;
  const int64_t end = std::min(start + kBlock, n.base_limit);
  if (end > start) {
    int rc = real->pMethods->xRead(real, data.data(), static_cast<int>(end - start), start);
    if (rc != SQLITE_OK && rc != SQLITE_IOERR_SHORT_READ)
      return Status::IoError("read for held-back block: sqlite code " + std::to_string(rc));
  }
  return &n.blocks.emplace(b, std::move(data)).first->second;
}

int HeldWrite(Node& n, sqlite3_file* real, const void* buf, int amount, int64_t offset) {
  if (int rc = Hold(n, real); rc != SQLITE_OK) return rc;
  const char* in = static_cast<const char*>(buf);
  for (int64_t pos = offset, end = offset + amount; pos < end;) {
    const int64_t b = pos / kBlock;
    const int64_t stop = std::min(end, (b + 1) * kBlock);
    auto block = Block(n, real, b);
    if (!block.ok()) return SQLITE_IOERR_WRITE;
    std::memcpy((*block)->data() + (pos - b * kBlock), in + (pos - offset), stop - pos);
    pos = stop;
  }
  n.size = std::max(n.size, offset + amount);
  ++n.held_writes;
  return SQLITE_OK;
}

int HeldRead(Node& n, sqlite3_file* real, void* buf, int amount, int64_t offset) {
  char* out = static_cast<char*>(buf);
  std::memset(out, 0, amount);
  const int64_t end = std::min<int64_t>(offset + amount, n.size);
  for (int64_t pos = offset; pos < end;) {
    const int64_t b = pos / kBlock;
    const int64_t stop = std::min(end, (b + 1) * kBlock);
    if (auto it = n.blocks.find(b); it != n.blocks.end()) {
      std::memcpy(out + (pos - offset), it->second.data() + (pos - b * kBlock), stop - pos);
    } else if (pos < n.base_limit) {
      const int64_t base_stop = std::min(stop, n.base_limit);
      int rc = real->pMethods->xRead(real, out + (pos - offset), static_cast<int>(base_stop - pos), pos);
      if (rc != SQLITE_OK && rc != SQLITE_IOERR_SHORT_READ) return rc;
    }
    pos = stop;
  }
  // As the unix VFS: what lies past the end reads as zeros, and says so.
  return offset + amount > n.size ? SQLITE_IOERR_SHORT_READ : SQLITE_OK;
}

int HeldTruncate(Node& n, sqlite3_file* real, int64_t size) {
  if (int rc = Hold(n, real); rc != SQLITE_OK) return rc;
  n.base_limit = std::min(n.base_limit, size);
  n.blocks.erase(n.blocks.lower_bound((size + kBlock - 1) / kBlock), n.blocks.end());
  // The block the new end falls in: zeros after it, so that growing the file
  // again reads zeros there, as after ftruncate(2).
  if (size % kBlock != 0)
    if (auto it = n.blocks.find(size / kBlock); it != n.blocks.end())
      std::memset(it->second.data() + size % kBlock, 0, kBlock - size % kBlock);
  n.size = size;
  ++n.held_writes;
  return SQLITE_OK;
}

// Writes the held-back changes to the real file: truncate first (bytes past a
// truncation must not come back), then the blocks, then the final size.
int Apply(Node& n, sqlite3_file* real) {
  if (!n.held) return SQLITE_OK;
  const sqlite3_io_methods* m = real->pMethods;
  sqlite3_int64 real_size = 0;
  int rc = m->xFileSize(real, &real_size);
  if (rc == SQLITE_OK && n.base_limit < real_size) rc = m->xTruncate(real, n.base_limit);
  for (auto& [b, data] : n.blocks) {
    if (rc != SQLITE_OK) break;
    const int64_t start = b * kBlock;
    if (start >= n.size) continue;
    rc = m->xWrite(real, data.data(), static_cast<int>(std::min(kBlock, n.size - start)), start);
  }
  if (rc == SQLITE_OK) rc = m->xFileSize(real, &real_size);
  if (rc == SQLITE_OK && real_size != n.size) rc = m->xTruncate(real, n.size);
  if (rc != SQLITE_OK) return rc;
  n.blocks.clear();
  n.held = false;
  n.held_writes = 0;
  return SQLITE_OK;
}

// Applies a node's changes when none of its handles may be at hand (leaving
// power-loss mode), through a handle of the real VFS: opening and closing a
// file descriptor of our own would drop the process's POSIX locks on it.
int ApplyWithoutHandle(State& s, Node& n) {
  if (!n.held) return SQLITE_OK;
  int kind_flag = n.kind == FileKind::kWal       ? SQLITE_OPEN_WAL
                  : n.kind == FileKind::kJournal ? SQLITE_OPEN_MAIN_JOURNAL
                                                 : SQLITE_OPEN_MAIN_DB;
  std::unique_ptr<char[]> mem(new char[s.real->szOsFile]());
  auto* real = reinterpret_cast<sqlite3_file*>(mem.get());
  // Extra NULs after the name: a VFS may look for URI parameters there.
  std::string name = n.path + std::string(3, '\0');
  int rc = s.real->xOpen(s.real, name.c_str(), real, SQLITE_OPEN_READWRITE | kind_flag, nullptr);
  if (rc == SQLITE_OK) rc = Apply(n, real);
  if (real->pMethods != nullptr) (void)real->pMethods->xClose(real);
  return rc;
}

// --- io methods ---------------------------------------------------------------

int Close(sqlite3_file* pf) {
  File* f = AsFile(pf);
  State& s = S();
  int rc = SQLITE_OK;
  {
    std::lock_guard<std::mutex> l(s.mu);
    if (f->generation == s.generation) {
      --s.live_current;
    } else {
      --s.live_old;
    }
    if (f->node != nullptr) {
      Node& n = *f->node;
      // Closing does not sync: held-back changes outlive the handle (the OS
      // keeps dirty pages of a closed file too), until a sync or a cut.
      if (--n.handles == 0 && !n.held && !n.created_unsynced) {
        auto it = s.nodes.find(n.path);
        if (it != s.nodes.end() && it->second == f->node) s.nodes.erase(it);
      }
    }
    // A dead handle is closed too (it writes nothing: the unix VFS's close
    // only releases locks and the descriptor).
    rc = RealMethods(f)->xClose(f->real);
  }
  f->~File();
  return rc;
}

int Read(sqlite3_file* pf, void* buf, int amount, sqlite3_int64 offset) {
  File* f = AsFile(pf);
  State& s = S();
  std::unique_lock<std::mutex> l(s.mu);
  if (int rc = Gate(s, f, Op::kRead); rc != SQLITE_OK) return rc;
  if (f->node != nullptr && f->node->held) return HeldRead(*f->node, f->real, buf, amount, offset);
  if (!s.power_loss) l.unlock();
  return RealMethods(f)->xRead(f->real, buf, amount, offset);
}

int Write(sqlite3_file* pf, const void* buf, int amount, sqlite3_int64 offset) {
  File* f = AsFile(pf);
  State& s = S();
  std::unique_lock<std::mutex> l(s.mu);
  if (int rc = Gate(s, f, Op::kWrite); rc != SQLITE_OK) return rc;
  if (f->node != nullptr && (s.power_loss || f->node->held)) return HeldWrite(*f->node, f->real, buf, amount, offset);
  l.unlock();
  return RealMethods(f)->xWrite(f->real, buf, amount, offset);
}

int Truncate(sqlite3_file* pf, sqlite3_int64 size) {
  File* f = AsFile(pf);
  State& s = S();
  std::unique_lock<std::mutex> l(s.mu);
  if (int rc = Gate(s, f, Op::kTruncate); rc != SQLITE_OK) return rc;
  if (f->node != nullptr && (s.power_loss || f->node->held)) return HeldTruncate(*f->node, f->real, size);
  l.unlock();
  return RealMethods(f)->xTruncate(f->real, size);
}

int Sync(sqlite3_file* pf, int flags) {
  File* f = AsFile(pf);
  State& s = S();
  std::unique_lock<std::mutex> l(s.mu);
  if (int rc = Gate(s, f, Op::kSync); rc != SQLITE_OK) return rc;
  if (f->node != nullptr && (s.power_loss || f->node->held)) {
    // Applied, not fsync'ed: see the header.
    int rc = Apply(*f->node, f->real);
    if (rc == SQLITE_OK) f->node->created_unsynced = false;
    return rc;
  }
  l.unlock();
  return RealMethods(f)->xSync(f->real, flags);
}

int FileSize(sqlite3_file* pf, sqlite3_int64* size) {
  File* f = AsFile(pf);
  State& s = S();
  std::unique_lock<std::mutex> l(s.mu);
  if (IsDead(s, f)) return SQLITE_IOERR_FSTAT;
  if (f->node != nullptr && f->node->held) {
    *size = f->node->size;
    return SQLITE_OK;
  }
  if (!s.power_loss) l.unlock();
  return RealMethods(f)->xFileSize(f->real, size);
}

// Locks: forwarded, except that a dead file takes none. Unlocking is always
// forwarded (it writes nothing, and releases the process's locks).
int Lock(sqlite3_file* pf, int level) {
  File* f = AsFile(pf);
  {
    std::lock_guard<std::mutex> l(S().mu);
    if (IsDead(S(), f)) return SQLITE_IOERR_LOCK;
  }
  return RealMethods(f)->xLock(f->real, level);
}

int Unlock(sqlite3_file* pf, int level) {
  File* f = AsFile(pf);
  return RealMethods(f)->xUnlock(f->real, level);
}

int CheckReservedLock(sqlite3_file* pf, int* out) {
  File* f = AsFile(pf);
  {
    std::lock_guard<std::mutex> l(S().mu);
    if (IsDead(S(), f)) return SQLITE_IOERR_CHECKRESERVEDLOCK;
  }
  return RealMethods(f)->xCheckReservedLock(f->real, out);
}

int FileControl(sqlite3_file* pf, int op, void* arg) {
  File* f = AsFile(pf);
  {
    std::lock_guard<std::mutex> l(S().mu);
    if (IsDead(S(), f)) return SQLITE_IOERR;
    // A size hint may make the unix VFS grow the real file (with a chunk
    // size set): not while its size is held back. Hints may be ignored.
    if (op == SQLITE_FCNTL_SIZE_HINT && f->node != nullptr && (S().power_loss || f->node->held)) return SQLITE_OK;
  }
  int rc = RealMethods(f)->xFileControl(f->real, op, arg);
  if (op == SQLITE_FCNTL_VFSNAME && rc == SQLITE_OK) {
    char* inner = *static_cast<char**>(arg);
    *static_cast<char**>(arg) =
        inner ? sqlite3_mprintf("%s/%z", FaultVfs::kName, inner) : sqlite3_mprintf("%s", FaultVfs::kName);
  }
  return rc;
}

int SectorSize(sqlite3_file* pf) { return RealMethods(AsFile(pf))->xSectorSize(AsFile(pf)->real); }

int DeviceCharacteristics(sqlite3_file* pf) {
  // No claim of atomic, appending or ordered writes: held-back changes do
  // not model them, so SQLite must not lean on them.
  constexpr int kUnmodelled = SQLITE_IOCAP_ATOMIC | SQLITE_IOCAP_ATOMIC512 | SQLITE_IOCAP_ATOMIC1K |
                              SQLITE_IOCAP_ATOMIC2K | SQLITE_IOCAP_ATOMIC4K | SQLITE_IOCAP_ATOMIC8K |
                              SQLITE_IOCAP_ATOMIC16K | SQLITE_IOCAP_ATOMIC32K | SQLITE_IOCAP_ATOMIC64K |
                              SQLITE_IOCAP_SAFE_APPEND | SQLITE_IOCAP_SEQUENTIAL | SQLITE_IOCAP_BATCH_ATOMIC;
  return RealMethods(AsFile(pf))->xDeviceCharacteristics(AsFile(pf)->real) & ~kUnmodelled;
}

// The WAL index (-shm) is shared memory of the real VFS, untouched: after a
// power cut Revive() deletes it and the next open rebuilds it from the WAL.
int ShmMap(sqlite3_file* pf, int region, int size, int extend, void volatile** out) {
  File* f = AsFile(pf);
  {
    std::lock_guard<std::mutex> l(S().mu);
    if (IsDead(S(), f)) return SQLITE_IOERR_SHMMAP;
  }
  return RealMethods(f)->xShmMap(f->real, region, size, extend, out);
}

int ShmLock(sqlite3_file* pf, int offset, int n, int flags) {
  File* f = AsFile(pf);
  if ((flags & SQLITE_SHM_UNLOCK) == 0) {
    std::lock_guard<std::mutex> l(S().mu);
    if (IsDead(S(), f)) return SQLITE_IOERR_SHMLOCK;
  }
  return RealMethods(f)->xShmLock(f->real, offset, n, flags);
}

void ShmBarrier(sqlite3_file* pf) { RealMethods(AsFile(pf))->xShmBarrier(AsFile(pf)->real); }

int ShmUnmap(sqlite3_file* pf, int delete_flag) {
  File* f = AsFile(pf);
  {
    // Always forwarded, so the real VFS lets go of the mapping; a dead file
    // deletes nothing.
    std::lock_guard<std::mutex> l(S().mu);
    if (IsDead(S(), f)) delete_flag = 0;
  }
  return RealMethods(f)->xShmUnmap(f->real, delete_flag);
}

// Version 2: no xFetch, so SQLite never reads a memory map of the real file
// past the held-back changes.
const sqlite3_io_methods kMethods = {
    .iVersion = 2,
    .xClose = Close,
    .xRead = Read,
    .xWrite = Write,
    .xTruncate = Truncate,
    .xSync = Sync,
    .xFileSize = FileSize,
    .xLock = Lock,
    .xUnlock = Unlock,
    .xCheckReservedLock = CheckReservedLock,
    .xFileControl = FileControl,
    .xSectorSize = SectorSize,
    .xDeviceCharacteristics = DeviceCharacteristics,
    .xShmMap = ShmMap,
    .xShmLock = ShmLock,
    .xShmBarrier = ShmBarrier,
    .xShmUnmap = ShmUnmap,
};

// --- vfs methods -------------------------------------------------------------

FileKind KindOf(int flags) {
  if (flags & SQLITE_OPEN_MAIN_DB) return FileKind::kDb;
  if (flags & SQLITE_OPEN_WAL) return FileKind::kWal;
  if (flags & SQLITE_OPEN_MAIN_JOURNAL) return FileKind::kJournal;
  return FileKind::kAny;  // temporary files: forwarded only
}

int Open(sqlite3_vfs*, const char* name, sqlite3_file* pf, int flags, int* out_flags) {
  State& s = S();
  pf->pMethods = nullptr;
  File* f = new (pf) File{};
  f->real = reinterpret_cast<sqlite3_file*>(reinterpret_cast<char*>(pf) + kFileOffset);
  f->kind = KindOf(flags);
  f->tracked = name != nullptr && f->kind != FileKind::kAny;
  std::lock_guard<std::mutex> l(s.mu);
  if (s.dead) {
    f->~File();
    return SQLITE_IOERR;
  }
  f->generation = s.generation;
  // (Not xAccess: the unix VFS says a file of 0 bytes does not exist.)
  const bool creates = f->tracked && s.power_loss && (flags & SQLITE_OPEN_CREATE) != 0 && ::access(name, F_OK) != 0;
  int rc = s.real->xOpen(s.real, name, f->real, flags, out_flags);
  if (rc != SQLITE_OK) {
    f->~File();
    return rc;
  }
  if (f->tracked) {
    auto& node = s.nodes[name];
    if (node == nullptr) node = std::make_shared<Node>(name, f->kind);
    if (creates) node->created_unsynced = true;
    ++node->handles;
    f->node = node;
  }
  ++s.live_current;
  pf->pMethods = &kMethods;
  return SQLITE_OK;
}

int Delete(sqlite3_vfs*, const char* name, int sync_dir) {
  State& s = S();
  std::lock_guard<std::mutex> l(s.mu);
  if (s.dead) return SQLITE_IOERR_DELETE;
  // Durable at once (a simplification, see the header). Handles still open
  // on the file keep its node: their writes go to the unlinked file.
  s.nodes.erase(name);
  return s.real->xDelete(s.real, name, sync_dir);
}

int Access(sqlite3_vfs*, const char* name, int what, int* out) {
  State& s = S();
  std::lock_guard<std::mutex> l(s.mu);
  if (s.dead) return SQLITE_IOERR_ACCESS;
  if (what == SQLITE_ACCESS_EXISTS) {
    // As unixAccess(), by the size the process sees: SQLite asks whether a
    // WAL or journal exists this way.
    auto it = s.nodes.find(name);
    if (it != s.nodes.end() && it->second->held) {
      *out = it->second->size > 0;
      return SQLITE_OK;
    }
  }
  return s.real->xAccess(s.real, name, what, out);
}

int FullPathname(sqlite3_vfs*, const char* name, int n, char* out) {
  return S().real->xFullPathname(S().real, name, n, out);
}
void* DlOpen(sqlite3_vfs*, const char* name) { return S().real->xDlOpen(S().real, name); }
void DlError(sqlite3_vfs*, int n, char* out) { S().real->xDlError(S().real, n, out); }
void (*DlSym(sqlite3_vfs*, void* h, const char* sym))(void) { return S().real->xDlSym(S().real, h, sym); }
void DlClose(sqlite3_vfs*, void* h) { S().real->xDlClose(S().real, h); }
int Randomness(sqlite3_vfs*, int n, char* out) { return S().real->xRandomness(S().real, n, out); }
int Sleep(sqlite3_vfs*, int us) { return S().real->xSleep(S().real, us); }
int CurrentTime(sqlite3_vfs*, double* out) { return S().real->xCurrentTime(S().real, out); }
int GetLastError(sqlite3_vfs*, int n, char* out) { return S().real->xGetLastError(S().real, n, out); }
int CurrentTimeInt64(sqlite3_vfs*, sqlite3_int64* out) { return S().real->xCurrentTimeInt64(S().real, out); }

// --- the spec ------------------------------------------------------------------

std::string_view OpName(Op op) {
  switch (op) {
    case Op::kRead: return "read";
    case Op::kWrite: return "write";
    case Op::kSync: return "sync";
    case Op::kTruncate: return "truncate";
    case Op::kAnyWrite: return "any";
  }
  return "?";
}

std::string_view FileName(FileKind k) {
  switch (k) {
    case FileKind::kAny: return "";
    case FileKind::kDb: return "db";
    case FileKind::kWal: return "wal";
    case FileKind::kJournal: return "journal";
  }
  return "?";
}

std::string_view ActionName(Action a) {
  switch (a) {
    case Action::kIoError: return "fail";
    case Action::kFull: return "full";
    case Action::kKill: return "kill";
    case Action::kPowerCut: return "cut";
  }
  return "?";
}

std::vector<std::string_view> Split(std::string_view s, char sep) {
  std::vector<std::string_view> out;
  for (;;) {
    auto i = s.find(sep);
    out.push_back(s.substr(0, i));
    if (i == std::string_view::npos) return out;
    s.remove_prefix(i + 1);
  }
}

std::string_view Trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

constexpr const char* kGrammar =
    "expected items separated by ',': powerloss | fail:<op>:<n>[:transient|:persistent] | "
    "full:<op>:<n>[:transient|:persistent] | kill:<op>:<n> | cut:<op>:<n>, where <op> is "
    "read|write|sync|truncate|any, optionally @db|@wal|@journal, and n >= 1";

Status Malformed(std::string_view spec, std::string_view item, std::string_view why) {
  return Status::InvalidArgument("fault VFS spec '" + std::string(spec) + "': item '" + std::string(item) +
                                 "': " + std::string(why) + " (" + kGrammar + ")");
}

}  // namespace

Result<FaultVfs::Config> FaultVfs::Parse(std::string_view spec) {
  Config config;
  if (Trim(spec).empty()) return config;
  for (std::string_view raw : Split(spec, ',')) {
    std::string_view item = Trim(raw);
    if (item.empty()) return Malformed(spec, item, "empty item");
    if (item == "powerloss") {
      config.power_loss = true;
      continue;
    }
    std::vector<std::string_view> parts = Split(item, ':');
    Fault fault;
    if (parts[0] == "fail")
      fault.action = Action::kIoError;
    else if (parts[0] == "full")
      fault.action = Action::kFull;
    else if (parts[0] == "kill")
      fault.action = Action::kKill;
    else if (parts[0] == "cut")
      fault.action = Action::kPowerCut;
    else
      return Malformed(spec, item, "unknown action '" + std::string(parts[0]) + "'");
    const bool has_persistence = fault.action == Action::kIoError || fault.action == Action::kFull;
    if (parts.size() < 3 || parts.size() > (has_persistence ? 4u : 3u))
      return Malformed(spec, item, "wrong number of ':' fields");
    std::string_view op = parts[1], file;
    if (auto at = op.find('@'); at != std::string_view::npos) {
      file = op.substr(at + 1);
      op = op.substr(0, at);
      if (file == "db")
        fault.file = FileKind::kDb;
      else if (file == "wal")
        fault.file = FileKind::kWal;
      else if (file == "journal")
        fault.file = FileKind::kJournal;
      else
        return Malformed(spec, item, "unknown file kind '" + std::string(file) + "'");
    }
    if (op == "read")
      fault.op = Op::kRead;
    else if (op == "write")
      fault.op = Op::kWrite;
    else if (op == "sync")
      fault.op = Op::kSync;
    else if (op == "truncate")
      fault.op = Op::kTruncate;
    else if (op == "any")
      fault.op = Op::kAnyWrite;
    else
      return Malformed(spec, item, "unknown operation '" + std::string(op) + "'");
    std::string n(parts[2]);
    char* end = nullptr;
    errno = 0;
    long long at = n.empty() || n[0] == '-' || n[0] == '+' ? 0 : std::strtoll(n.c_str(), &end, 10);
    if (at < 1 || errno != 0 || end == nullptr || *end != '\0')
      return Malformed(spec, item, "the operation number must be a whole number >= 1, not '" + n + "'");
    fault.at = at;
    if (parts.size() == 4) {
      if (parts[3] == "persistent")
        fault.persistent = true;
      else if (parts[3] != "transient")
        return Malformed(spec, item, "expected transient or persistent, not '" + std::string(parts[3]) + "'");
    }
    if (config.fault.has_value()) return Malformed(spec, item, "only one fault at a time");
    config.fault = fault;
  }
  return config;
}

std::string FaultVfs::Format(const Config& config) {
  std::string out = config.power_loss ? "powerloss" : "";
  if (config.fault.has_value()) {
    const Fault& f = *config.fault;
    if (!out.empty()) out += ',';
    out += ActionName(f.action);
    out += ':';
    out += OpName(f.op);
    if (f.file != FileKind::kAny) {
      out += '@';
      out += FileName(f.file);
    }
    out += ':';
    out += std::to_string(f.at);
    if (f.action == Action::kIoError || f.action == Action::kFull) out += f.persistent ? ":persistent" : ":transient";
  }
  return out;
}

Result<FaultVfs*> FaultVfs::Install() {
  static std::once_flag once;
  static Status installed;
  std::call_once(once, [] {
    sqlite_driver::ConfigureSqliteOnce();
    sqlite3_vfs* real = sqlite3_vfs_find(nullptr);
    if (real == nullptr) {
      installed = Status::Internal("fault VFS: SQLite has no default VFS to wrap");
      return;
    }
    auto* s = new State;  // lives as long as the process, like the registration
    s->real = real;
    sqlite3_vfs& v = s->vfs;
    v.iVersion = std::min(real->iVersion, 2);
    v.szOsFile = static_cast<int>(kFileOffset) + real->szOsFile;
    v.mxPathname = real->mxPathname;
    v.zName = kName;
    v.xOpen = Open;
    v.xDelete = Delete;
    v.xAccess = Access;
    v.xFullPathname = FullPathname;
    v.xDlOpen = DlOpen;
    v.xDlError = DlError;
    v.xDlSym = DlSym;
    v.xDlClose = DlClose;
    v.xRandomness = Randomness;
    v.xSleep = Sleep;
    v.xCurrentTime = CurrentTime;
    v.xGetLastError = GetLastError;
    if (v.iVersion >= 2) v.xCurrentTimeInt64 = CurrentTimeInt64;
    g_state = s;
    int rc = sqlite3_vfs_register(&s->vfs, /*makeDflt=*/0);
    if (rc != SQLITE_OK) {
      installed = Status::Internal("fault VFS: sqlite3_vfs_register: " + std::string(sqlite3_errstr(rc)));
      return;
    }
    g_instance = new FaultVfs;
    auto env = g_instance->ConfigureFromEnv();
    if (!env.ok()) installed = env.status();
  });
  if (g_instance == nullptr) return installed;
  if (!installed.ok()) return installed;
  return g_instance;
}

Status FaultVfs::Configure(const Config& config) {
  IDEM_RETURN_IF_ERROR(SetPowerLoss(config.power_loss));
  if (config.fault.has_value()) {
    Arm(*config.fault);
  } else {
    Disarm();
  }
  return Status::OK();
}

Result<bool> FaultVfs::ConfigureFromEnv() {
  const char* spec = std::getenv(kEnvVar);
  if (spec == nullptr) return false;
  auto config = Parse(spec);
  if (!config.ok()) return config.status().WithContext(kEnvVar);
  IDEM_RETURN_IF_ERROR(Configure(*config));
  return true;
}

void FaultVfs::Arm(const Fault& fault) {
  std::lock_guard<std::mutex> l(S().mu);
  S().fault = fault;
  S().matched = 0;
}

void FaultVfs::Disarm() {
  std::lock_guard<std::mutex> l(S().mu);
  S().fault.reset();
  S().matched = 0;
}

Status FaultVfs::SetPowerLoss(bool on) {
  State& s = S();
  std::lock_guard<std::mutex> l(s.mu);
  if (on || !s.power_loss) {
    s.power_loss = on;
    return Status::OK();
  }
  for (auto it = s.nodes.begin(); it != s.nodes.end();) {
    Node& n = *it->second;
    if (int rc = ApplyWithoutHandle(s, n); rc != SQLITE_OK)
      return Status::IoError("fault VFS: writing held-back changes to " + n.path + ": " + sqlite3_errstr(rc));
    n.created_unsynced = false;
    it = n.handles == 0 ? s.nodes.erase(it) : std::next(it);
  }
  s.power_loss = false;
  return Status::OK();
}

bool FaultVfs::power_loss() const {
  std::lock_guard<std::mutex> l(S().mu);
  return S().power_loss;
}

void FaultVfs::PowerCut() {
  std::lock_guard<std::mutex> l(S().mu);
  PowerCutLocked(S());
}

Status FaultVfs::Revive() {
  State& s = S();
  std::lock_guard<std::mutex> l(s.mu);
  if (!s.dead) return Status::OK();
  if (s.live_old > 0)
    return Status::Busy("fault VFS: " + std::to_string(s.live_old) +
                        " files opened before the power cut are still open; close their connections first");
  for (const std::string& db : s.cut_databases) {
    const std::string shm = db + "-shm";
    int rc = s.real->xDelete(s.real, shm.c_str(), 0);
    if (rc != SQLITE_OK && rc != SQLITE_IOERR_DELETE_NOENT)
      return Status::IoError("fault VFS: deleting " + shm + ": " + sqlite3_errstr(rc));
  }
  s.cut_databases.clear();
  s.dead = false;
  return Status::OK();
}

bool FaultVfs::dead() const {
  std::lock_guard<std::mutex> l(S().mu);
  return S().dead;
}

FaultVfs::Counters FaultVfs::counters() const {
  std::lock_guard<std::mutex> l(S().mu);
  return S().counters;
}

void FaultVfs::ResetCounters() {
  std::lock_guard<std::mutex> l(S().mu);
  S().counters = {};
}

Status FaultVfs::Reset() {
  Disarm();
  IDEM_RETURN_IF_ERROR(Revive());
  IDEM_RETURN_IF_ERROR(SetPowerLoss(false));
  ResetCounters();
  return Status::OK();
}

}  // namespace idem::sqlite
