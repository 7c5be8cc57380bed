// Configure-time probe of RENAISSANCE_SIMD_TARGETS=native (CMakeLists.txt): prints the
// HWY_DISABLED_TARGETS mask that leaves, of every target HWY_COMPILE_ALL_ATTAINABLE builds, only
// the one this machine's dispatcher picks and the static (baseline) target Highway always keeps.
#include <cstdint>
#include <cstdio>

#include "hwy/highway.h"
#include "hwy/targets.h"

int main() {
  const int64_t generated = HWY_TARGETS;
  const int64_t usable = hwy::SupportedTargets() & generated;
  const int64_t best = usable & -usable;  // the lowest bit is Highway's best target
  std::printf("%lld;%s", static_cast<long long>(generated & ~best & ~static_cast<int64_t>(HWY_STATIC_TARGET)),
              hwy::TargetName(best));
  return 0;
}
