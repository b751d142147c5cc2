// Copyright idem authors. SPDX-License-Identifier: Apache-2.0
//
// Test helpers for the SQLite fault VFS (idem/sqlite/fault_vfs.h).
#ifndef IDEM_TEST_UTIL_FAULT_VFS_UTIL_H_
#define IDEM_TEST_UTIL_FAULT_VFS_UTIL_H_

#include <gtest/gtest.h>

#include <cstdlib>
#include <memory>
#include <string>

#include "idem/sqlite/fault_vfs.h"
#include "idem/sqlite/store.h"

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
  auto o = sqlite::ParseUrl("sqlite:" + path + "?vfs=" + sqlite::FaultVfs::kName);
  if (!o.ok()) {
    ADD_FAILURE() << o.status();
    return nullptr;
  }
  auto store = sqlite::Open(*o);
  if (!store.ok()) {
    ADD_FAILURE() << store.status();
    return nullptr;
  }
  return std::move(*store);
}

}  // namespace idem::testing

#endif  // IDEM_TEST_UTIL_FAULT_VFS_UTIL_H_
