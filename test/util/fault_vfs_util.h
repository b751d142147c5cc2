// Copyright idem authors. SPDX-License-Identifier: Apache-2.0
//
// Test helpers for the SQLite fault VFS (idem/testing/fault_vfs.h).
#ifndef IDEM_TEST_UTIL_FAULT_VFS_UTIL_H_
#define IDEM_TEST_UTIL_FAULT_VFS_UTIL_H_

#include <gtest/gtest.h>

#include <cstdlib>
#include <memory>
#include <string>

#include "idem/sqlite/store.h"
#include "idem/testing/fault_vfs.h"

namespace idem::testing {

// The process's fault VFS, installed on first use (aborts if it cannot be).
inline sqlite::FaultVfs& Vfs() {
  auto vfs = sqlite::FaultVfs::Install();
  if (!vfs.ok()) {
    ADD_FAILURE() << vfs.status();
    std::abort();
  }
  return **vfs;
}

// A store on `path` opened through the fault VFS (?vfs=idem-fault); null
// (with a test failure) if it cannot be.
inline std::unique_ptr<Store> OpenThroughFaultVfs(const std::string& path) {
  (void)Vfs();  // registered with SQLite before the store names it
  auto o = sqlite::Store::ParseUrl("sqlite:" + path + "?vfs=" + sqlite::FaultVfs::kName);
  if (!o.ok()) {
    ADD_FAILURE() << o.status();
    return nullptr;
  }
  auto store = sqlite::Store::Open(*o);
  if (!store.ok()) {
    ADD_FAILURE() << store.status();
    return nullptr;
  }
  return std::move(*store);
}

// PRAGMA integrity_check's answer ("ok" when the file is sound), or the error.
inline std::string IntegrityCheck(Store& store) {
  auto tx = store.Begin();
  if (!tx.ok()) return tx.status().ToString();
  auto rows = (*tx)->Query("PRAGMA integrity_check");
  if (!rows.ok()) return rows.status().ToString();
  std::string out;
  for (auto& r : rows->rows) out += r[0].AsText();
  return out;
}

}  // namespace idem::testing

#endif  // IDEM_TEST_UTIL_FAULT_VFS_UTIL_H_
