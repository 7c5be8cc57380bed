// ProgramId: what a backend keys its per-program work by (CUDA's captured graphs) instead of an
// address. A step built where another stood, a copy and a copy-assigned step are new programs; a
// move hands the number on.
#include <gtest/gtest.h>

#include <optional>
#include <utility>

#include "renaissance/graph.h"

namespace renaissance {
namespace {

TEST(ProgramId, AStepBuiltWhereAnotherStoodIsANewProgram) {
  std::optional<CompiledStep> step;
  step.emplace();
  const CompiledStep* address = &*step;
  const uint64_t first = step->id.value();
  step.reset();
  step.emplace();
  ASSERT_EQ(&*step, address);  // the same storage
  EXPECT_NE(step->id.value(), first);
  EXPECT_NE(step->id.value(), 0u);
  EXPECT_NE(first, 0u);
}

TEST(ProgramId, CopiesAreNewProgramsMovesHandTheNumberOn) {
  CompiledStep a;
  const uint64_t a_id = a.id.value();
  CompiledStep copy = a;
  EXPECT_NE(copy.id.value(), a_id);
  EXPECT_EQ(a.id.value(), a_id);  // the source keeps its number
  CompiledStep assigned;
  const uint64_t assigned_before = assigned.id.value();
  assigned = a;
  EXPECT_NE(assigned.id.value(), a_id);
  EXPECT_NE(assigned.id.value(), assigned_before);
  CompiledStep moved = std::move(a);
  EXPECT_EQ(moved.id.value(), a_id);
  EXPECT_NE(a.id.value(), a_id);  // NOLINT(bugprone-use-after-move): the moved-from step is a new program
  CompiledStep target;
  target = std::move(moved);
  EXPECT_EQ(target.id.value(), a_id);
  EXPECT_NE(moved.id.value(), a_id);  // NOLINT(bugprone-use-after-move)
}

}  // namespace
}  // namespace renaissance
