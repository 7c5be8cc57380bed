// cuBLASLt loaded at first use and the planned strided-batched products of cublaslt.h. The
// library's own header gives every function's type (decltype), so the loaded symbols are checked
// against the prototypes this code was compiled with; the soname carries the major version the
// header is from.
#include "backend_cuda/cublaslt.h"

#include <cublasLt.h>
#include <cuda_runtime.h>
#include <dlfcn.h>

#include <cstdint>
#include <mutex>
#include <string>

#include "renaissance/error.h"

namespace renaissance {
namespace cuda {
namespace {

#define RN_STR2(x) #x
#define RN_STR(x) RN_STR2(x)
constexpr const char* kLibraryName = "libcublasLt.so." RN_STR(CUBLAS_VER_MAJOR);

// The entry points used here: (member of Api, symbol of the library).
#define RN_CUBLASLT_FUNCTIONS(X)                      \
  X(create, cublasLtCreate)                           \
  X(desc_create, cublasLtMatmulDescCreate)            \
  X(desc_destroy, cublasLtMatmulDescDestroy)          \
  X(desc_set, cublasLtMatmulDescSetAttribute)         \
  X(layout_create, cublasLtMatrixLayoutCreate)        \
  X(layout_destroy, cublasLtMatrixLayoutDestroy)      \
  X(layout_set, cublasLtMatrixLayoutSetAttribute)     \
  X(pref_create, cublasLtMatmulPreferenceCreate)      \
  X(pref_destroy, cublasLtMatmulPreferenceDestroy)    \
  X(pref_set, cublasLtMatmulPreferenceSetAttribute)   \
  X(heuristic, cublasLtMatmulAlgoGetHeuristic)        \
  X(matmul, cublasLtMatmul)                           \
  X(status_name, cublasLtGetStatusName)

// The entry points resolved from the loaded library, typed by the header's prototypes.
struct Api {
#define RN_MEMBER(member, symbol) decltype(&symbol) member = nullptr;
  RN_CUBLASLT_FUNCTIONS(RN_MEMBER)
#undef RN_MEMBER
  cublasLtHandle_t handle = nullptr;
  std::string error;  // why the library is not usable; empty when it is
};

template <class F>
bool resolve(void* library, const char* name, F* out, std::string* error) {
  *out = reinterpret_cast<F>(dlsym(library, name));
  if (*out == nullptr) *error = std::string(kLibraryName) + " has no " + name;
  return *out != nullptr;
}

// A status as the library names it, with its number: "CUBLAS_STATUS_INVALID_VALUE (7)".
std::string status_text(const Api& a, cublasStatus_t status) {
  const char* name = a.status_name != nullptr ? a.status_name(status) : nullptr;
  return std::string(name != nullptr ? name : "status") + " (" + std::to_string(static_cast<int>(status)) + ")";
}

// Loaded once per process; the handle is kept until exit (the library may be unloaded by then).
const Api& api() {
  static Api a;
  static std::once_flag once;
  std::call_once(once, [] {
    void* library = dlopen(kLibraryName, RTLD_NOW | RTLD_LOCAL);
    if (library == nullptr) {
      const char* e = dlerror();
      a.error = std::string("cannot load ") + kLibraryName + ": " + (e != nullptr ? e : "unknown error");
      return;
    }
#define RN_RESOLVE(member, symbol) \
  if (!resolve(library, #symbol, &a.member, &a.error)) return;
    RN_CUBLASLT_FUNCTIONS(RN_RESOLVE)
#undef RN_RESOLVE
    const cublasStatus_t status = a.create(&a.handle);
    if (status != CUBLAS_STATUS_SUCCESS) {
      a.error = "cublasLtCreate failed: " + status_text(a, status);
      a.handle = nullptr;
    }
  });
  return a;
}

}  // namespace

bool cublaslt_available(std::string* why) {
  const Api& a = api();
  if (!a.error.empty() && why != nullptr) *why = a.error;
  return a.error.empty();
}

struct LtMatmul::State {
  LtProduct product;
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, d = nullptr;
  cublasLtMatmulAlgo_t algo{};

  ~State() {
    const Api& x = api();
    if (d != nullptr) (void)x.layout_destroy(d);
    if (b != nullptr) (void)x.layout_destroy(b);
    if (a != nullptr) (void)x.layout_destroy(a);
    if (desc != nullptr) (void)x.desc_destroy(desc);
  }
};

LtMatmul::LtMatmul(std::unique_ptr<State> state) : state_(std::move(state)) {}
LtMatmul::~LtMatmul() = default;

std::unique_ptr<LtMatmul> LtMatmul::plan(LtProduct product, const LtLayout& la, const LtLayout& lb,
                                         const LtLayout& ld, int batch, std::string* why) {
  const Api& x = api();
  auto fail = [why](const std::string& reason) -> std::unique_ptr<LtMatmul> {
    if (why != nullptr) *why = reason;
    return nullptr;
  };
  if (!x.error.empty()) return fail(x.error);
  auto s = std::make_unique<State>();
  s->product = product;
  // kInt8: int8 operands, int32 results and scales; kBf16: bf16 operands and results, fp32
  // accumulation and scales (cublaslt.h).
  const bool int8 = product == LtProduct::kInt8;
  const cudaDataType_t in_type = int8 ? CUDA_R_8I : CUDA_R_16BF;
  const cudaDataType_t out_type = int8 ? CUDA_R_32I : CUDA_R_16BF;
  const cublasComputeType_t compute = int8 ? CUBLAS_COMPUTE_32I : CUBLAS_COMPUTE_32F;
  const cudaDataType_t scale_type = int8 ? CUDA_R_32I : CUDA_R_32F;
  bool ok = x.desc_create(&s->desc, compute, scale_type) == CUBLAS_STATUS_SUCCESS;
  const cublasOperation_t ta = la.transposed ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t tb = lb.transposed ? CUBLAS_OP_T : CUBLAS_OP_N;
  ok = ok && x.desc_set(s->desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta)) == CUBLAS_STATUS_SUCCESS;
  ok = ok && x.desc_set(s->desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb)) == CUBLAS_STATUS_SUCCESS;
  const cublasLtPointerMode_t mode = int8 ? CUBLASLT_POINTER_MODE_HOST : CUBLASLT_POINTER_MODE_DEVICE;
  ok = ok && x.desc_set(s->desc, CUBLASLT_MATMUL_DESC_POINTER_MODE, &mode, sizeof(mode)) == CUBLAS_STATUS_SUCCESS;
  auto make_layout = [&](cublasLtMatrixLayout_t* out, cudaDataType_t type, const LtLayout& l) {
    if (x.layout_create(out, type, l.rows, l.cols, l.ld) != CUBLAS_STATUS_SUCCESS) return false;
    const int32_t count = batch;
    const int64_t stride = l.batch_stride;
    return x.layout_set(*out, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &count, sizeof(count)) == CUBLAS_STATUS_SUCCESS &&
           x.layout_set(*out, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &stride, sizeof(stride)) ==
               CUBLAS_STATUS_SUCCESS;
  };
  ok = ok && make_layout(&s->a, in_type, la) && make_layout(&s->b, in_type, lb) && make_layout(&s->d, out_type, ld);
  if (!ok) return fail("cuBLASLt refused the descriptors of a product");
  cublasLtMatmulPreference_t pref = nullptr;
  if (x.pref_create(&pref) != CUBLAS_STATUS_SUCCESS) return fail("cuBLASLt: no preference descriptor");
  const uint64_t workspace = kLtWorkspaceBytes;
  cublasLtMatmulHeuristicResult_t result{};
  int found = 0;
  const bool asked =
      x.pref_set(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &workspace, sizeof(workspace)) ==
          CUBLAS_STATUS_SUCCESS &&
      x.heuristic(x.handle, s->desc, s->a, s->b, s->d, s->d, pref, 1, &result, &found) == CUBLAS_STATUS_SUCCESS;
  (void)x.pref_destroy(pref);
  if (!asked || found < 1 || result.state != CUBLAS_STATUS_SUCCESS) {
    return fail("cuBLASLt has no algorithm for a " + std::to_string(ld.rows) + " x " + std::to_string(ld.cols) +
                " product (k " + std::to_string(la.transposed ? la.rows : la.cols) + ", batch " +
                std::to_string(batch) + ")");
  }
  s->algo = result.algo;
  return std::unique_ptr<LtMatmul>(new LtMatmul(std::move(s)));
}

void LtMatmul::enqueue(const void* a, const void* b, void* d, CUstream_st* stream, void* workspace,
                       const float* alpha, const float* beta, const void* c) const {
  const Api& x = api();
  const State& s = *state_;
  const int32_t one = 1, zero = 0;
  const bool int8 = s.product == LtProduct::kInt8;
  const void* al = int8 ? static_cast<const void*>(&one) : static_cast<const void*>(alpha);
  const void* be = int8 ? static_cast<const void*>(&zero) : static_cast<const void*>(beta);
  const void* cc = int8 || c == nullptr ? d : c;
  const cublasStatus_t status = x.matmul(x.handle, s.desc, al, a, s.a, b, s.b, be, cc, s.d, d, s.d, &s.algo, workspace,
                                         kLtWorkspaceBytes, stream);
  if (status != CUBLAS_STATUS_SUCCESS) {
    throw Error(ErrorKind::kBackend, "cuBLASLt matmul failed: " + status_text(x, status));
  }
}

}  // namespace cuda
}  // namespace renaissance
