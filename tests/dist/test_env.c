/* dg_pg_new_from_env and the ends of rendezvous (issue #16):
 *  - a bad environment fails at once with DG_EINVAL and a message naming
 *    each variable at fault and the value found;
 *  - a rendezvous that times out says which ranks never came, on every
 *    rank that started, within about the timeout;
 *  - rank 0 (the store host) may leave, even by _exit without dg_pg_free,
 *    the moment its dg_pg_new_from_env returns: no other rank is then still
 *    in its rendezvous. */
#include <string.h>

#include "dgrad/dist.h"
#include "tests/fault/fork_util.h"
#include "tests/test.h"

static const char *const ALL_VARS[] = {
    "RANK", "SLURM_PROCID", "OMPI_COMM_WORLD_RANK", "WORLD_SIZE", "SLURM_NTASKS",
    "OMPI_COMM_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "LOCAL_RANK", "SLURM_LOCALID",
    "OMPI_COMM_WORLD_LOCAL_RANK", "LOCAL_WORLD_SIZE", "SLURM_NTASKS_PER_NODE",
    "OMPI_COMM_WORLD_LOCAL_SIZE"};

/* "NAME=value" pairs, the rest of ALL_VARS unset. */
static void env_only(const char *const *set) {
  for (size_t i = 0; i < sizeof ALL_VARS / sizeof *ALL_VARS; i++) unsetenv(ALL_VARS[i]);
  for (; set && *set; set++) {
    char name[64];
    const char *eq = strchr(*set, '=');
    snprintf(name, sizeof name, "%.*s", (int)(eq - *set), *set);
    setenv(name, eq + 1, 1);
  }
}

/* Expects DG_EINVAL at once, the message holding every string of want. */
static void bad_env(const char *const *set, const char *const *want) {
  env_only(set);
  dg_pg *pg = (dg_pg *)&pg; /* must come back NULL */
  char err[1024] = "";
  int rc = dg_pg_new_from_env(&pg, 2000, err, sizeof err);
  fprintf(stderr, "%s%s: %s: %s\n", set[0] ? set[0] : "(nothing set)",
          set[0] && set[1] ? " ..." : "", dg_err_name(rc), err);
  CHECK_EQ_INT(rc, DG_EINVAL);
  CHECK(pg == NULL);
  for (; *want; want++) CHECK_STR_HAS(err, *want);
}

#define L(...) ((const char *const[]){__VA_ARGS__, NULL})

static void env_cases(void) {
  bad_env(L(NULL), L("none of RANK, SLURM_PROCID, OMPI_COMM_WORLD_RANK is set",
                     "none of WORLD_SIZE, SLURM_NTASKS, OMPI_COMM_WORLD_SIZE is set", "dgrun"));
  bad_env(L("RANK=0"), L("none of WORLD_SIZE, SLURM_NTASKS, OMPI_COMM_WORLD_SIZE is set"));
  bad_env(L("RANK=0", "WORLD_SIZE=abc"), L("WORLD_SIZE=\"abc\" is not an integer"));
  bad_env(L("RANK=2", "WORLD_SIZE=2"), L("RANK=2 is not below WORLD_SIZE=2"));
  bad_env(L("RANK=-1", "WORLD_SIZE=2"), L("RANK=-1 is out of range"));
  bad_env(L("RANK=0", "WORLD_SIZE=0"), L("WORLD_SIZE=0 is out of range"));
  bad_env(L("RANK=1x", "WORLD_SIZE=y"), L("RANK=\"1x\" is not an integer",
                                          "WORLD_SIZE=\"y\" is not an integer"));
  bad_env(L("RANK=0", "WORLD_SIZE=2", "MASTER_PORT=abc"),
          L("MASTER_PORT=\"abc\" is not an integer"));
  bad_env(L("RANK=0", "WORLD_SIZE=2", "MASTER_PORT=70000"),
          L("MASTER_PORT=70000 is out of range (0 to 65535)"));
  bad_env(L("RANK=0", "WORLD_SIZE=2", "MASTER_PORT=0"), L("MASTER_PORT=0", "WORLD_SIZE=2"));
  bad_env(L("SLURM_PROCID=3", "SLURM_NTASKS=2"), L("SLURM_PROCID=3 is not below SLURM_NTASKS=2"));
  bad_env(L("OMPI_COMM_WORLD_RANK=0", "OMPI_COMM_WORLD_SIZE=two"),
          L("OMPI_COMM_WORLD_SIZE=\"two\" is not an integer"));
  bad_env(L("RANK=0", "WORLD_SIZE=1", "LOCAL_RANK=first"),
          L("LOCAL_RANK=\"first\" is not an integer"));

  /* NULL err: the same failure, logged instead */
  env_only(L("RANK=5", "WORLD_SIZE=2"));
  dg_pg *pg = NULL;
  CHECK_EQ_INT(dg_pg_new_from_env(&pg, 1000, NULL, 0), DG_EINVAL);
  CHECK_EQ_INT(dg_pg_new_from_env(NULL, 1000, NULL, 0), DG_EINVAL);

  /* a group of one on any free port, local rank and size from the environment */
  env_only(L("RANK=0", "WORLD_SIZE=1", "MASTER_PORT=0", "LOCAL_RANK=0", "LOCAL_WORLD_SIZE=1"));
  char err[512] = "";
  int rc = dg_pg_new_from_env(&pg, 5000, err, sizeof err);
  if (rc != DG_OK) fprintf(stderr, "group of one: %s\n", err);
  CHECK_OK(rc);
  CHECK_EQ_INT(dg_pg_size(pg), 1);
  CHECK_EQ_INT(dg_pg_local_size(pg), 1);
  dg_pg_free(pg);
}

