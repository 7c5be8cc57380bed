// Fast mode's fp32 product, the avx2 copy (backend_cpu/fast_product_cpu.h; its flags in
// backend_cpu/CMakeLists.txt).
#define RN_FAST_PRODUCT fast_product_avx2
#define RN_EIGEN_NAMESPACE rn_eigen_avx2
#include "backend_cpu/fast_product/fast_product-inl.h"
