// Fast mode's fp32 product, the baseline copy (backend_cpu/fast_product_cpu.h; its flags in
// backend_cpu/CMakeLists.txt).
#define RN_FAST_PRODUCT fast_product_baseline
#define RN_EIGEN_NAMESPACE rn_eigen_baseline
#include "backend_cpu/fast_product/fast_product-inl.h"
