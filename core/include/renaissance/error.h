// Errors the library raises. One exception type with a category, so the CLI can map
// categories to exit codes and every message names the thing that is wrong.
#pragma once

#include <stdexcept>
#include <string>

namespace renaissance {

enum class ErrorKind {
  kInvalidArgument,  // a bad hyperparameter, option or API misuse
  kFormat,           // a malformed file or case description
  kIo,               // a file could not be read or written
  kBackend,          // a backend failure (CUDA call, allocation)
};

class Error : public std::runtime_error {
 public:
  Error(ErrorKind kind, const std::string& message) : std::runtime_error(message), kind_(kind) {}
  ErrorKind kind() const { return kind_; }

 private:
  ErrorKind kind_;
};

[[noreturn]] inline void throw_invalid(const std::string& message) {
  throw Error(ErrorKind::kInvalidArgument, message);
}
[[noreturn]] inline void throw_format(const std::string& message) {
  throw Error(ErrorKind::kFormat, message);
}
[[noreturn]] inline void throw_io(const std::string& message) { throw Error(ErrorKind::kIo, message); }

}  // namespace renaissance
