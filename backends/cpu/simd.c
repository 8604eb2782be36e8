/* Which SIMD level the CPU kernels run at (declared in cpu_impl.h). */
#include <stdlib.h>
#include <string.h>

#include "backends/cpu/cpu_impl.h"

static int g_isa = -1;

static int detect_isa(void) {
  int isa = DG_ISA_BASE;
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) isa = DG_ISA_AVX2;
  if (isa == DG_ISA_AVX2 && __builtin_cpu_supports("avx512f")) isa = DG_ISA_AVX512;
#endif
  const char *e = getenv("DG_SIMD");
  if (e) {
    int cap = !strcmp(e, "base") || !strcmp(e, "default") || !strcmp(e, "sse2") ? DG_ISA_BASE
              : !strcmp(e, "avx2")                                              ? DG_ISA_AVX2
                                                                                : DG_ISA_AVX512;
    if (cap < isa) isa = cap;
  }
  return isa;
}

int dg__simd_isa(void) {
  int isa = __atomic_load_n(&g_isa, __ATOMIC_RELAXED);
  if (isa < 0) {
    isa = detect_isa();
    __atomic_store_n(&g_isa, isa, __ATOMIC_RELAXED);
  }
  return isa;
}

void dg__simd_force(int isa) {
  int d = detect_isa();
  __atomic_store_n(&g_isa, isa < 0 || isa > d ? d : isa, __ATOMIC_RELAXED);
}

