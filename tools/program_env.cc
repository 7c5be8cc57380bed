// The programs' environment variables (program_env.h), with the exact messages a malformed
// value gets.
#include "tools/program_env.h"

#include <cstdlib>
#include <cstring>
#include <string>

#include "renaissance/error.h"

namespace renaissance {
namespace program_env {

namespace {

const char* value_of(const Lookup& lookup, const char* name) {
  const char* text = lookup(name);
  return text == nullptr || *text == '\0' ? nullptr : text;
}

// A non-negative integer variable (unset: `fallback`); anything else throws.
uint64_t count_of(const Lookup& lookup, const char* name, uint64_t fallback) {
  const char* text = value_of(lookup, name);
  if (text == nullptr) return fallback;
  char* end = nullptr;
  const unsigned long long value = std::strtoull(text, &end, 10);
  if (*end != '\0' || text[0] == '-' || value > (uint64_t{1} << 40)) {
    throw Error(ErrorKind::kBackend, std::string(name) + "=" + text + ": expected a non-negative integer");
  }
  return value;
}

bool switch_of(const Lookup& lookup, const char* name, bool fallback) {
  const char* text = value_of(lookup, name);
  if (text == nullptr) return fallback;
  if (std::strcmp(text, "0") == 0) return false;
  if (std::strcmp(text, "1") == 0) return true;
  throw Error(ErrorKind::kBackend, std::string(name) + "=" + text + ": expected 0 or 1");
}

}  // namespace

CpuTuning cpu_tuning_from(const Lookup& lookup) {
  CpuTuning t;
  t.chunk_elements = count_of(lookup, "RENAISSANCE_CPU_CHUNK", t.chunk_elements);
  // The backend refuses these too (make_cpu_backend); here the message names the variable.
  if (!cpu_chunk_is_valid(t.chunk_elements)) {
    throw Error(ErrorKind::kBackend, "RENAISSANCE_CPU_CHUNK=" + std::to_string(t.chunk_elements) +
                                         ": expected a positive multiple of 64");
  }
  if (const char* s = value_of(lookup, "RENAISSANCE_CPU_SCHEDULE")) {
    if (!parse_cpu_schedule(s, &t.schedule)) {
      throw Error(ErrorKind::kBackend, std::string("RENAISSANCE_CPU_SCHEDULE=") + s + ": expected static or dynamic");
    }
  }
  t.prefetch_elements = count_of(lookup, "RENAISSANCE_CPU_PREFETCH", t.prefetch_elements);
  t.first_touch = switch_of(lookup, "RENAISSANCE_CPU_FIRST_TOUCH", t.first_touch);
  t.huge_pages = switch_of(lookup, "RENAISSANCE_CPU_HUGEPAGES", t.huge_pages);
  t.amx_tiles = switch_of(lookup, "RENAISSANCE_CPU_AMX", t.amx_tiles);
  // Retired switches: the backend has only the path each one's default chose.
  for (const char* name : {"RENAISSANCE_CPU_UNROLL", "RENAISSANCE_CPU_FUSE", "RENAISSANCE_CPU_STREAM_COPY"}) {
    if (const char* s = value_of(lookup, name)) {
      throw Error(ErrorKind::kBackend, std::string(name) + "=" + s + ": no longer a switch (unset it)");
    }
  }
  return t;
}

CpuTuning cpu_tuning_from_env() {
  return cpu_tuning_from([](const char* name) -> const char* { return std::getenv(name); });
}

CpuTuning cpu_tuning_for(BackendKind kind) {
  return resolve_backend(kind) == BackendKind::kCpu ? cpu_tuning_from_env() : CpuTuning{};
}

std::string golden_path_from_env() {
  const char* env = std::getenv("RENAISSANCE_GOLDEN");
  return env != nullptr ? env : "";
}

bool golden_recording_from_env() {
  const char* env = std::getenv("RENAISSANCE_GOLDEN_RECORDING");
  return env != nullptr && std::string(env) == "1";
}

}  // namespace program_env
}  // namespace renaissance
