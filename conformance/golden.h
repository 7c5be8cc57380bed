// The golden fingerprint file (conformance/golden/fingerprints.json): per conformance cell, the
// Task::fingerprint() the CUDA backend produced, with the machine it was recorded on. Shared,
// header-only, by the conformance suite (which records and checks it) and `renaissance audit`
// (which compares its own runs with it), so both read the file the same way.
//
// Format:
//   {"format": "renaissance-golden/1",
//    "recorded": true,                      // false: a placeholder, never recorded on a GPU
//    "machine": {"gpu", "driver", "cuda_runtime", "cuda_driver_api", "backend", "host", "date"},
//    "cells": {"<cell name>": {"spec": "<what the cell runs>", "fingerprint": "<16 hex>"}}}
// A cell's spec is a canonical one-line description of everything its fingerprint depends on,
// so a cell whose definition changed after recording is reported as such, never as a mismatch.
#pragma once

#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>

namespace renaissance {
namespace conformance {

constexpr const char* kGoldenFormat = "renaissance-golden/1";

struct GoldenCell {
  std::string spec;
  std::string fingerprint;
};

struct Golden {
  bool usable = false;     // the file exists, parses and was recorded on a GPU
  std::string why_not;     // when !usable: why, in one sentence
  std::string path;
  nlohmann::json machine;  // as recorded
  std::map<std::string, GoldenCell> cells;

  // One line naming the recording machine, e.g. "NVIDIA H200, driver 550.54, CUDA 12.4, 2025-01-02".
  std::string machine_line() const {
    auto field = [&](const char* key) {
      return machine.contains(key) && machine[key].is_string() ? machine[key].get<std::string>() : std::string("?");
    };
    return field("gpu") + ", driver " + field("driver") + ", CUDA runtime " + field("cuda_runtime") + ", recorded " +
           field("date");
  }
};

// The file in the source tree, found next to this header (CMake compiles with absolute paths),
// unless RENAISSANCE_GOLDEN names another one. An installed binary far from the source tree
// finds nothing there and reports NO GOLDEN rather than guessing.
inline std::string default_golden_path() {
  if (const char* env = std::getenv("RENAISSANCE_GOLDEN")) {
    if (*env) return env;
  }
  std::string here = __FILE__;
  const size_t slash = here.find_last_of('/');
  return (slash == std::string::npos ? std::string(".") : here.substr(0, slash)) + "/golden/fingerprints.json";
}

// Never throws: every problem becomes why_not, so callers can skip or print NO GOLDEN.
inline Golden load_golden(const std::string& path) {
  Golden g;
  g.path = path;
  std::ifstream in(path);
  if (!in) {
    g.why_not = "no golden file at " + path;
    return g;
  }
  std::stringstream text;
  text << in.rdbuf();
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text.str());
  } catch (const std::exception& e) {
    g.why_not = path + " is not valid JSON: " + e.what();
    return g;
  }
  if (!j.is_object() || j.value("format", "") != kGoldenFormat) {
    g.why_not = path + " is not a " + std::string(kGoldenFormat) + " file";
    return g;
  }
  if (!j.value("recorded", false)) {
    g.why_not = path + " has not been recorded on a GPU yet (run scripts/record_golden.sh on a machine with a CUDA device)";
    return g;
  }
  if (!j.contains("cells") || !j["cells"].is_object() || j["cells"].empty()) {
    g.why_not = path + " holds no cells";
    return g;
  }
  g.machine = j.value("machine", nlohmann::json::object());
  for (auto it = j["cells"].begin(); it != j["cells"].end(); ++it) {
    GoldenCell c;
    c.spec = it.value().value("spec", "");
    c.fingerprint = it.value().value("fingerprint", "");
    g.cells[it.key()] = c;
  }
  g.usable = true;
  return g;
}

// 64-bit FNV-1a: a short, portable digest of a layout's description for specs.
inline uint64_t fnv1a64(const std::string& s) {
  uint64_t h = 0xcbf29ce484222325ULL;
  for (unsigned char c : s) {
    h ^= c;
    h *= 0x100000001b3ULL;
  }
  return h;
}

}  // namespace conformance
}  // namespace renaissance
