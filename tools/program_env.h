// The environment variables the programs (the `renaissance` CLI, the benchmarks, the
// conformance suite, the Python module) honour, read in one place into the library's options.
// The library itself takes only those options and never reads the environment.
//
// The CPU backend's switches (CpuTuning, renaissance/backend.h), each unset or empty for its
// default:
//   RENAISSANCE_CPU_CHUNK=N          CpuTuning::chunk_elements (a positive multiple of 64)
//   RENAISSANCE_CPU_SCHEDULE=static|dynamic
//   RENAISSANCE_CPU_PREFETCH=N       CpuTuning::prefetch_elements (0: off)
//   RENAISSANCE_CPU_FIRST_TOUCH=0|1  CpuTuning::first_touch
//   RENAISSANCE_CPU_HUGEPAGES=0|1    CpuTuning::huge_pages
//   RENAISSANCE_CPU_AMX=0|1          CpuTuning::amx_tiles
// A malformed value throws Error(kBackend) naming the variable, e.g.
// "RENAISSANCE_CPU_CHUNK=x: expected a non-negative integer". The switches that measurements
// retired (RENAISSANCE_CPU_UNROLL, RENAISSANCE_CPU_FUSE, RENAISSANCE_CPU_STREAM_COPY; the
// "interleaved" schedule) are refused the same way when set, rather than ignored.
//
// The golden fingerprint file (audit/golden.h):
//   RENAISSANCE_GOLDEN=FILE          read FILE instead of the embedded file (the self-tests that
//                                    tamper with a copy, a recording under review)
//   RENAISSANCE_GOLDEN_RECORDING=1   scripts/record_golden.sh's opt-out from "an unusable golden
//                                    file is a failure" while it re-records the file
#pragma once

#include <functional>
#include <string>

#include "renaissance/backend.h"

namespace renaissance {
namespace program_env {

// A variable's value, or null when it is unset.
using Lookup = std::function<const char*(const char* name)>;

// The switches as `lookup` gives the RENAISSANCE_CPU_* variables (defaults where unset or
// empty); a malformed value throws Error(kBackend) naming the variable.
CpuTuning cpu_tuning_from(const Lookup& lookup);
// The same from the process environment.
CpuTuning cpu_tuning_from_env();

// What a task on backend `kind` takes as BackendOptions::cpu: the process environment's switches
// when `kind` resolves to the CPU backend, else the defaults (no other backend uses them, so
// their variables are not looked at, nor refused, then).
CpuTuning cpu_tuning_for(BackendKind kind);

// RENAISSANCE_GOLDEN, or "" (the embedded file) when unset or empty.
std::string golden_path_from_env();
// RENAISSANCE_GOLDEN_RECORDING=1.
bool golden_recording_from_env();

}  // namespace program_env
}  // namespace renaissance
