/* Helpers for the dist tests: typed fill/read of raw buffers, and a
 * one-line "post, wait, free" with failure detail. */
#ifndef DG_TEST_COLL_UTIL_H
#define DG_TEST_COLL_UTIL_H

#include "dgrad/dist.h"
#include "tests/test.h"

static inline void put_val(void *buf, dg_dtype dt, size_t i, double v) {
  switch (dt) {
    case DG_F32: ((float *)buf)[i] = (float)v; break;
    case DG_F64: ((double *)buf)[i] = v; break;
    case DG_F16: ((uint16_t *)buf)[i] = dg_f32_to_f16((float)v); break;
    case DG_BF16: ((uint16_t *)buf)[i] = dg_f32_to_bf16((float)v); break;
    case DG_I32: ((int32_t *)buf)[i] = (int32_t)v; break;
    case DG_I64: ((int64_t *)buf)[i] = (int64_t)v; break;
    default: break;
  }
}

static inline double get_val(const void *buf, dg_dtype dt, size_t i) {
  switch (dt) {
    case DG_F32: return ((const float *)buf)[i];
    case DG_F64: return ((const double *)buf)[i];
    case DG_F16: return dg_f16_to_f32(((const uint16_t *)buf)[i]);
    case DG_BF16: return dg_bf16_to_f32(((const uint16_t *)buf)[i]);
    case DG_I32: return ((const int32_t *)buf)[i];
    case DG_I64: return (double)((const int64_t *)buf)[i];
    default: return 0;
  }
}

/* Waits for and frees a work; prints its error on failure. */
static inline int finish(dg_work *w, const char *what) {
  int rc = dg_work_wait(w, 0);
  if (rc != DG_OK) fprintf(stderr, "%s: %s: %s\n", what, dg_err_name(rc), dg_work_errmsg(w));
  dg_work_free(w);
  return rc;
}

#endif
