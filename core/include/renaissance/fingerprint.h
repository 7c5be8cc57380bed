// One fingerprint for several tasks: a torch optimizer with N parameter groups runs one Task per
// group, and its replay case (format 2, docs/replay-format.md) stores one expected value. The
// combination is defined here once, for `renaissance replay`, the Python binding and
// renaissance.torch's opt.fingerprint(), so that the three can never disagree.
#pragma once

#include <string>
#include <vector>

namespace renaissance {

// One group: its own fingerprint, unchanged (a one-group case is a format-1 case). Several: the
// XXH3-64 of the group fingerprints (16 lowercase hex digits each) joined by "\n", in group
// order, as 16 lowercase hex digits. Throws Error(kInvalidArgument) for an empty list or an
// entry that is not 16 lowercase hex digits.
std::string combine_fingerprints(const std::vector<std::string>& group_fingerprints);

// Whether `s` is 16 lowercase hex digits (the form Task::fingerprint() returns).
bool is_fingerprint_text(const std::string& s);

}  // namespace renaissance
