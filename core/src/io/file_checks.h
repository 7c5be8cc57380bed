// The rules every file the library reads or writes goes through: inputs are regular
// files only (a FIFO would block open() forever, /dev/zero never ends, a folder is not data),
// opened without blocking and bounded in size before a byte is read; outputs never replace
// anything but a regular file. Internal to the library and the CLI.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <string>

namespace renaissance {
namespace io {

// The largest JSON input (layout, case.json) read into memory: far above the largest real one
// (gpt2_small's layout is ~20 KB), far below what hurts a machine.
constexpr uint64_t kMaxJsonBytes = uint64_t{64} << 20;

// "a FIFO", "a character device", "a folder", ... for messages.
std::string file_type_text(mode_t mode);

// Opens `path` for reading; throws Error(kIo) naming `what`, the path and what it is when it is
// not a regular file (without blocking on a FIFO). Returns the descriptor; *size gets the size.
int open_regular_file(const std::string& path, const std::string& what, uint64_t* size);

// The whole of a regular file of at most max_bytes (checked before reading).
std::string read_regular_file(const std::string& path, const std::string& what, uint64_t max_bytes);

// Device and inode of what `path` names after resolving symlinks; false when it does not exist.
struct FileId {
  uint64_t dev = 0, ino = 0;
  bool operator==(const FileId& o) const { return dev == o.dev && ino == o.ino; }
};
bool file_id(const std::string& path, FileId* id);

// The up-front check of an output path (before any work): not empty, its folder exists and is
// writable, and whatever is there now is a regular file (or a symlink to one). Throws
// Error(kInvalidArgument) naming `option` ("--checkpoint") and the path.
void check_output_path(const std::string& path, const std::string& option);

// Control characters (and DEL) as \xNN, so that a name echoed to a terminal cannot drive it.
std::string printable(const std::string& s);

}  // namespace io
}  // namespace renaissance
