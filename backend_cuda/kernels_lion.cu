// CUDA op UPDATE_LION (both groups; the bias-like group gets wd = 0 through the coefficients):
// the shared element-wise kernel with math::lion, reads g, w, m and writes w, m (20 B/param).
#include "backend_cuda/elementwise.cuh"

namespace renaissance {
namespace cuda {
namespace {

struct LionRule {
  static __device__ __forceinline__ void apply(float& w, float g, float& m, float&, const Coeffs<float>& c) {
    math::lion<ScalarPolicy>(w, g, m, c);
  }
};

}  // namespace

void launch_UPDATE_LION(const CudaContext& ctx, const GraphNode& node) {
  launch_elementwise<LionRule, true, false>(ctx, node, "lion update kernel");
}

}  // namespace cuda
}  // namespace renaissance
