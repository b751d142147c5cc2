// Copyright idem authors. SPDX-License-Identifier: Apache-2.0
#include "chaos/workdir.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>

#include "idem/embedded/queue.h"

namespace idem::cli::chaos {

Result<std::vector<std::filesystem::path>> ListDir(const std::string& dir) {
  std::vector<std::filesystem::path> out;
  std::error_code ec;
  for (std::filesystem::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec))
    out.push_back(it->path());
  if (ec) return Status::Unavailable("cannot list " + dir + ": " + ec.message());
  return out;
}

Status RemoveFile(const std::string& path) {
  std::error_code ec;
  std::filesystem::remove(path, ec);
  if (ec) return Status::Unavailable("cannot remove " + path + ": " + ec.message());
  return Status::OK();
}

Status MakeRunDir(std::string& dir) {
  if (dir.empty()) {
    std::error_code ec;
    std::filesystem::path tmp = std::filesystem::temp_directory_path(ec);
    if (ec) tmp = "/tmp";
    std::string tmpl = (tmp / "idem-chaos-XXXXXX").string();
    if (::mkdtemp(tmpl.data()) == nullptr) return Status::Unavailable("cannot create a temporary directory");
    dir = tmpl;
    return Status::OK();
  }
  struct stat st {};
  if (::stat(dir.c_str(), &st) == 0 && !S_ISDIR(st.st_mode))
    return Status::InvalidArgument("--dir " + dir + " is not a directory");
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) return Status::Unavailable("cannot create " + dir + ": " + ec.message());
  return Status::OK();
}

Status PrepareWorkDir(const std::string& dir) {
  std::error_code ec;
  // A run deletes its own files from the work directory before it starts:
  // only from one it made (it leaves a mark), never a user's provider.db.
  const std::string mark = dir + "/.idem-chaos";
  if (!std::filesystem::exists(mark, ec)) {
    for (const char* name : {"oracle.log", "provider.db", "provider.log", "journal"})
      if (std::filesystem::exists(dir + "/" + name, ec))
        return Status::InvalidArgument("--dir " + dir + " holds " + name +
                                       ", which idem chaos did not make: give a new or empty directory");
  }
  for (const char* sub : {"/journal", "/journal2", "/relay", "/clock", "/fault"}) {
    std::filesystem::create_directories(dir + sub, ec);
    if (ec) return Status::Unavailable("cannot create " + dir + sub + ": " + ec.message());
  }
  if (FILE* f = std::fopen(mark.c_str(), "w")) {
    std::fputs("a work directory of idem chaos: a later run may delete its files\n", f);
    std::fclose(f);
  } else {
    return Status::Unavailable("cannot write " + mark + ": " + std::strerror(errno));
  }
  for (const char* sub : {"/journal", "/journal2", "/relay", "/clock", "/fault"}) {
    IDEM_ASSIGN_OR_RETURN(auto files, ListDir(dir + sub));
    for (const auto& p : files) IDEM_RETURN_IF_ERROR(RemoveFile(p.string()));
  }
  for (const char* name : {"oracle.log", "provider.db", "provider.db-wal", "provider.db-shm", "provider.log"})
    IDEM_RETURN_IF_ERROR(RemoveFile(dir + "/" + name));
  return Status::OK();
}

Status ResetEmbeddedQueue(const std::string& url) {
  IDEM_ASSIGN_OR_RETURN(embedded::Queue::Options o, embedded::Queue::ParseUrl(url));
  const std::string& path = o.path;
  auto refuse = [&](const std::string& why) {
    return Status::InvalidArgument("--source: will not delete " + path + ": " + why +
                                   " (chaos starts from an empty queue: give it an embedded queue file to reset, or a "
                                   "path where nothing is)");
  };
  auto size_of = [](const std::string& p) -> int64_t {  // -1: absent
    struct stat st {};
    return ::stat(p.c_str(), &st) == 0 ? static_cast<int64_t>(st.st_size) : -1;
  };
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) {
    if (errno != ENOENT) return refuse(std::string("cannot examine it: ") + std::strerror(errno));
    // Nothing there. A -wal or -shm without its database is not ours to judge.
    for (const char* suffix : {"-wal", "-shm"})
      if (size_of(path + suffix) >= 0) return refuse("it does not exist, but " + path + suffix + " does");
    return Status::OK();
  }
  if (S_ISDIR(st.st_mode)) return refuse("it is a directory, not an embedded queue file");
  if (!S_ISREG(st.st_mode)) return refuse("it is not a regular file");
  if (st.st_size == 0) return refuse("it is an empty file, not an embedded queue file");
  // A queue file is a SQLite database in WAL mode (opening anything else as a
  // queue could change it: the journal mode, or a queue schema created in
  // an empty database).
  unsigned char header[100] = {};
  {
    std::ifstream in(path, std::ios::binary);
    in.read(reinterpret_cast<char*>(header), sizeof header);
    if (!in || std::memcmp(header, "SQLite format 3\0", 16) != 0)
      return refuse("it is not an embedded queue file (not a SQLite database)");
  }
  if (header[18] != 2 || header[19] != 2)
    return refuse("it is not an embedded queue file (a SQLite database not in WAL mode)");
  const int64_t page = header[16] == 0 && header[17] == 1 ? 65'536 : header[16] * 256 + header[17];
  // One page and no WAL: the schema page alone, no table at all.
  if (st.st_size <= page && size_of(path + "-wal") <= 0)
    return refuse("it is an empty SQLite database, not an embedded queue file");
  {
    auto q = embedded::Queue::Open(o);
    if (!q.ok()) {
      if (q.status().code() == Code::kSchemaMismatch || q.status().code() == Code::kCorruption)
        return refuse(q.status().message());
      return q.status().WithContext("checking --source " + path);
    }
  }
  for (const char* suffix : {"", "-wal", "-shm"}) IDEM_RETURN_IF_ERROR(RemoveFile(path + suffix));
  return Status::OK();
}

}  // namespace idem::cli::chaos
