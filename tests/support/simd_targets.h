// Runs test code on one Highway target at a time: while an OnlySimdTarget lives, dynamic
// dispatch picks `target`; its destructor gives every target back, also when a test bails out
// early, so that no later test runs with a mocked target set.
#pragma once

#include <hwy/targets.h>

#include <cstdint>

namespace renaissance {
namespace testing_util {

class OnlySimdTarget {
 public:
  explicit OnlySimdTarget(int64_t target) { hwy::SetSupportedTargetsForTest(target); }
  ~OnlySimdTarget() { hwy::SetSupportedTargetsForTest(0); }
  OnlySimdTarget(const OnlySimdTarget&) = delete;
  OnlySimdTarget& operator=(const OnlySimdTarget&) = delete;
};

}  // namespace testing_util
}  // namespace renaissance
