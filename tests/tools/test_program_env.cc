// tools/program_env.h: the RENAISSANCE_CPU_* variables the programs read into BackendOptions::cpu,
// with the messages a malformed value gets (the CLI prints them as they are), and the golden
// file's variables.
#include <gtest/gtest.h>
#include <stdlib.h>

#include <map>
#include <string>

#include "renaissance/backend.h"
#include "renaissance/error.h"
#include "tools/program_env.h"

namespace renaissance {
namespace {

CpuTuning parse(const std::map<std::string, std::string>& vars) {
  return program_env::cpu_tuning_from([&](const char* name) -> const char* {
    const auto it = vars.find(name);
    return it == vars.end() ? nullptr : it->second.c_str();
  });
}

// The message of the Error(kBackend) that `vars` get, or "" when they are accepted.
std::string refusal(const std::map<std::string, std::string>& vars) {
  try {
    parse(vars);
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kBackend) << e.what();
    return e.what();
  }
  return "";
}

TEST(ProgramEnv, UnsetAndEmptyVariablesGiveTheDefaults) {
  const CpuTuning d;
  for (const CpuTuning& t : {parse({}), parse({{"RENAISSANCE_CPU_CHUNK", ""}, {"RENAISSANCE_CPU_SCHEDULE", ""},
                                               {"RENAISSANCE_CPU_PREFETCH", ""}, {"RENAISSANCE_CPU_FUSE", ""},
                                               {"RENAISSANCE_CPU_UNROLL", ""}})}) {
    EXPECT_EQ(t.chunk_elements, d.chunk_elements);
    EXPECT_EQ(t.schedule, d.schedule);
    EXPECT_EQ(t.prefetch_elements, d.prefetch_elements);
    EXPECT_EQ(t.first_touch, d.first_touch);
    EXPECT_EQ(t.huge_pages, d.huge_pages);
    EXPECT_EQ(t.amx_tiles, d.amx_tiles);
  }
}

TEST(ProgramEnv, EveryVariableSetsItsSwitch) {
  const CpuTuning t = parse({{"RENAISSANCE_CPU_CHUNK", "64"},
                             {"RENAISSANCE_CPU_SCHEDULE", "static"},
                             {"RENAISSANCE_CPU_PREFETCH", "0"},
                             {"RENAISSANCE_CPU_FIRST_TOUCH", "0"},
                             {"RENAISSANCE_CPU_HUGEPAGES", "0"},
                             {"RENAISSANCE_CPU_AMX", "0"}});
  EXPECT_EQ(t.chunk_elements, 64u);
  EXPECT_EQ(t.schedule, CpuSchedule::kStatic);
  EXPECT_EQ(t.prefetch_elements, 0u);
  EXPECT_FALSE(t.first_touch);
  EXPECT_FALSE(t.huge_pages);
  EXPECT_FALSE(t.amx_tiles);
  EXPECT_EQ(parse({{"RENAISSANCE_CPU_SCHEDULE", "dynamic"}}).schedule, CpuSchedule::kDynamic);
  EXPECT_TRUE(parse({{"RENAISSANCE_CPU_FIRST_TOUCH", "1"}}).first_touch);
}

TEST(ProgramEnv, MalformedValuesNameTheVariable) {
  EXPECT_EQ(refusal({{"RENAISSANCE_CPU_CHUNK", "x"}}), "RENAISSANCE_CPU_CHUNK=x: expected a non-negative integer");
  EXPECT_EQ(refusal({{"RENAISSANCE_CPU_CHUNK", "-64"}}), "RENAISSANCE_CPU_CHUNK=-64: expected a non-negative integer");
  EXPECT_EQ(refusal({{"RENAISSANCE_CPU_CHUNK", "64k"}}), "RENAISSANCE_CPU_CHUNK=64k: expected a non-negative integer");
  EXPECT_EQ(refusal({{"RENAISSANCE_CPU_CHUNK", "100"}}), "RENAISSANCE_CPU_CHUNK=100: expected a positive multiple of 64");
  EXPECT_EQ(refusal({{"RENAISSANCE_CPU_CHUNK", "0"}}), "RENAISSANCE_CPU_CHUNK=0: expected a positive multiple of 64");
  EXPECT_EQ(refusal({{"RENAISSANCE_CPU_SCHEDULE", "guided"}}),
            "RENAISSANCE_CPU_SCHEDULE=guided: expected static or dynamic");
  EXPECT_EQ(refusal({{"RENAISSANCE_CPU_SCHEDULE", "interleaved"}}),
            "RENAISSANCE_CPU_SCHEDULE=interleaved: expected static or dynamic");
  EXPECT_EQ(refusal({{"RENAISSANCE_CPU_PREFETCH", "far"}}), "RENAISSANCE_CPU_PREFETCH=far: expected a non-negative integer");
  EXPECT_EQ(refusal({{"RENAISSANCE_CPU_FIRST_TOUCH", "yes"}}), "RENAISSANCE_CPU_FIRST_TOUCH=yes: expected 0 or 1");
  EXPECT_EQ(refusal({{"RENAISSANCE_CPU_HUGEPAGES", "2"}}), "RENAISSANCE_CPU_HUGEPAGES=2: expected 0 or 1");
  EXPECT_EQ(refusal({{"RENAISSANCE_CPU_AMX", "on"}}), "RENAISSANCE_CPU_AMX=on: expected 0 or 1");
}

// The switches that measurements retired are refused when set, even to their old defaults: the
// backend has only the path each default chose, and a set variable must not pass unnoticed.
TEST(ProgramEnv, RetiredSwitchesAreRefused) {
  EXPECT_EQ(refusal({{"RENAISSANCE_CPU_FUSE", "1"}}), "RENAISSANCE_CPU_FUSE=1: no longer a switch (unset it)");
  EXPECT_EQ(refusal({{"RENAISSANCE_CPU_STREAM_COPY", "0"}}),
            "RENAISSANCE_CPU_STREAM_COPY=0: no longer a switch (unset it)");
  EXPECT_EQ(refusal({{"RENAISSANCE_CPU_UNROLL", "4"}}), "RENAISSANCE_CPU_UNROLL=4: no longer a switch (unset it)");
}

TEST(ProgramEnv, ReadsTheProcessEnvironmentForTheCpuOnly) {
  ::setenv("RENAISSANCE_CPU_CHUNK", "128", 1);
  EXPECT_EQ(program_env::cpu_tuning_from_env().chunk_elements, 128u);
  EXPECT_EQ(program_env::cpu_tuning_for(BackendKind::kCpu).chunk_elements, 128u);
  // No other backend uses the switches: a malformed one is neither read nor refused for it.
  ::setenv("RENAISSANCE_CPU_CHUNK", "x", 1);
  EXPECT_EQ(program_env::cpu_tuning_for(BackendKind::kCuda).chunk_elements, CpuTuning{}.chunk_elements);
  EXPECT_THROW(program_env::cpu_tuning_for(BackendKind::kCpu), Error);
  ::unsetenv("RENAISSANCE_CPU_CHUNK");
}

TEST(ProgramEnv, GoldenVariables) {
  ::unsetenv("RENAISSANCE_GOLDEN");
  ::unsetenv("RENAISSANCE_GOLDEN_RECORDING");
  EXPECT_EQ(program_env::golden_path_from_env(), "");
  EXPECT_FALSE(program_env::golden_recording_from_env());
  ::setenv("RENAISSANCE_GOLDEN", "/tmp/some-golden.json", 1);
  ::setenv("RENAISSANCE_GOLDEN_RECORDING", "0", 1);
  EXPECT_EQ(program_env::golden_path_from_env(), "/tmp/some-golden.json");
  EXPECT_FALSE(program_env::golden_recording_from_env());
  ::setenv("RENAISSANCE_GOLDEN_RECORDING", "1", 1);
  EXPECT_TRUE(program_env::golden_recording_from_env());
  ::unsetenv("RENAISSANCE_GOLDEN");
  ::unsetenv("RENAISSANCE_GOLDEN_RECORDING");
}

}  // namespace
}  // namespace renaissance
