// AtomicFile (atomic_file.h) and the test hooks of checkpoint_testing.h, which count and fail
// its file-system operations.
#include "core/src/io/atomic_file.h"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>

#include <atomic>
#include <cerrno>
#include <cstring>

#include "core/src/io/checkpoint_testing.h"
#include "core/src/io/file_checks.h"
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

// Removes ".BASE.tmp.PID.N" files in `dir` left by saves whose process is gone (killed mid-save):
// only names of exactly that form, only when kill(PID, 0) says there is no such process, so a
// concurrent saver's temporary file is never touched.
void remove_stale_temps(const std::string& dir, const std::string& base) {
  DIR* d = ::opendir(dir.c_str());
  if (d == nullptr) return;  // the save itself reports an unusable folder
  const std::string prefix = "." + base + ".tmp.";
  while (const dirent* e = ::readdir(d)) {
    const std::string name = e->d_name;
    if (name.compare(0, prefix.size(), prefix) != 0) continue;
    const std::string rest = name.substr(prefix.size());  // PID.N
    const size_t dot = rest.find('.');
    if (dot == std::string::npos || dot == 0 || dot > 9 || dot + 1 == rest.size() ||
        rest.find_first_not_of("0123456789.") != std::string::npos || rest.find('.', dot + 1) != std::string::npos) {
      continue;
    }
    const pid_t pid = static_cast<pid_t>(std::stol(rest.substr(0, dot)));
    if (pid <= 0 || pid == ::getpid()) continue;
    if (::kill(pid, 0) == 0 || errno != ESRCH) continue;  // alive (or not ours to judge)
    struct stat st {};
    const std::string full = dir + "/" + name;
    if (::lstat(full.c_str(), &st) == 0 && S_ISREG(st.st_mode)) ::unlink(full.c_str());
  }
  ::closedir(d);
}
}  // namespace

AtomicFile::AtomicFile(const std::string& path, const std::string& what) : path_(path), what_(what) {
  g_operations = 0;
  g_rename_operation = 0;
  const size_t slash = path.find_last_of('/');
  dir_ = slash == std::string::npos ? "." : (slash == 0 ? "/" : path.substr(0, slash));
  const std::string base = slash == std::string::npos ? path : path.substr(slash + 1);
  if (base.empty()) throw_io("cannot save " + what_ + " '" + path + "': the path names a folder, not a file");
  // Only a regular file is ever replaced: a device node, FIFO, folder or a symlink to one stays.
  // A symlink to a regular file keeps pointing at the new file (the rename goes to its target).
  struct stat st {};
  if (::lstat(path.c_str(), &st) == 0) {
    if (S_ISLNK(st.st_mode)) {
      char* real = ::realpath(path.c_str(), nullptr);
      if (real == nullptr || ::stat(real, &st) != 0) {
        std::free(real);
        throw_io("cannot save " + what_ + " " + io::printable(path) + ": a symbolic link that leads nowhere");
      }
      path_ = real;
      std::free(real);
      const size_t s2 = path_.find_last_of('/');
      dir_ = s2 == 0 ? "/" : path_.substr(0, s2);
    }
    if (!S_ISREG(st.st_mode)) {
      throw_io("cannot save " + what_ + " " + io::printable(path) + ": it is " + io::file_type_text(st.st_mode) +
                    "; only a regular file is ever replaced");
    }
  }
  const size_t final_slash = path_.find_last_of('/');
  const std::string final_base = final_slash == std::string::npos ? path_ : path_.substr(final_slash + 1);
  remove_stale_temps(dir_, final_base);
  static std::atomic<unsigned> counter{0};
  for (int attempt = 0;; ++attempt) {
    // The dot keeps a leftover of a killed save out of plain listings; the pid and a counter
    // keep concurrent savers from colliding.
    const std::string candidate = (final_slash == std::string::npos ? std::string() : dir_ + "/") + "." + final_base +
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
