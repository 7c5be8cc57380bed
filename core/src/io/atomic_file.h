// AtomicFile: writes a file so that its final name only ever carries complete content. The bytes
// go to a temporary file in the destination folder; commit() fsyncs it, renames it over the
// final name and fsyncs the folder. Any failure before the rename removes the temporary file and
// leaves an older file under the final name untouched. Shared by the checkpoint writer
// (Task::save) and the safetensors writer. Internal to the library.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace renaissance {

class AtomicFile {
 public:
  // `what` names the kind of file in error messages ("checkpoint", "safetensors file").
  AtomicFile(const std::string& path, const std::string& what);
  ~AtomicFile();
  AtomicFile(const AtomicFile&) = delete;
  AtomicFile& operator=(const AtomicFile&) = delete;

  void append(const void* p, size_t n);
  // Makes the file durable under its final name. Throws Error(kIo) naming the path and the
  // failing step; before the rename the temporary file is removed first.
  void commit();

 private:
  void flush();
  void write_all(const uint8_t* p, size_t n);
  void discard();
  [[noreturn]] void fail(const std::string& step);
  [[noreturn]] void fail_after_rename(const std::string& step);

  std::string path_, what_, dir_, temp_;
  int fd_ = -1;
  std::vector<uint8_t> buffer_;
};

}  // namespace renaissance
