// Helpers shared by the fuzz targets: the readers under test take a path, so each input is put
// in an in-memory file (memfd) and handed over as /proc/self/fd/N, which costs no disk I/O and
// leaves nothing behind when a run is killed.
#pragma once

#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "renaissance/error.h"

namespace renaissance_fuzz {

// parse(text) over the input read as text, its result in *out; false where parse refuses the
// text with an Error, the documented outcome for malformed input.
template <typename T, typename Parse>
bool parsed_text(const uint8_t* data, size_t size, Parse parse, T* out) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  try {
    *out = parse(text);
  } catch (const renaissance::Error&) {
    return false;
  }
  return true;
}

class MemFile {
 public:
  MemFile() {
    fd_ = ::memfd_create("renaissance-fuzz", MFD_CLOEXEC);
    if (fd_ < 0) {
      std::perror("memfd_create");
      std::abort();
    }
    path_ = "/proc/self/fd/" + std::to_string(fd_);
  }
  // Replaces the file's contents with `data`.
  void set(const uint8_t* data, size_t size) {
    if (::ftruncate(fd_, 0) != 0) std::abort();
    size_t done = 0;
    while (done < size) {
      const ssize_t w = ::pwrite(fd_, data + done, size - done, static_cast<off_t>(done));
      if (w <= 0) std::abort();
      done += static_cast<size_t>(w);
    }
  }
  const std::string& path() const { return path_; }

 private:
  int fd_ = -1;
  std::string path_;
};

// A failed property check: print why and abort, which libFuzzer reports as a crash with the input.
[[noreturn]] inline void property_failed(const char* what) {
  std::fprintf(stderr, "fuzz property violated: %s\n", what);
  std::abort();
}

}  // namespace renaissance_fuzz
