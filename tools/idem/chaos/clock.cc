// Copyright idem authors. SPDX-License-Identifier: Apache-2.0
#include "chaos/clock.h"

#include <chrono>
#include <cstdio>
#include <fstream>
#include <system_error>
#include <utility>

namespace idem::cli::chaos {

ShiftedClock::ShiftedClock(std::string path, std::function<void(int64_t)> seen)
    : path_(std::move(path)), seen_(std::move(seen)) {}

Result<std::unique_ptr<ShiftedClock>> ShiftedClock::Start(std::string path, std::function<void(int64_t)> seen) {
  std::unique_ptr<ShiftedClock> c(new ShiftedClock(std::move(path), std::move(seen)));
  try {
    c->watcher_ = std::thread([p = c.get()] { p->Watch(); });
  } catch (const std::system_error& e) {
    return Status::Unavailable(std::string("cannot start the clock's thread: ") + e.what());
  }
  return c;
}

ShiftedClock::~ShiftedClock() {
  stop_ = true;
  if (watcher_.joinable()) watcher_.join();
}

void ShiftedClock::Watch() {
  while (!stop_) {
    std::ifstream in(path_);
    int64_t offset = 0;
    if (in >> offset && offset != offset_.load()) {
      offset_ = offset;
      if (seen_) seen_(offset);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
}

Status WriteClockOffset(const std::string& path, int64_t offset_ms) {
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::trunc);
    out << offset_ms << "\n";
    if (!out.flush()) return Status::Unavailable("cannot write " + tmp);
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) return Status::Unavailable("cannot rename " + tmp + " to " + path);
  return Status::OK();
}

}  // namespace idem::cli::chaos
