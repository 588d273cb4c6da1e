// The codec loops compiled for the avx512 target (flags set in CMakeLists.txt).
#define MPICOMP_TARGET avx512
#define MPICOMP_TARGET_NAME "avx512"
#include "cpu_kernels.inc"
