// The input/output file rules of file_checks.h.
#include "core/src/io/file_checks.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

#include "renaissance/error.h"

namespace renaissance {
namespace io {

std::string file_type_text(mode_t mode) {
  if (S_ISREG(mode)) return "a regular file";
  if (S_ISDIR(mode)) return "a folder";
  if (S_ISFIFO(mode)) return "a FIFO";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISSOCK(mode)) return "a socket";
  if (S_ISLNK(mode)) return "a symbolic link";
  return "not a regular file";
}

int open_regular_file(const std::string& path, const std::string& what, uint64_t* size) {
  // O_NONBLOCK: opening a FIFO for reading would otherwise wait for a writer forever.
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
  if (fd < 0) throw_io(what + " " + printable(path) + ": cannot open: " + std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    const int err = errno;
    ::close(fd);
    throw_io(what + " " + printable(path) + ": cannot stat: " + std::strerror(err));
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    throw_io(what + " " + printable(path) + " is " + file_type_text(st.st_mode) + ", not a regular file");
  }
  const int flags = ::fcntl(fd, F_GETFL);
  if (flags >= 0) ::fcntl(fd, F_SETFL, flags & ~O_NONBLOCK);
  if (size != nullptr) *size = static_cast<uint64_t>(st.st_size);
  return fd;
}

std::string read_regular_file(const std::string& path, const std::string& what, uint64_t max_bytes) {
  uint64_t size = 0;
  const int fd = open_regular_file(path, what, &size);
  if (size > max_bytes) {
    ::close(fd);
    throw_io(what + " " + printable(path) + ": " + std::to_string(size) + " bytes, more than the " +
             std::to_string(max_bytes) + " a " + what + " may have");
  }
  std::string text(static_cast<size_t>(size), '\0');
  size_t got = 0;
  while (got < text.size()) {
    const ssize_t r = ::read(fd, &text[got], text.size() - got);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) {
      const int err = errno;
      ::close(fd);
      throw_io(what + " " + printable(path) + ": cannot read: " + std::strerror(err));
    }
    if (r == 0) break;  // shrank under us: parse what is there
    got += static_cast<size_t>(r);
  }
  ::close(fd);
  text.resize(got);
  return text;
}

bool file_id(const std::string& path, FileId* id) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return false;
  id->dev = static_cast<uint64_t>(st.st_dev);
  id->ino = static_cast<uint64_t>(st.st_ino);
  return true;
}

void check_output_path(const std::string& path, const std::string& option) {
  if (path.empty()) throw_invalid(option + " \"\": the path is empty");
  const std::string shown = option + " " + printable(path);
  struct stat st {};
  if (::lstat(path.c_str(), &st) == 0) {
    if (S_ISLNK(st.st_mode) && ::stat(path.c_str(), &st) != 0) {
      throw_invalid(shown + ": a symbolic link to nothing (dangling or looping); give the real path");
    }
    if (!S_ISREG(st.st_mode)) {
      throw_invalid(shown + " is " + file_type_text(st.st_mode) + "; only a regular file is ever replaced");
    }
  }
  const size_t slash = path.find_last_of('/');
  if (slash != std::string::npos && slash + 1 == path.size()) throw_invalid(shown + ": names a folder, not a file");
  const std::string dir = slash == std::string::npos ? "." : (slash == 0 ? "/" : path.substr(0, slash));
  if (::stat(dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
    throw_invalid(shown + ": folder '" + printable(dir) + "' does not exist");
  }
  // access() answers for permissions only (root passes everywhere, a read-only mount is not a
  // permission): creating and removing a probe file is the real test.
  const std::string probe = dir + "/.renaissance-write-check." + std::to_string(::getpid());
  const int fd = ::open(probe.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd < 0 && errno != EEXIST) {
    throw_invalid(shown + ": folder '" + printable(dir) + "' is not writable (" + std::strerror(errno) + ")");
  }
  if (fd >= 0) {
    ::close(fd);
    ::unlink(probe.c_str());
  }
}

std::string printable(const std::string& s) {
  std::string out;
  out.reserve(s.size());
  for (unsigned char c : s) {
    if (c < 0x20 || c == 0x7f) {
      char buf[5];
      std::snprintf(buf, sizeof(buf), "\\x%02x", c);
      out += buf;
    } else {
      out += static_cast<char>(c);
    }
  }
  return out;
}

}  // namespace io
}  // namespace renaissance
