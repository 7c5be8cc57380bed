// The operand access of the CUDA kernels, in one place: the table of the (G encoding, model-copy
// format, rounding) combinations that are compiled, and the host dispatch that hands a launch the
// reader of a node's G (grad_load.cuh: by encoding, from the arena or through the gradient table)
// and its copy writer (model_copy.cuh: by format and rounding). kAccessTable is generated from
// precision_combination_valid (renaissance/precision.h) over the precision table, so a kernel is
// instantiated for a combination only if a step can select it; a node outside the table is
// refused with an Error, never launched.
#pragma once

#include <cuda_runtime.h>

#include <string>
#include <type_traits>

#include "backend_cuda/cuda_ops.h"
#include "backend_cuda/grad_load.cuh"
#include "backend_cuda/model_copy.cuh"
#include "renaissance/error.h"
#include "renaissance/precision.h"

namespace renaissance {
namespace cuda {

// One combination: G's encoding, the copy's format (kFp32: no model copy) and its rounding.
struct Access {
  Precision grad = Precision::kFp32;
  Precision copy = Precision::kFp32;
  Rounding rounding = Rounding::kNearest;
};
constexpr bool operator==(const Access& a, const Access& b) {
  return a.grad == b.grad && a.copy == b.copy && a.rounding == b.rounding;
}

// kAccessTable: every combination precision_combination_valid allows, grad-major over the
// precision table's rows, then copy format, then rounding (nearest first). Generated, so a new
// precision adds its combinations (and the kernels' instantiations) without an edit here.
constexpr Rounding kRoundings[] = {Rounding::kNearest, Rounding::kStochastic};
template <class F>
constexpr void for_each_valid_access(F&& f) {
  for (const PrecisionRow& g : kPrecisionRows) {
    for (const PrecisionRow& c : kPrecisionRows) {
      for (Rounding r : kRoundings) {
        if (precision_combination_valid(g.value, c.value, r)) f(Access{g.value, c.value, r});
      }
    }
  }
}
constexpr int count_valid_access() {
  int n = 0;
  for_each_valid_access([&n](const Access&) { ++n; });
  return n;
}
constexpr int kNumAccess = count_valid_access();
struct AccessList {
  Access at[kNumAccess];
};
constexpr AccessList make_access_list() {
  AccessList list{};
  int n = 0;
  for_each_valid_access([&](const Access& a) { list.at[n++] = a; });
  return list;
}
constexpr AccessList kAccessList = make_access_list();
// static: a namespace-scope reference is not const-qualified, so without it every source that
// includes this header would define the same external symbol (a link error).
static constexpr const Access (&kAccessTable)[kNumAccess] = kAccessList.at;

// The index of `a` in kAccessTable, or -1.
constexpr int access_index(const Access& a) {
  for (int i = 0; i < kNumAccess; ++i) {
    if (kAccessTable[i] == a) return i;
  }
  return -1;
}

// The first entry with entry i's G encoding (resp. copy format and rounding): the kernels that
// read only G (or write only the copy) are instantiated once per distinct one.
constexpr int first_with_grad(int i) {
  for (int j = 0; j < i; ++j) {
    if (kAccessTable[j].grad == kAccessTable[i].grad) return j;
  }
  return i;
}
constexpr int first_with_copy(int i) {
  for (int j = 0; j < i; ++j) {
    if (kAccessTable[j].copy == kAccessTable[i].copy && kAccessTable[j].rounding == kAccessTable[i].rounding) return j;
  }
  return i;
}

// The reader and writer types of entry I.
template <int I>
struct AccessTypes {
  static constexpr Access kAccess = kAccessTable[I];
  using ArenaGrad = std::conditional_t<kAccess.grad == Precision::kFp32, GradF32, GradHalf<kAccess.grad>>;
  using TableGrad = GradTabled<kAccess.grad>;
  using Copy = std::conditional_t<kAccess.copy == Precision::kFp32, NoCopy, CopyWriter<kAccess.copy, kAccess.rounding>>;
};

// The node's combination. A node with a copy span writes its copy even where its lookup lists
// no tensor (a sharded step's slice of padding only): every element is then padding and the
// writer stores nothing, as no copy would.
inline Access node_access(const GraphNode& node) {
  if (node.copy.c.count == 0) return {node.grad.encoding, Precision::kFp32, Rounding::kNearest};
  return {node.grad.encoding, node.copy.precision, node.copy.rounding};
}

[[noreturn]] inline void refuse_access(const Access& a, const char* what) {
  throw Error(ErrorKind::kInvalidArgument,
              std::string("cuda backend: no ") + what + " for gradients in " + precision_name(a.grad) +
                  (a.copy == Precision::kFp32 ? std::string(" without a model copy")
                                              : std::string(" with a ") + precision_name(a.copy) + " model copy") +
                  " rounded " + rounding_name(a.rounding) + ": not a combination a step can have (precision.h)");
}

// The node's index in kAccessTable; throws for a combination outside it.
inline int checked_access(const GraphNode& node, const char* what) {
  const Access a = node_access(node);
  const int i = access_index(a);
  if (i < 0) refuse_access(a, what);
  return i;
}

template <class Grad>
Grad arena_grad(const CudaContext& ctx, const GraphNode& node) {
  using Element = std::remove_const_t<std::remove_pointer_t<decltype(Grad::p)>>;
  return Grad{ctx.at<const Element>(node.span(Family::kG))};
}

// The reader of the node's G for entry I: through the gradient table when the step has one
// (CudaContext::grads), else the arena span's.
template <int I, class Launch>
void launch_with_grad_of(const CudaContext& ctx, const GraphNode& node, Launch&& launch) {
  using T = AccessTypes<I>;
  if (node.grad.table.count != 0) {
    // The plan's tensor table of the view of the node's G span and this step's chunk addresses (grad_chunks.cu).
    const GradTableRef ref{table_lookup(ctx.arena, node.grad.tensors), ctx.at<const uint64_t>(node.grad.table),
                           ctx.at<const uint64_t>(node.grad.chunk_addresses)};
    return launch(typename T::TableGrad{ref, 0});
  }
  launch(arena_grad<typename T::ArenaGrad>(ctx, node));
}

template <class Copy>
Copy node_copy(const CudaContext& ctx, const GraphNode& node) {
  if constexpr (std::is_same_v<Copy, NoCopy>) {
    return NoCopy{};
  } else {
    // tensor_mask: each tensor's own step count keys its rounding (S_TENSOR_INT32's second half).
    const int32_t* steps =
        node.work.tensor_state.count ? ctx.at<const int32_t>(node.work.tensor_state) + node.work.tensor_state.count / 2 : nullptr;
    return Copy{ctx.at<typename Copy::Bits>(node.copy.c), table_lookup(ctx.arena, node.copy.tensors), node.copy.base,
                node.copy.seed, ctx.scalars.i32, steps};
  }
}

// Calls launch(grad, copy) with the node's G reader and copy writer: one instantiation per entry
// of kAccessTable and G source (arena or table).
template <int I = 0, class Launch>
void dispatch_access(int index, const CudaContext& ctx, const GraphNode& node, Launch&& launch) {
  if constexpr (I < kNumAccess) {
    if (index != I) return dispatch_access<I + 1>(index, ctx, node, launch);
    const auto copy = node_copy<typename AccessTypes<I>::Copy>(ctx, node);
    launch_with_grad_of<I>(ctx, node, [&](auto g) { launch(g, copy); });
  }
}
template <class Launch>
void with_access(const CudaContext& ctx, const GraphNode& node, Launch&& launch) {
  dispatch_access(checked_access(node, "update kernel"), ctx, node, launch);
}

// Calls launch(grad) with the node's G reader (kernels that read G and write no copy): one
// instantiation per G encoding of the table and G source.
template <int I = 0, class Launch>
void dispatch_grad(int index, const CudaContext& ctx, const GraphNode& node, Launch&& launch) {
  if constexpr (I < kNumAccess) {
    if constexpr (first_with_grad(I) == I) {
      if (index == I) return launch_with_grad_of<I>(ctx, node, launch);
    }
    dispatch_grad<I + 1>(index, ctx, node, launch);
  }
}
template <class Launch>
void with_grad(const CudaContext& ctx, const GraphNode& node, Launch&& launch) {
  // Only G's encoding matters here: any copy the table has with it selects the same reader.
  int index = -1;
  for (int i = 0; i < kNumAccess && index < 0; ++i) {
    if (kAccessTable[i].grad == node.grad.encoding) index = i;
  }
  if (index < 0) {
    throw Error(ErrorKind::kInvalidArgument, "cuda backend: no gradient reader for encoding " +
                                                 std::to_string(static_cast<int>(node.grad.encoding)));
  }
  dispatch_grad(index, ctx, node, launch);
}

// Calls launch(copy) with the node's copy writer (kernels that write the copy and read no G):
// one instantiation per (copy format, rounding) of the table.
template <int I = 0, class Launch>
void dispatch_copy(int index, const CudaContext& ctx, const GraphNode& node, Launch&& launch) {
  if constexpr (I < kNumAccess) {
    if constexpr (first_with_copy(I) == I) {
      if (index == I) return launch(node_copy<typename AccessTypes<I>::Copy>(ctx, node));
    }
    dispatch_copy<I + 1>(index, ctx, node, launch);
  }
}
template <class Launch>
void with_copy(const CudaContext& ctx, const GraphNode& node, Launch&& launch) {
  dispatch_copy(first_with_copy(checked_access(node, "copy writer")), ctx, node, launch);
}

}  // namespace cuda
}  // namespace renaissance
