// AtomicFile (atomic_file.h) and the test hooks of checkpoint_testing.h, which count and fail
// its file-system operations.
#include "core/src/io/atomic_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>

#include "core/src/io/checkpoint_testing.h"
#include "renaissance/error.h"

namespace renaissance {

namespace {
std::atomic<int> g_fault_at{0};
std::atomic<int> g_fault_errno{0};
std::atomic<int> g_operations{0};
std::atomic<int> g_rename_operation{0};

// Counts one file-system operation of a save; true (with errno set) when a test asked for this
// one to fail.
bool injected_fault() {
  const int n = ++g_operations;
  const int at = g_fault_at.load();
  if (at != 0 && n == at) {
    errno = g_fault_errno.load();
    return true;
  }
  return false;
}
}  // namespace

namespace checkpoint_testing {
void inject_fault(int n, int err) {
  g_fault_errno = err;
  g_fault_at = n;
}
int last_save_operations() { return g_operations.load(); }
int last_save_rename_operation() { return g_rename_operation.load(); }
}  // namespace checkpoint_testing

namespace {
constexpr size_t kBufferBytes = size_t{1} << 20;
}  // namespace

AtomicFile::AtomicFile(const std::string& path, const std::string& what) : path_(path), what_(what) {
  g_operations = 0;
  g_rename_operation = 0;
  const size_t slash = path.find_last_of('/');
  dir_ = slash == std::string::npos ? "." : (slash == 0 ? "/" : path.substr(0, slash));
  const std::string base = slash == std::string::npos ? path : path.substr(slash + 1);
  if (base.empty()) throw_io("cannot save " + what_ + " '" + path + "': the path names a folder, not a file");
  static std::atomic<unsigned> counter{0};
  for (int attempt = 0;; ++attempt) {
    // The dot keeps a leftover of a killed save out of plain listings; the pid and a counter
    // keep concurrent savers from colliding.
    const std::string candidate = (slash == std::string::npos ? std::string() : dir_ + "/") + "." + base +
                                  ".tmp." + std::to_string(::getpid()) + "." + std::to_string(counter++);
    // temp_ is only set once the file is ours, so a failure here never removes a stranger's file.
    if (injected_fault()) fail("cannot create the temporary file " + candidate);
    fd_ = ::open(candidate.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
    if (fd_ >= 0) {
      temp_ = candidate;
      break;
    }
    if (errno != EEXIST || attempt >= 100) fail("cannot create the temporary file " + candidate);
  }
  buffer_.reserve(kBufferBytes);
}

AtomicFile::~AtomicFile() { discard(); }

void AtomicFile::append(const void* p, size_t n) {
  const auto* b = static_cast<const uint8_t*>(p);
  if (buffer_.size() + n > kBufferBytes) flush();
  if (n >= kBufferBytes) {
    write_all(b, n);
  } else {
    buffer_.insert(buffer_.end(), b, b + n);
  }
}

void AtomicFile::commit() {
  flush();
  if (injected_fault() || ::fsync(fd_) != 0) fail("fsync of " + temp_ + " failed");
  const int fd = fd_;
  fd_ = -1;
  if (injected_fault() || ::close(fd) != 0) fail("close of " + temp_ + " failed");
  g_rename_operation = g_operations + 1;
  if (injected_fault() || ::rename(temp_.c_str(), path_.c_str()) != 0) {
    fail("cannot rename " + temp_ + " to the final name");
  }
  temp_.clear();  // it is the final file now: nothing to remove on a later error
  // Without this fsync a crash could lose the rename (the old file would reappear).
  if (injected_fault()) fail_after_rename("cannot open the folder " + dir_ + " to fsync it");
  const int dfd = ::open(dir_.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd < 0) fail_after_rename("cannot open the folder " + dir_ + " to fsync it");
  if (injected_fault() || ::fsync(dfd) != 0) {
    const int err = errno;
    ::close(dfd);
    errno = err;
    fail_after_rename("fsync of the folder " + dir_ + " failed");
  }
  ::close(dfd);
}

void AtomicFile::flush() {
  write_all(buffer_.data(), buffer_.size());
  buffer_.clear();
}

void AtomicFile::write_all(const uint8_t* p, size_t n) {
  while (n > 0) {
    if (injected_fault()) fail("write to " + temp_ + " failed");
    const ssize_t w = ::write(fd_, p, n);
    if (w < 0) {
      if (errno == EINTR) continue;
      fail("write to " + temp_ + " failed");
    }
    p += w;
    n -= static_cast<size_t>(w);
  }
}

void AtomicFile::discard() {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
  if (!temp_.empty()) ::unlink(temp_.c_str());
  temp_.clear();
}

void AtomicFile::fail(const std::string& step) {
  const int err = errno;
  discard();
  throw_io("cannot save " + what_ + " " + path_ + ": " + step + ": " + std::strerror(err) + " (the previous " +
           what_ + ", if any, is unchanged)");
}

void AtomicFile::fail_after_rename(const std::string& step) {
  const int err = errno;
  throw_io(what_ + " " + path_ + " was written and renamed into place, but " + step + ": " + std::strerror(err) +
           " (a crash now may bring back the previous " + what_ + ")");
}

}  // namespace renaissance
