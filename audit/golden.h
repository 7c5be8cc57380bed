// The golden fingerprint file (audit/golden/fingerprints.json): per conformance cell, the
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

  // One line naming the recording machine and time, e.g. "NVIDIA H200, driver 580.159.04, CUDA
  // runtime 13.0, recorded " followed by the recording's UTC time as the file stores it.
  std::string machine_line() const {
    auto field = [&](const char* key) {
      return machine.contains(key) && machine[key].is_string() ? machine[key].get<std::string>() : std::string("?");
    };
    return field("gpu") + ", driver " + field("driver") + ", CUDA runtime " + field("cuda_runtime") + ", recorded " +
           field("date");
  }
};

// The golden file is compiled into the binaries (audit/embed_golden.cmake writes it into
// a generated source of the renaissance_golden_data library), like the built-in layouts: an
// installed binary carries the file it was built with, and nothing is looked up next to the
// source at run time. A program may read another file instead (load_golden's path: the CLI and
// the suite take it from RENAISSANCE_GOLDEN, tools/program_env.h); that exists for the self-tests
// that tamper with a copy (and for a recording being reviewed), not for users.
// Declared weak so that a CLI built without the conformance directory (tests off) still links;
// it then has no golden file, which the audit reports as a failure, never as a pass.
extern "C" const char renaissance_embedded_golden[] __attribute__((weak));
extern "C" const unsigned long renaissance_embedded_golden_size __attribute__((weak));

constexpr const char* kEmbeddedGoldenName = "embedded audit/golden/fingerprints.json";

// Never throws: every problem becomes why_not, which callers report as a failure (except while
// re-recording the file: the suite's --record-golden under scripts/record_golden.sh's
// RENAISSANCE_GOLDEN_RECORDING=1 opt-out, which the program reads). `path` empty: the embedded file.
inline Golden load_golden(const std::string& path) {
  Golden g;
  std::string text;
  if (path.empty()) {
    g.path = kEmbeddedGoldenName;
    if (&renaissance_embedded_golden_size == nullptr || renaissance_embedded_golden == nullptr) {
      g.why_not = "this binary carries no golden file (built without the conformance directory)";
      return g;
    }
    text.assign(renaissance_embedded_golden, renaissance_embedded_golden_size);
  } else {
    g.path = path;
    std::ifstream in(path);
    if (!in) {
      g.why_not = "no golden file at " + path;
      return g;
    }
    std::stringstream buf;
    buf << in.rdbuf();
    text = buf.str();
  }
  const std::string& path_or_name = g.path;
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text);
  } catch (const std::exception& e) {
    g.why_not = path_or_name + " is not valid JSON: " + e.what();
    return g;
  }
  if (!j.is_object() || j.value("format", "") != kGoldenFormat) {
    g.why_not = path_or_name + " is not a " + std::string(kGoldenFormat) + " file";
    return g;
  }
  if (!j.value("recorded", false)) {
    g.why_not = path_or_name + " has not been recorded on a GPU yet (run scripts/record_golden.sh on a machine with a CUDA device)";
    return g;
  }
  if (!j.contains("cells") || !j["cells"].is_object() || j["cells"].empty()) {
    g.why_not = path_or_name + " holds no cells";
    return g;
  }
  g.machine = j.value("machine", nlohmann::json::object());
  for (auto it = j["cells"].begin(); it != j["cells"].end(); ++it) {
    GoldenCell c;
    if (it.value().is_object()) {
      c.spec = it.value().value("spec", "");
      c.fingerprint = it.value().value("fingerprint", "");
    }
    // An entry without a 16-hex-digit fingerprint would compare unequal forever; it is a broken
    // file, not a cell to report one mismatch for.
    if (c.fingerprint.size() != 16 || c.fingerprint.find_first_not_of("0123456789abcdef") != std::string::npos) {
      g.why_not = path_or_name + ": cell " + it.key() + " has no valid fingerprint";
      g.cells.clear();
      return g;
    }
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
