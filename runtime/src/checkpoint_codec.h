// The small sections of a checkpoint (docs/checkpoint-format.md): META (the optimizer
// configuration, the lr, loss scale, step counts and run settings), PREC (the model copy's dtype
// and rounding key) and LAYT (the parameters): encoded for Task::save, decoded and checked against
// the task for Task::load and read_checkpoint_info. The framing is checkpoint_framing.h's (include
// this header after xxhash.h with XXH_INLINE_ALL, as that one); the state sections, the scalars
// and the two passes of a load are checkpoint.cc's.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "renaissance/layout.h"
#include "renaissance/task.h"
#include "runtime/src/checkpoint_framing.h"

namespace renaissance {
namespace checkpoint_format {

constexpr uint64_t kMaxMetaBytes = 64 * 1024;  // kind, decay mode, numbers, schedule name
constexpr size_t kMaxScheduleName = 64;
constexpr uint64_t kPrecisionBytes = 4 + 4 + 8;  // PREC: u32 precision, u32 rounding, u64 seed

// Each encode_* appends its section's payload to *out.
// META of a task: info's config, lr, loss_scale, step, skipped, check_finite and run (not its
// version or precision, which the header and PREC hold).
void encode_meta(const CheckpointInfo& info, Bytes* out);
// META, decoded and validated on its own (no task needed): read_checkpoint_info and load share it.
void decode_meta(Cursor& c, CheckpointInfo* info);
// The compiled step depends on the kind, the rows fixed after compile (amsgrad, Muon's adjust_lr
// and mode), any other switch of a family, the decay mode, clipping on or off and the
// check-finite flag: META's must be the task's.
// Everything else is adopted.
void check_meta_matches(const std::string& path, const CheckpointInfo& info, const OptimizerConfig& task,
                        bool check_finite);

void encode_precision(const PrecisionOptions& p, Bytes* out);
void decode_precision(Cursor& c, PrecisionOptions* p);
// Refuses a checkpoint whose model copy would not continue the task's run.
void check_precision(const std::string& path, const PrecisionOptions& file, const PrecisionOptions& task);

void encode_layout(const std::vector<ParamSpec>& params, Bytes* out);
// LAYOUT: the file's parameters are the task's; throws naming the first difference.
void check_layout(Cursor& c, const std::string& path, const std::vector<ParamSpec>& params);

}  // namespace checkpoint_format
}  // namespace renaissance