/* Starts the ranks of `world` flagged in `start` (the others never come);
 * each must fail its rendezvous with DG_ETIMEDOUT after about timeout_ms,
 * its message holding `want`. */
static int g_timeout_ms;
static const char *g_want;

static int late_rank(int r, int world) {
  char err[1024] = "";
  dg_pg *pg = NULL;
  struct timespec t0;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  int rc = dg_pg_new_from_env(&pg, g_timeout_ms, err, sizeof err);
  double ms = fu_ms_since(&t0);
  fprintf(stderr, "world %d, rank %d: %s after %.0f ms: %s\n", world, r, dg_err_name(rc), ms, err);
  if (rc != DG_ETIMEDOUT || pg) return 20;
  if (!strstr(err, g_want)) return 21;
  if (ms < g_timeout_ms * 0.9 || ms > g_timeout_ms + 4000.0) return 22;
  return 0;
}

static void timeout_case(int world, const char *start, int timeout_ms, const char *want) {
  env_only(L(NULL));
  g_timeout_ms = timeout_ms;
  g_want = want;
  char ps[16], ws[16];
  snprintf(ps, sizeof ps, "%d", fu_free_port());
  snprintf(ws, sizeof ws, "%d", world);
  pid_t pid[16];
  int n = 0, ranks[16];
  for (int r = 0; r < world; r++) {
    if (start[r] != '1') continue;
    ranks[n] = r;
    if ((pid[n++] = fork()) == 0) {
      char rs[16];
      snprintf(rs, sizeof rs, "%d", r);
      setenv("MASTER_PORT", ps, 1);
      setenv("RANK", rs, 1);
      setenv("WORLD_SIZE", ws, 1);
      _exit(late_rank(r, world));
    }
  }
  int st[16];
  fu_reap(n, pid, timeout_ms / 1000 + 20, st);
  for (int i = 0; i < n; i++) {
    int code = st[i] != -1 && WIFEXITED(st[i]) ? WEXITSTATUS(st[i]) : -1;
    if (code)
      T_FAIL_("world %d (started %s), rank %d: exit %d, want 0", world, start, ranks[i], code);
  }
}

/* Rank 0 leaves by _exit the moment it has joined; the others must join. */
static int hasty_rank(int r, int world) {
  (void)world;
  char err[1024] = "";
  dg_pg *pg = NULL;
  int rc = dg_pg_new_from_env(&pg, 20000, err, sizeof err);
  if (rc != DG_OK) {
    fprintf(stderr, "rank %d: %s: %s\n", r, dg_err_name(rc), err);
    return 30;
  }
  if (r == 0) _exit(0);
  dg_pg_free(pg);
  return 0;
}

int main(void) {
  env_cases();
  timeout_case(3, "101", 1500, "rank 1 of 3 did not join within 1500 ms");
  timeout_case(4, "1010", 1500, "ranks 1, 3 of 4 did not join within 1500 ms");
  timeout_case(2, "01", 1000, "rank 1: rank 0 did not come up within 1000 ms");
  for (int world = 2; world <= 3; world++)
    for (int i = 0; i < 25; i++) {
      env_only(L(NULL));
      int st[3];
      fu_run(world, hasty_rank, 30, st);
      for (int r = 0; r < world; r++) {
        int code = st[r] != -1 && WIFEXITED(st[r]) ? WEXITSTATUS(st[r]) : -1;
        if (code) T_FAIL_("hasty rank 0, world %d, run %d: rank %d exit %d", world, i, r, code);
      }
    }
  return TEST_DONE();
}
