// Fast mode's fp32 product, the avx512 copy (backend_cpu/fast_product_cpu.h; its flags in
// backend_cpu/CMakeLists.txt).
#define RN_FAST_PRODUCT fast_product_avx512
#define RN_EIGEN_NAMESPACE rn_eigen_avx512
#include "backend_cpu/fast_product/fast_product-inl.h"
