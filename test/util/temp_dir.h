// Copyright idem authors. SPDX-License-Identifier: Apache-2.0
//
// TempDir, without gtest: for the tests (test_util.h) and the fuzz targets.
#ifndef IDEM_TEST_UTIL_TEMP_DIR_H_
#define IDEM_TEST_UTIL_TEMP_DIR_H_

#include <stdlib.h>

#include <filesystem>
#include <stdexcept>
#include <string>
#include <system_error>

namespace idem::testing {

// A fresh directory under $TMPDIR, removed with everything in it.
class TempDir {
 public:
  TempDir() {
    std::string tmpl = (std::filesystem::temp_directory_path() / "idem-test-XXXXXX").string();
    char* p = ::mkdtemp(tmpl.data());
    if (p == nullptr) throw std::runtime_error("mkdtemp failed");
    path_ = p;
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::string& path() const { return path_; }
  std::string File(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

}  // namespace idem::testing

#endif  // IDEM_TEST_UTIL_TEMP_DIR_H_
