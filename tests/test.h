/* Minimal test harness: every check prints both operands, the expression and
 * file:line, and failure is the process exit code (libuv task.h style).
 * Exit 77 means "skipped" to meson. */
#ifndef DG_TEST_H
#define DG_TEST_H

#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int dg_test_failures;

#define T_FAIL_(...)                                                  \
  do {                                                                \
    fprintf(stderr, "FAIL %s:%d: ", __FILE__, __LINE__);              \
    fprintf(stderr, __VA_ARGS__);                                     \
    fputc('\n', stderr);                                              \
    dg_test_failures++;                                               \
  } while (0)

/* Checks continue after a failure (so one run reports every problem);
 * REQUIRE stops the test. */
#define CHECK(cond) \
  do { if (!(cond)) T_FAIL_("CHECK(%s)", #cond); } while (0)
#define REQUIRE(cond)                                    \
  do {                                                   \
    if (!(cond)) {                                       \
      T_FAIL_("REQUIRE(%s)", #cond);                     \
      exit(1);                                           \
    }                                                    \
  } while (0)
#define CHECK_EQ_INT(a, b)                                                  \
  do {                                                                      \
    long long a_ = (long long)(a), b_ = (long long)(b);                     \
    if (a_ != b_) T_FAIL_("%s == %s: %lld vs %lld", #a, #b, a_, b_);        \
  } while (0)
#define CHECK_OK(expr)                                                      \
  do {                                                                      \
    int rc_ = (expr);                                                       \
    if (rc_ != 0) T_FAIL_("%s returned %d (%s)", #expr, rc_, dg_err_name(rc_)); \
  } while (0)
#define CHECK_NEAR(a, b, tol)                                               \
  do {                                                                      \
    double a_ = (double)(a), b_ = (double)(b);                              \
    if (!(fabs(a_ - b_) <= (tol)))                                          \
      T_FAIL_("%s ~= %s: %.9g vs %.9g (tol %g)", #a, #b, a_, b_, (double)(tol)); \
  } while (0)
#define CHECK_STR_HAS(s, sub)                                               \
  do {                                                                      \
    const char *s_ = (s);                                                   \
    if (!s_ || !strstr(s_, (sub)))                                          \
      T_FAIL_("\"%s\" should contain \"%s\"", s_ ? s_ : "(null)", (sub));   \
  } while (0)

/* Call at the end of main as `return TEST_DONE();`: prints a summary,
 * returns the exit code. A function whose result must be used, so that a
 * bare `TEST_DONE();` (which printed the failures and exited 0) does not
 * compile. */
__attribute__((warn_unused_result, unused)) static int dg_test_done(void) {
  if (!dg_test_failures) return fprintf(stderr, "ok\n"), 0;
  fprintf(stderr, "%d check(s) failed\n", dg_test_failures);
  return 1;
}
#define TEST_DONE() dg_test_done()

#define TEST_SKIP(why)                                                     \
  do {                                                                     \
    fprintf(stderr, "SKIP: %s\n", why);                                    \
    exit(77);                                                              \
  } while (0)

#endif
