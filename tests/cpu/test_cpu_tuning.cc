// The CPU backend's switches (CpuTuning, BackendOptions::cpu) given directly, with no environment:
// the backend takes them (describe() names every switch that differs from its default, and the
// ops run with those very values), refuses malformed ones, never looks at RENAISSANCE_CPU_*
// itself, and computes the same bits under every combination (the contract: the switches are
// performance only).
#include <gtest/gtest.h>
#include <stdlib.h>

#include <memory>
#include <string>
#include <vector>

#include "renaissance/backend.h"
#include "renaissance/error.h"
#include "renaissance/task.h"
#include "support/optimizer_cases.h"

namespace renaissance {
namespace {

using testing_util::KindCase;

// Every switch away from its default.
CpuTuning everything_changed() {
  CpuTuning t;
  t.chunk_elements = 64;
  t.schedule = CpuSchedule::kStatic;
  t.prefetch_elements = 100;
  t.first_touch = false;
  t.huge_pages = false;
  t.amx_tiles = false;
  return t;
}

std::string described(const CpuTuning& tuning) {
  BackendOptions options;
  options.threads = 2;
  options.cpu = tuning;
  return create_backend(BackendKind::kCpu, options)->describe();
}

TEST(CpuTuning, DefaultsAreNamedNowhere) {
  const std::string d = described(CpuTuning{});
  for (const char* word : {"chunk", "static", "dynamic", "prefetch", "touch", "memset", "huge", "amx"}) {
    EXPECT_EQ(d.find(word), std::string::npos) << word << " in " << d;
  }
}

TEST(CpuTuning, OptionsGivenDirectlyTakeEffect) {
  const std::string d = described(everything_changed());
  for (const char* part : {", chunk 64", ", static", ", prefetch 100", ", memset arena", ", no huge pages", ", no amx tiles"}) {
    EXPECT_NE(d.find(part), std::string::npos) << part << " missing from " << d;
  }
  CpuTuning t;
  t.chunk_elements = 1088;
  t.prefetch_elements = 0;
  EXPECT_NE(described(t).find(", chunk 1088, prefetch 0)"), std::string::npos) << described(t);
}

TEST(CpuTuning, MalformedOptionsAreRefused) {
  auto refused = [](const CpuTuning& t, const std::string& says) {
    BackendOptions options;
    options.cpu = t;
    try {
      create_backend(BackendKind::kCpu, options);
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::kBackend) << e.what();
      EXPECT_NE(std::string(e.what()).find(says), std::string::npos) << e.what();
      return;
    }
    ADD_FAILURE() << "accepted; expected " << says;
  };
  CpuTuning t;
  t.chunk_elements = 0;
  refused(t, "chunk_elements 0: expected a positive multiple of 64");
  t.chunk_elements = 100;
  refused(t, "chunk_elements 100: expected a positive multiple of 64");
  t = CpuTuning{};
  t.schedule = static_cast<CpuSchedule>(7);
  refused(t, "schedule 7: expected static or dynamic");
}

// The library takes only its options: variables a program would read change nothing here, and
// a malformed one is not refused (no program asked for it).
TEST(CpuTuning, TheBackendReadsNoEnvironment) {
  ::setenv("RENAISSANCE_CPU_CHUNK", "64", 1);
  ::setenv("RENAISSANCE_CPU_SCHEDULE", "no-such-schedule", 1);
  ::setenv("RENAISSANCE_CPU_PREFETCH", "4096", 1);
  std::string d;
  EXPECT_NO_THROW(d = described(CpuTuning{}));
  ::unsetenv("RENAISSANCE_CPU_CHUNK");
  ::unsetenv("RENAISSANCE_CPU_SCHEDULE");
  ::unsetenv("RENAISSANCE_CPU_PREFETCH");
  EXPECT_EQ(d.find("chunk"), std::string::npos) << d;
  EXPECT_EQ(d.find("prefetch"), std::string::npos) << d;
}

// Same bits under other switches: every kind, fp32 and a bf16 model copy with bf16 gradients (the
// fused update-and-copy path), on a layout whose tensors span many 64-element
// chunks and end mid-vector, with one matrix for Muon (its exact products with and without the
// AMX tile unit).
class CpuTuningBits : public ::testing::TestWithParam<KindCase> {};

std::string fingerprint(const KindCase& kc, const CpuTuning& tuning, bool bf16) {
  const std::vector<ParamSpec> params = {{"a", {3}, Role::kBnBias},      {"b", {16384 + 4099}, Role::kDeepConv},
                                         {"c", {1023}, Role::kBnWeight}, {"d", {4096 * 2 + 1}, Role::kFcWeight},
                                         {"e", {17}, Role::kFcBias},     {"f", {777}, Role::kFirstConv},
                                         {"m", {70, 150}, Role::kFcWeight}};
  TaskOptions options;
  options.backend = BackendKind::kCpu;
  options.backend_options.threads = 2;
  options.backend_options.cpu = tuning;
  if (bf16) {
    options.precision.precision = Precision::kBf16;
    options.precision.model_dtype_gradients = true;
  }
  Task task(params, options);
  task.optimizer(kc.config);
  task.compile();
  task.synthesize_weights(5, 0, 0.5f);
  for (uint64_t s = 0; s < 3; ++s) {
    task.synthesize_gradients(7, s, 1e-2f);
    task.step();
  }
  return task.fingerprint();
}

TEST_P(CpuTuningBits, SameBitsUnderEverySwitch) {
  CpuTuning other;
  other.chunk_elements = 1088;
  other.schedule = CpuSchedule::kDynamic;
  other.prefetch_elements = 4096;
  for (bool bf16 : {false, true}) {
    SCOPED_TRACE(bf16 ? "bf16 copy, bf16 gradients" : "fp32");
    const std::string base = fingerprint(GetParam(), CpuTuning{}, bf16);
    EXPECT_EQ(fingerprint(GetParam(), everything_changed(), bf16), base);
    EXPECT_EQ(fingerprint(GetParam(), other, bf16), base);
  }
}

INSTANTIATE_TEST_SUITE_P(AllKinds, CpuTuningBits, ::testing::ValuesIn(testing_util::all_kind_cases()),
                         [](const ::testing::TestParamInfo<KindCase>& info) { return info.param.name; });

}  // namespace
}  // namespace renaissance
