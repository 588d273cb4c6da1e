// The codec loops compiled for the avx2 target (flags set in CMakeLists.txt).
#define MPICOMP_TARGET avx2
#define MPICOMP_TARGET_NAME "avx2"
#include "cpu_kernels.inc"
