/* dgrad/common.h — version, status codes, dtypes, logging, allocator hook.
 *
 * Thread-safety: everything here may be called from any thread, except
 * dg_set_log_fn / dg_set_allocator, which must be called before other dgrad
 * calls (they are process-wide settings). */
#ifndef DGRAD_COMMON_H
#define DGRAD_COMMON_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* DG_API marks every public function. The library is compiled with
 * -fvisibility=hidden, so libdgrad.so exports exactly these and keeps its
 * internal dg__ functions to itself. Default visibility is harmless in a
 * consumer, so the library (DG_BUILDING) and consumers share one definition;
 * other compilers get nothing. */
#if defined(__GNUC__) || defined(__clang__)
#define DG_API __attribute__((visibility("default")))
#else
#define DG_API
#endif

#define DG_VERSION_MAJOR 0
#define DG_VERSION_MINOR 1
#define DG_VERSION_PATCH 0
#define DG_VERSION_HEX \
  ((DG_VERSION_MAJOR << 16) | (DG_VERSION_MINOR << 8) | DG_VERSION_PATCH)

/* "0.1.0"; static storage. */
DG_API const char *dg_version(void);
DG_API unsigned dg_version_hex(void);

/* Status codes: DG_OK (0) or negative; no call returns a positive status.
 * One table generates the enum, dg_strerror() and dg_err_name().
 *
 * Where a failure's detail goes (one rule for the whole API):
 *   - a call on an object leaves it in that object: dg_ctx_errmsg (ops,
 *     backward, hooks), dg_params_errmsg, dg_optim_errmsg, dg_loader_errmsg,
 *     dg_store_errmsg, dg_pg_errmsg, dg_work_errmsg, dg_ddp_errmsg;
 *   - a call with no object to hold it (constructors, file and tensor-copy
 *     calls) takes `char *err, size_t cap` last (err may be NULL);
 *   - calls whose only failures are a NULL or out-of-range argument or
 *     memory (dg_ctx_new, dg_params_new, dg_nn_* constructors, accessors)
 *     return the code alone.
 * A user's mistake is returned, never printed: the library logs only what
 * has no caller to return to (ERROR: a background update that failed; WARN:
 * a store freed while still attached, a group or DDP set-up failure whose
 * err was NULL). */
#define DG_ERRNO_MAP(X)                                            \
  X(EINVAL, -1, "invalid argument")                                \
  X(ENOMEM, -2, "out of memory")                                   \
  X(ESHAPE, -3, "shape mismatch")                                  \
  X(EDTYPE, -4, "dtype mismatch or unsupported dtype")             \
  X(EDEVICE, -5, "device mismatch or device unavailable")          \
  X(EIO, -6, "input/output error")                                 \
  X(EFORMAT, -7, "malformed file or message")                      \
  X(ENOTFOUND, -8, "not found")                                    \
  X(ETIMEDOUT, -9, "operation timed out")                          \
  X(EPEER, -10, "peer failed or disconnected")                     \
  X(ESTATE, -11, "operation not valid in the current state")       \
  X(EMISMATCH, -12, "mismatch between ranks")                      \
  X(ECLOSED, -13, "closed")                                        \
  X(EAGAIN, -14, "resource temporarily unavailable")               \
  X(EUNSUPPORTED, -15, "not supported by this build or device")   \
  X(ESYS, -16, "system call failed")

typedef enum {
  DG_OK = 0,
#define DG__ERR_ENUM(name, val, msg) DG_##name = val,
  DG_ERRNO_MAP(DG__ERR_ENUM)
#undef DG__ERR_ENUM
  DG__ERR_MIN = -17
} dg_status;

/* Static text for a code ("shape mismatch"), or "unknown error". */
DG_API const char *dg_strerror(int code);
/* Static name for a code ("DG_ESHAPE"), or "DG_UNKNOWN". */
DG_API const char *dg_err_name(int code);

/* Element types. Ops compute in f32; f16/bf16 are storage and communication
 * types (convert with dg_to_dtype or dg_tensor_copy); i32/i64 hold indices. */
typedef enum {
  DG_F32 = 0,
  DG_F16 = 1,
  DG_BF16 = 2,
  DG_I32 = 3,
  DG_I64 = 4,
  DG_F64 = 5,
  DG_NDTYPES = 6
} dg_dtype;

/* Devices: DG_CPU, or DG_CUDA + n for CUDA device n. */
#define DG_CPU 0
#define DG_CUDA 1

DG_API size_t dg_dtype_size(dg_dtype dt);
DG_API const char *dg_dtype_name(dg_dtype dt); /* "f32", ...; "?" when invalid */

/* Scalar conversions (round to nearest even). Every path (these, dg_to_dtype,
 * collectives) follows one NaN rule: a NaN becomes the canonical quiet NaN of
 * the target type with its sign kept and its payload dropped (f16 0x7e00,
 * bf16 0x7fc0, | 0x8000 when negative). PyTorch 1.13 is not consistent here
 * (its scalar bf16 path writes 0x7fc0, its vectorised one 0xffff). */
DG_API uint16_t dg_f32_to_f16(float f);
DG_API float dg_f16_to_f32(uint16_t h);
DG_API uint16_t dg_f32_to_bf16(float f);
DG_API float dg_bf16_to_f32(uint16_t h);

/* Logging. Levels as in syslog order; DG_LOG env var ("error", "warn",
 * "info", "debug") sets the threshold; default "warn". Library code logs
 * only through this; it never prints to stdout. */
typedef enum {
  DG_LOG_ERROR = 0,
  DG_LOG_WARN = 1,
  DG_LOG_INFO = 2,
  DG_LOG_DEBUG = 3
} dg_log_level;
typedef void (*dg_log_fn)(void *user, dg_log_level level, const char *msg);
/* Replace the sink (NULL restores stderr). */
DG_API void dg_set_log_fn(dg_log_fn fn, void *user);
DG_API void dg_set_log_level(dg_log_level level);
DG_API dg_log_level dg_get_log_level(void);

/* Replaceable allocator for every heap allocation dgrad makes (libuv style).
 * Pass NULLs to restore malloc/realloc/free. Returns DG_EINVAL when only some
 * are given. */
typedef void *(*dg_malloc_fn)(size_t size);
typedef void *(*dg_realloc_fn)(void *ptr, size_t size);
typedef void (*dg_free_fn)(void *ptr);
DG_API int dg_set_allocator(dg_malloc_fn m, dg_realloc_fn r, dg_free_fn f);

/* Threads used by compute kernels: dgrad's own pool splits large GEMMs and
 * element-wise loops (OpenBLAS itself always runs single-threaded), with
 * the bits of one thread: a GEMM is split only in a way that a probe on the
 * shape's first call showed gives them (OpenBLAS rounds some small blocks
 * differently), else it runs on one thread. The
 * default is 1 thread unless the environment says otherwise: the first
 * kernel that asks (or dg_set_num_threads(n <= 0)) reads DG_NUM_THREADS,
 * or OMP_NUM_THREADS when DG_NUM_THREADS is unset; a value that is not a
 * positive number gives 1. At most 64; a call made later replaces the
 * environment's value. dgrun sets OMP_NUM_THREADS=1 for several ranks
 * unless it is already set. Process-wide. */
DG_API void dg_set_num_threads(int n);
DG_API int dg_get_num_threads(void);

#ifdef __cplusplus
}
#endif
#endif /* DGRAD_COMMON_H */
