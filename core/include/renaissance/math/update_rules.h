// The optimizer math in namespace renaissance::math, for the CUDA backend and scalar host code.
// The rules themselves are in update_rules.inc (see there why it is a textual include).
#pragma once

#include <cmath>
#include <cstdint>

#include "renaissance/math/host_device.h"
#include "renaissance/scalars.h"

namespace renaissance {
namespace math {
#include "renaissance/math/update_rules.inc"  // IWYU pragma: export
}  // namespace math
}  // namespace renaissance
