// Copyright idem authors. SPDX-License-Identifier: Apache-2.0
#include "sqlite_driver/batched_wal.h"

#include <sqlite3.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <new>
#include <string>

namespace idem::sqlite_driver {
namespace {

// Gathered bytes go to the file in writes of at most this size: SQLite's
// unix VFS takes a write's length modulo 128 KiB (it never writes more at
// once), so a larger write would be cut short and reported SQLITE_FULL.
constexpr size_t kMaxWrite = size_t{64} * 1024;
// A commit larger than this is written out as it goes.
constexpr size_t kMaxGathered = 1 << 20;

struct ShimFile {
  sqlite3_file base;  // first: SQLite sees a ShimFile as a sqlite3_file
  sqlite3_file* real = nullptr;
  bool wal = false;
  // A gathered write that failed where no error could be returned (a
  // barrier): every later call on the file fails with it.
  int sticky = SQLITE_OK;
  std::string gathered;  // consecutive bytes from offset `start`
  sqlite3_int64 start = 0;
};

// Bytes after the ShimFile, suitably aligned, where the real file lives.
constexpr size_t kRealOffset = (sizeof(ShimFile) + 15) & ~size_t{15};

thread_local bool tl_on = false;
thread_local ShimFile* tl_pending = nullptr;  // the WAL file holding gathered bytes on this thread
std::atomic<uint64_t> g_in{0}, g_out{0};

sqlite3_vfs* Base(sqlite3_vfs* shim) { return static_cast<sqlite3_vfs*>(shim->pAppData); }
ShimFile* Shim(sqlite3_file* f) { return reinterpret_cast<ShimFile*>(f); }
sqlite3_file* Real(sqlite3_file* f) { return Shim(f)->real; }

int Flush(ShimFile* f) {
  if (tl_pending == f) tl_pending = nullptr;
  int rc = SQLITE_OK;
  for (size_t at = 0; at < f->gathered.size() && rc == SQLITE_OK; at += kMaxWrite) {
    const size_t n = std::min(kMaxWrite, f->gathered.size() - at);
    g_out.fetch_add(1, std::memory_order_relaxed);
    rc = f->real->pMethods->xWrite(f->real, f->gathered.data() + at, static_cast<int>(n),
                                   f->start + static_cast<sqlite3_int64>(at));
  }
  f->gathered.clear();
  return rc;
}
// Before an operation on `f` itself.
int Settle(sqlite3_file* file) {
  ShimFile* f = Shim(file);
  if (f->sticky != SQLITE_OK) return f->sticky;
  return Flush(f);
}
// Before the connection touches the wal-index (through its database file):
// the WAL bytes gathered on this thread go to the file first.
int SettleThread() { return tl_pending != nullptr ? Flush(tl_pending) : SQLITE_OK; }

int Close(sqlite3_file* file) {
  ShimFile* f = Shim(file);
  const int flushed = Flush(f);
  const int closed = f->real->pMethods->xClose(f->real);
  f->~ShimFile();
  return flushed != SQLITE_OK ? flushed : closed;
}
int Read(sqlite3_file* file, void* out, int n, sqlite3_int64 at) {
  if (int rc = Settle(file); rc != SQLITE_OK) return rc;
  return Real(file)->pMethods->xRead(Real(file), out, n, at);
}
int Write(sqlite3_file* file, const void* in, int n, sqlite3_int64 at) {
  ShimFile* f = Shim(file);
  if (f->sticky != SQLITE_OK) return f->sticky;
  if (f->wal) g_in.fetch_add(1, std::memory_order_relaxed);
  if (!f->wal || !tl_on) {
    if (int rc = Flush(f); rc != SQLITE_OK) return rc;
    if (f->wal) g_out.fetch_add(1, std::memory_order_relaxed);
    return f->real->pMethods->xWrite(f->real, in, n, at);
  }
  if (tl_pending != nullptr && tl_pending != f) {
    if (int rc = Flush(tl_pending); rc != SQLITE_OK) return rc;
  }
  if (!f->gathered.empty() && at != f->start + static_cast<sqlite3_int64>(f->gathered.size())) {
    if (int rc = Flush(f); rc != SQLITE_OK) return rc;
  }
  if (f->gathered.empty()) f->start = at;
  f->gathered.append(static_cast<const char*>(in), static_cast<size_t>(n));
  tl_pending = f;
  return f->gathered.size() >= kMaxGathered ? Flush(f) : SQLITE_OK;
}
int Truncate(sqlite3_file* file, sqlite3_int64 size) {
  if (int rc = Settle(file); rc != SQLITE_OK) return rc;
  return Real(file)->pMethods->xTruncate(Real(file), size);
}
int Sync(sqlite3_file* file, int flags) {
  if (int rc = Settle(file); rc != SQLITE_OK) return rc;
  if (int rc = SettleThread(); rc != SQLITE_OK) return rc;
  return Real(file)->pMethods->xSync(Real(file), flags);
}
int FileSize(sqlite3_file* file, sqlite3_int64* size) {
  if (int rc = Settle(file); rc != SQLITE_OK) return rc;
  return Real(file)->pMethods->xFileSize(Real(file), size);
}
int Lock(sqlite3_file* file, int level) {
  if (int rc = Settle(file); rc != SQLITE_OK) return rc;
  return Real(file)->pMethods->xLock(Real(file), level);
}
int Unlock(sqlite3_file* file, int level) {
  if (int rc = Settle(file); rc != SQLITE_OK) return rc;
  if (int rc = SettleThread(); rc != SQLITE_OK) return rc;
  return Real(file)->pMethods->xUnlock(Real(file), level);
}
int CheckReservedLock(sqlite3_file* file, int* out) {
  return Real(file)->pMethods->xCheckReservedLock(Real(file), out);
}
int FileControl(sqlite3_file* file, int op, void* arg) {
  if (int rc = Settle(file); rc != SQLITE_OK) return rc;
  return Real(file)->pMethods->xFileControl(Real(file), op, arg);
}
int SectorSize(sqlite3_file* file) { return Real(file)->pMethods->xSectorSize(Real(file)); }
int DeviceCharacteristics(sqlite3_file* file) { return Real(file)->pMethods->xDeviceCharacteristics(Real(file)); }
int ShmMap(sqlite3_file* file, int page, int size, int extend, void volatile** out) {
  if (int rc = SettleThread(); rc != SQLITE_OK) return rc;
  return Real(file)->pMethods->xShmMap(Real(file), page, size, extend, out);
}
int ShmLock(sqlite3_file* file, int offset, int n, int flags) {
  if (int rc = SettleThread(); rc != SQLITE_OK) return rc;
  return Real(file)->pMethods->xShmLock(Real(file), offset, n, flags);
}
void ShmBarrier(sqlite3_file* file) {
  // The wal-index header is about to change: the frames it will point to
  // must be in the file. A failure here cannot be returned, so the WAL file
  // fails every later call (and the commit never reaches a reader: SQLite
  // syncs, with FULL, before this; see the header).
  if (ShimFile* w = tl_pending; w != nullptr) {
    if (int rc = Flush(w); rc != SQLITE_OK) w->sticky = rc;
  }
  Real(file)->pMethods->xShmBarrier(Real(file));
}
int ShmUnmap(sqlite3_file* file, int remove) {
  if (int rc = SettleThread(); rc != SQLITE_OK) return rc;
  return Real(file)->pMethods->xShmUnmap(Real(file), remove);
}
int Fetch(sqlite3_file* file, sqlite3_int64 at, int n, void** out) {
  return Real(file)->pMethods->xFetch(Real(file), at, n, out);
}
int Unfetch(sqlite3_file* file, sqlite3_int64 at, void* p) { return Real(file)->pMethods->xUnfetch(Real(file), at, p); }

// One table per version of the real file's methods (shm from 2, fetch from 3).
const sqlite3_io_methods kMethods[] = {
    {1, Close, Read, Write, Truncate, Sync, FileSize, Lock, Unlock, CheckReservedLock, FileControl, SectorSize,
     DeviceCharacteristics, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr},
    {2, Close, Read, Write, Truncate, Sync, FileSize, Lock, Unlock, CheckReservedLock, FileControl, SectorSize,
     DeviceCharacteristics, ShmMap, ShmLock, ShmBarrier, ShmUnmap, nullptr, nullptr},
    {3, Close, Read, Write, Truncate, Sync, FileSize, Lock, Unlock, CheckReservedLock, FileControl, SectorSize,
     DeviceCharacteristics, ShmMap, ShmLock, ShmBarrier, ShmUnmap, Fetch, Unfetch},
};

int Open(sqlite3_vfs* vfs, sqlite3_filename name, sqlite3_file* file, int flags, int* out_flags) {
  sqlite3_vfs* base = Base(vfs);
  auto* f = new (file) ShimFile();
  f->base.pMethods = nullptr;
  f->real = reinterpret_cast<sqlite3_file*>(reinterpret_cast<char*>(file) + kRealOffset);
  std::memset(f->real, 0, static_cast<size_t>(base->szOsFile));
  f->wal = (flags & SQLITE_OPEN_WAL) != 0;
  const int rc = base->xOpen(base, name, f->real, flags, out_flags);
  if (rc != SQLITE_OK || f->real->pMethods == nullptr) {
    if (f->real->pMethods != nullptr) f->real->pMethods->xClose(f->real);
    f->~ShimFile();
    file->pMethods = nullptr;
    return rc != SQLITE_OK ? rc : SQLITE_CANTOPEN;
  }
  f->base.pMethods = &kMethods[std::clamp(f->real->pMethods->iVersion, 1, 3) - 1];
  return SQLITE_OK;
}
int Delete(sqlite3_vfs* v, const char* name, int sync) { return Base(v)->xDelete(Base(v), name, sync); }
int Access(sqlite3_vfs* v, const char* name, int flags, int* out) {
  return Base(v)->xAccess(Base(v), name, flags, out);
}
int FullPathname(sqlite3_vfs* v, const char* name, int n, char* out) {
  return Base(v)->xFullPathname(Base(v), name, n, out);
}
void* DlOpen(sqlite3_vfs* v, const char* name) { return Base(v)->xDlOpen(Base(v), name); }
void DlError(sqlite3_vfs* v, int n, char* out) { Base(v)->xDlError(Base(v), n, out); }
void (*DlSym(sqlite3_vfs* v, void* h, const char* sym))(void) { return Base(v)->xDlSym(Base(v), h, sym); }
void DlClose(sqlite3_vfs* v, void* h) { Base(v)->xDlClose(Base(v), h); }
int Randomness(sqlite3_vfs* v, int n, char* out) { return Base(v)->xRandomness(Base(v), n, out); }
int Sleep(sqlite3_vfs* v, int us) { return Base(v)->xSleep(Base(v), us); }
int CurrentTime(sqlite3_vfs* v, double* out) { return Base(v)->xCurrentTime(Base(v), out); }
int GetLastError(sqlite3_vfs* v, int n, char* out) { return Base(v)->xGetLastError(Base(v), n, out); }
int CurrentTimeInt64(sqlite3_vfs* v, sqlite3_int64* out) { return Base(v)->xCurrentTimeInt64(Base(v), out); }

struct Registered {
  std::string name;
  sqlite3_vfs vfs{};
};

}  // namespace

Result<std::string> BatchedWalVfs(const std::string& base_name) {
  static std::mutex mu;
  static std::map<std::string, std::unique_ptr<Registered>> shims;
  std::lock_guard lock(mu);
  auto it = shims.find(base_name);
  if (it != shims.end()) return it->second->name;
  sqlite3_vfs* base = sqlite3_vfs_find(base_name.empty() ? nullptr : base_name.c_str());
  if (base == nullptr)
    return Status::InvalidArgument("no SQLite VFS named '" + base_name + "' to batch WAL writes over");
  if (base->iVersion < 2 || base->xCurrentTimeInt64 == nullptr)
    return Status::InvalidArgument("SQLite VFS '" + base_name + "' is too old (version " +
                                   std::to_string(base->iVersion) + ") to batch WAL writes over");
  auto r = std::make_unique<Registered>();
  r->name = "idem-batched-wal" + (base_name.empty() ? std::string() : "+" + base_name);
  sqlite3_vfs& v = r->vfs;
  v.iVersion = 2;
  v.szOsFile = static_cast<int>(kRealOffset) + base->szOsFile;
  v.mxPathname = base->mxPathname;
  v.zName = r->name.c_str();
  v.pAppData = base;
  v.xOpen = Open;
  v.xDelete = Delete;
  v.xAccess = Access;
  v.xFullPathname = FullPathname;
  v.xDlOpen = base->xDlOpen != nullptr ? DlOpen : nullptr;
  v.xDlError = base->xDlError != nullptr ? DlError : nullptr;
  v.xDlSym = base->xDlSym != nullptr ? DlSym : nullptr;
  v.xDlClose = base->xDlClose != nullptr ? DlClose : nullptr;
  v.xRandomness = Randomness;
  v.xSleep = Sleep;
  v.xCurrentTime = CurrentTime;
  v.xGetLastError = GetLastError;
  v.xCurrentTimeInt64 = CurrentTimeInt64;
  if (int rc = sqlite3_vfs_register(&v, /*makeDflt=*/0); rc != SQLITE_OK)
    return Status::Internal("cannot register the SQLite VFS " + r->name + " (" + sqlite3_errstr(rc) + ")");
  std::string name = r->name;
  shims.emplace(base_name, std::move(r));
  return name;
}

BatchedWalWrites::BatchedWalWrites(bool on) : on_(on && !tl_on) {
  if (on_) tl_on = true;
}

BatchedWalWrites::~BatchedWalWrites() {
  if (!on_) return;
  tl_on = false;
  if (ShimFile* w = tl_pending; w != nullptr) {
    if (int rc = Flush(w); rc != SQLITE_OK) w->sticky = rc;
  }
}

BatchedWalStats BatchedWalCounts() {
  return {g_in.load(std::memory_order_relaxed), g_out.load(std::memory_order_relaxed)};
}

}  // namespace idem::sqlite_driver
