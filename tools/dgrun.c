/* dgrun: launch N local ranks of a distributed program with the torchrun
 * environment, prefix their output with the rank, tear the group down when
 * one rank fails, and optionally restart the whole group.
 *
 * Single-threaded: one poll loop over the ranks' stdout/stderr pipes and a
 * self-pipe fed by the signal handlers (SIGCHLD and the signals we forward).
 * Every wait has a deadline, so dgrun never hangs on a rank that ignores
 * SIGTERM or on a grandchild that keeps a pipe open. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#ifdef __linux__
#include <sys/prctl.h>
#endif
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "tools/dgrun_trace.h"

#define MAX_NPROC 4096
#define READ_CHUNK 65536
#define MAX_LINE (1u << 20) /* longer lines are split, so memory stays bounded */
#define DRAIN_MS 1000       /* how long to wait for grandchildren's output */
#define REAP_MS 5000        /* how long to wait after SIGKILL before giving up */

typedef struct {
  int nproc, nnodes, node_rank;
  const char *master_addr;
  int master_port; /* 0: pick a free one per (re)start */
  int max_restarts;
  double grace_s;
  const char *trace; /* --trace FILE, or NULL */
  char **argv; /* program and its arguments */
} opts_t;

typedef struct {
  int fd; /* -1 once closed */
  int out_fd; /* dgrun's 1 or 2 */
  char *buf;
  size_t len, cap;
} stream_t;

typedef struct {
  pid_t pid;
  int rank;
  int alive;
  int status; /* wait status once reaped */
  int stopped_by;     /* signal that stopped it (SIGSTOP, SIGTSTP...), or 0 */
  int64_t stopped_at; /* when */
  char prefix[32]; /* "[rank 3] " */
  stream_t out, err;
} rank_t;

typedef struct {
  rank_t *r;
  int n;
  int stopping;      /* teardown started */
  int killed;        /* SIGKILL sent */
  int64_t kill_at;   /* when to send SIGKILL */
  int64_t give_up_at; /* when to stop waiting for unkillable ranks */
  int failed;        /* index of the first failing rank, or -1 */
  int spawn_failed;  /* fork or exec failed: no point restarting */
  int got_signal;    /* signal dgrun received, or 0 */
  int64_t signal_at; /* when it arrived */
} group_t;

/* Outcome of one run of the group. */
enum { RUN_OK, RUN_RANK_FAILED, RUN_SIGNALED, RUN_SPAWN_FAILED };

static int sig_pipe[2] = {-1, -1};
static const int fwd_signals[] = {SIGINT, SIGTERM, SIGHUP, SIGQUIT};
#define N_FWD ((int)(sizeof fwd_signals / sizeof fwd_signals[0]))
/* Signals ignored when dgrun started (nohup, `dgrun &` in a script) stay
 * ignored, in dgrun and in the ranks, as the shell convention expects. */
static int fwd_ignored[N_FWD];

/* ---- small utilities ---- */

static int64_t now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static void write_all(int fd, const char *p, size_t n) {
  while (n > 0) {
    ssize_t w = write(fd, p, n);
    if (w < 0 && errno == EINTR) continue;
    if (w < 0 && errno == EAGAIN) { /* nonblocking terminal: wait a bit */
      struct pollfd pfd = {.fd = fd, .events = POLLOUT};
      poll(&pfd, 1, 100);
      continue;
    }
    if (w <= 0) return; /* EPIPE etc.: output is gone, keep supervising */
    p += w;
    n -= (size_t)w;
  }
}

/* dgrun's own messages: formatted first so each is one write (never split
 * by a rank's line). */
static void msg(const char *fmt, ...) {
  char b[1024];
  int k = snprintf(b, sizeof b, "dgrun: ");
  va_list ap;
  va_start(ap, fmt);
  int m = vsnprintf(b + k, sizeof b - (size_t)k - 1, fmt, ap);
  va_end(ap);
  size_t len = (size_t)k + (m < 0 ? 0 : (size_t)m);
  if (len > sizeof b - 2) len = sizeof b - 2;
  b[len++] = '\n';
  write_all(2, b, len);
}

static const char *sig_name(int sig) {
  static const struct { int sig; const char *name; } t[] = {
      {SIGHUP, "SIGHUP"},   {SIGINT, "SIGINT"},   {SIGQUIT, "SIGQUIT"},
      {SIGILL, "SIGILL"},   {SIGTRAP, "SIGTRAP"}, {SIGABRT, "SIGABRT"},
      {SIGBUS, "SIGBUS"},   {SIGFPE, "SIGFPE"},   {SIGKILL, "SIGKILL"},
      {SIGUSR1, "SIGUSR1"}, {SIGSEGV, "SIGSEGV"}, {SIGUSR2, "SIGUSR2"},
      {SIGPIPE, "SIGPIPE"}, {SIGALRM, "SIGALRM"}, {SIGTERM, "SIGTERM"},
      {SIGXCPU, "SIGXCPU"}, {SIGXFSZ, "SIGXFSZ"}, {SIGSYS, "SIGSYS"},
      {SIGSTOP, "SIGSTOP"}, {SIGTSTP, "SIGTSTP"}, {SIGTTIN, "SIGTTIN"},
      {SIGTTOU, "SIGTTOU"},
  };
  for (size_t i = 0; i < sizeof t / sizeof t[0]; i++)
    if (t[i].sig == sig) return t[i].name;
  return "unknown signal";
}

/* "exited with status 3" / "was killed by signal 9 (SIGKILL)" */
static void describe_status(int st, char *b, size_t n) {
  if (WIFEXITED(st))
    snprintf(b, n, "exited with status %d", WEXITSTATUS(st));
  else if (WIFSIGNALED(st))
    snprintf(b, n, "was killed by signal %d (%s)%s", WTERMSIG(st),
             sig_name(WTERMSIG(st)), WCOREDUMP(st) ? ", core dumped" : "");
  else
    snprintf(b, n, "ended with wait status 0x%x", (unsigned)st);
}

static int status_exit_code(int st) {
  if (WIFEXITED(st)) return WEXITSTATUS(st) ? WEXITSTATUS(st) : 1;
  if (WIFSIGNALED(st)) return 128 + WTERMSIG(st);
  return 1;
}

/* ---- command line ---- */

static void usage(FILE *f) {
  fputs(
      "usage: dgrun [options] [--] program [args...]\n"
      "\n"
      "Runs nproc-per-node copies of program (the ranks of one node) with the\n"
      "torchrun environment and supervises them.\n"
      "\n"
      "options (also accepted as --opt=value and with '_' for '-'):\n"
      "  --nproc-per-node N   ranks on this node (default 1)\n"
      "  --nnodes M           number of nodes (default 1)\n"
      "  --node-rank I        this node's index, 0..M-1 (default 0)\n"
      "  --master-addr A      address of rank 0's store (default 127.0.0.1)\n"
      "  --master-port P      its port; default: a free port picked by binding\n"
      "                       port 0 on A, fresh on every restart (required\n"
      "                       when --nnodes > 1)\n"
      "  --max-restarts K     restart the whole group up to K times after a\n"
      "                       failure (default 0)\n"
      "  --grace-seconds S    after SIGTERM, wait S seconds before SIGKILL\n"
      "                       (default 5; fractions allowed)\n"
      "  --trace FILE         set DG_TRACE=FILE.rank<R> in rank R and, when the\n"
      "                       ranks end, merge their timelines into FILE (Chrome\n"
      "                       trace JSON, one track per rank; docs/guide-trace.md)\n"
      "  --standalone         accepted for torchrun compatibility (single node)\n"
      "  -h, --help           show this help\n"
      "\n"
      "environment of each rank:\n"
      "  RANK WORLD_SIZE LOCAL_RANK LOCAL_WORLD_SIZE GROUP_RANK GROUP_WORLD_SIZE\n"
      "  ROLE_RANK ROLE_WORLD_SIZE MASTER_ADDR MASTER_PORT\n"
      "  DG_RESTART_COUNT and TORCHELASTIC_RESTART_COUNT (0, then 1, 2, ...)\n"
      "  TORCHELASTIC_MAX_RESTARTS; OMP_NUM_THREADS=1 when unset and N > 1\n"
      "  (as torchrun does, so BLAS threads do not oversubscribe the cores).\n"
      "  DG_FLIGHT_DIR, when unset: $TMPDIR/dgrun-flight.<dgrun pid>.<start>\n"
      "  (default /tmp); after a rank failed, dgrun names that directory if a\n"
      "  process group wrote its flight records there (rank<R>.txt).\n"
      "  Ranks read stdin from /dev/null.\n"
      "\n"
      "output: every line a rank writes is printed as \"[rank R] line\" (R the\n"
      "global rank), its stdout on dgrun's stdout and its stderr on dgrun's\n"
      "stderr. Lines are written whole, never interleaved; a last line without\n"
      "newline gets one; lines over 1 MiB are split. dgrun's own messages go\n"
      "to stderr and start with \"dgrun: \".\n"
      "\n"
      "failure: when a rank exits non-zero or is killed by a signal, dgrun\n"
      "names it (\"rank 1 (pid 1234) exited with status 3\"), sends SIGTERM to\n"
      "the other ranks (their process groups), SIGKILL after the grace period,\n"
      "and restarts or exits. A rank stopped by a signal (SIGSTOP) is named\n"
      "when it stops and again when another rank fails (which probably timed\n"
      "out waiting for it); the teardown's SIGTERM to it is followed by\n"
      "SIGCONT, so that it can act on it. SIGINT, SIGTERM, SIGHUP and SIGQUIT sent to dgrun\n"
      "are forwarded to the ranks, followed by the same teardown (the signal\n"
      "repeated a second or more later sends SIGKILL at once); they are never\n"
      "followed by a restart. Signals ignored when dgrun starts (nohup, a\n"
      "background job of a script) stay ignored, in dgrun and in the ranks.\n"
      "If dgrun itself is killed with SIGKILL, the kernel kills the ranks\n"
      "(Linux: PR_SET_PDEATHSIG). A program using dgrad/run.h (dg_stop_install,\n"
      "dg_stop_agree) finishes its step on every rank, saves a checkpoint and\n"
      "exits 0 within the grace period: set --grace-seconds above a step plus\n"
      "a save. Ranks that all exit 0 (a signal sent to one rank alone) end the\n"
      "run with status 0 and no restart.\n"
      "\n"
      "exit status: 0 when every rank exited 0; the failing rank's exit status,\n"
      "or 128+N when it was killed by signal N; 128+N when dgrun got signal N;\n"
      "127 when program cannot be executed; 2 for usage errors.\n",
      f);
}

static _Noreturn void usage_error(const char *fmt, ...) {
  char b[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(b, sizeof b, fmt, ap);
  va_end(ap);
  fprintf(stderr, "dgrun: %s\nTry 'dgrun --help' for more information.\n", b);
  exit(2);
}

static int parse_int(const char *flag, const char *s, long lo, long hi) {
  char *end;
  errno = 0;
  long v = strtol(s, &end, 10);
  if (*s == '\0' || *end != '\0' || errno || v < lo || v > hi)
    usage_error("%s: expected an integer in [%ld, %ld], got '%s'", flag, lo,
                hi, s);
  return (int)v;
}

static double parse_seconds(const char *flag, const char *s) {
  char *end;
  errno = 0;
  double v = strtod(s, &end);
  if (*s == '\0' || *end != '\0' || errno || !(v >= 0 && v <= 86400))
    usage_error("%s: expected seconds in [0, 86400], got '%s'", flag, s);
  return v;
}

/* "--nproc_per_node=4" -> name "nproc-per-node", value "4". */
static void split_flag(const char *arg, char *name, size_t n,
                       const char **value) {
  const char *eq = strchr(arg, '=');
  size_t len = eq ? (size_t)(eq - arg) : strlen(arg);
  if (len >= n) len = n - 1;
  for (size_t i = 0; i < len; i++) name[i] = arg[i] == '_' ? '-' : arg[i];
  name[len] = '\0';
  *value = eq ? eq + 1 : NULL;
}

static void set_opt(opts_t *o, const char *name, const char *v) {
  if (!strcmp(name, "--nproc-per-node"))
    o->nproc = parse_int(name, v, 1, MAX_NPROC);
  else if (!strcmp(name, "--nnodes"))
    o->nnodes = parse_int(name, v, 1, 1 << 20);
  else if (!strcmp(name, "--node-rank"))
    o->node_rank = parse_int(name, v, 0, (1 << 20) - 1);
  else if (!strcmp(name, "--master-addr"))
    o->master_addr = v;
  else if (!strcmp(name, "--master-port"))
    o->master_port = parse_int(name, v, 0, 65535);
  else if (!strcmp(name, "--max-restarts"))
    o->max_restarts = parse_int(name, v, 0, 1000000);
  else if (!strcmp(name, "--grace-seconds"))
    o->grace_s = parse_seconds(name, v);
  else if (!strcmp(name, "--trace")) {
    if (!*v) usage_error("--trace: empty file name");
    o->trace = v;
  }
  else
    usage_error("unknown option '%s'", name);
}

static void parse_args(int argc, char **argv, opts_t *o) {
  *o = (opts_t){.nproc = 1, .nnodes = 1, .master_addr = "127.0.0.1",
                .grace_s = 5.0};
  int i = 1;
  for (; i < argc && argv[i][0] == '-'; i++) {
    const char *a = argv[i], *v;
    char name[64];
    if (!strcmp(a, "--")) { i++; break; }
    if (!strcmp(a, "-h") || !strcmp(a, "--help")) { usage(stdout); exit(0); }
    if (a[1] != '-') usage_error("unknown option '%s'", a);
    split_flag(a, name, sizeof name, &v);
    if (!strcmp(name, "--standalone")) {
      if (v) usage_error("--standalone takes no value");
      continue;
    }
    if (!v) {
      if (i + 1 >= argc) usage_error("%s needs a value", name);
      v = argv[++i];
    }
    set_opt(o, name, v);
  }
  if (i >= argc) usage_error("no program given");
  if (o->node_rank >= o->nnodes)
    usage_error("--node-rank %d must be less than --nnodes %d", o->node_rank,
                o->nnodes);
  if (o->nnodes > 1 && o->master_port == 0)
    usage_error("--master-port is required when --nnodes > 1 (every node "
                "must agree on it)");
  if (o->master_addr[0] == '\0') usage_error("--master-addr is empty");
  if ((long)o->nnodes * o->nproc > INT_MAX / 2)
    usage_error("world size %ld is too large", (long)o->nnodes * o->nproc);
  o->argv = argv + i;
}

/* ---- free port ---- */

/* Binds port 0 on addr (or on the wildcard if addr is not local) and returns
 * the port the kernel chose, or -1. The port is free now; rank 0 will bind it
 * moments later, a small race torchrun has too. */
static int pick_port(const char *addr) {
  const char *hosts[] = {addr, NULL};
  for (int h = 0; h < 2; h++) {
    struct addrinfo hints = {.ai_socktype = SOCK_STREAM,
                             .ai_flags = AI_PASSIVE}, *res = NULL;
    if (getaddrinfo(hosts[h], "0", &hints, &res) != 0) continue;
    for (struct addrinfo *ai = res; ai; ai = ai->ai_next) {
      int fd = socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, 0);
      if (fd < 0) continue;
      struct sockaddr_storage ss;
      socklen_t sl = sizeof ss;
      int port = -1;
      if (bind(fd, ai->ai_addr, ai->ai_addrlen) == 0 &&
          getsockname(fd, (struct sockaddr *)&ss, &sl) == 0)
        port = ss.ss_family == AF_INET6
                   ? ntohs(((struct sockaddr_in6 *)&ss)->sin6_port)
                   : ntohs(((struct sockaddr_in *)&ss)->sin_port);
      close(fd);
      if (port > 0) { freeaddrinfo(res); return port; }
    }
    freeaddrinfo(res);
  }
  return -1;
}

/* ---- signals ---- */

static void on_signal(int sig) {
  int saved = errno;
  unsigned char c = (unsigned char)sig;
  ssize_t w = write(sig_pipe[1], &c, 1); /* full pipe: a wakeup is pending */
  (void)w;
  errno = saved;
}

static void install_handlers(void) {
  if (pipe2(sig_pipe, O_CLOEXEC | O_NONBLOCK) != 0) {
    msg("pipe: %s", strerror(errno));
    exit(1);
  }
  struct sigaction sa = {.sa_handler = on_signal};
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = 0; /* SIGCHLD on stop and continue too: a stopped rank is named */
  sigaction(SIGCHLD, &sa, NULL);
  for (int i = 0; i < N_FWD; i++) {
    struct sigaction old;
    sigaction(fwd_signals[i], NULL, &old);
    fwd_ignored[i] = old.sa_handler == SIG_IGN;
    if (!fwd_ignored[i]) sigaction(fwd_signals[i], &sa, NULL);
  }
  signal(SIGPIPE, SIG_IGN); /* a closed stdout must not kill the supervisor */
}

static void block_signals(int how) {
  sigset_t s;
  sigemptyset(&s);
  sigaddset(&s, SIGCHLD);
  for (int i = 0; i < N_FWD; i++) sigaddset(&s, fwd_signals[i]);
  sigprocmask(how, &s, NULL);
}

/* Signals the rank's whole process group, so that `sh -c 'x; y'` style
 * wrappers do not leave grandchildren running (and holding our pipes). */
static void signal_rank(rank_t *r, int sig) {
  if (r->pid > 0 && kill(-r->pid, sig) != 0 && r->alive) kill(r->pid, sig);
  /* a stopped rank would hold a catchable signal until SIGKILL: let it act */
  if (r->stopped_by && sig != SIGKILL && r->pid > 0 && kill(-r->pid, SIGCONT) != 0 && r->alive)
    kill(r->pid, SIGCONT);
}

/* ---- output streams ---- */

static char *stage; /* staging buffer: all lines of one read, one write() */
static size_t stage_len, stage_cap;

static void stage_put(const char *p, size_t n) {
  if (stage_len + n > stage_cap) {
    size_t cap = stage_cap ? stage_cap : 65536;
    while (cap < stage_len + n) cap *= 2;
    char *b = realloc(stage, cap);
    if (!b) { msg("out of memory"); exit(1); }
    stage = b;
    stage_cap = cap;
  }
  memcpy(stage + stage_len, p, n);
  stage_len += n;
}

/* Writes every complete line of s with the prefix; with `final` also the
 * unterminated rest (plus a newline, so the next rank's line starts on its
 * own line). A line that fills MAX_LINE is split rather than buffered on. */
static void stream_emit(stream_t *s, const char *prefix, int final) {
  size_t start = 0, plen = strlen(prefix);
  stage_len = 0;
  while (start < s->len) {
    char *nl = memchr(s->buf + start, '\n', s->len - start);
    size_t end;
    if (nl)
      end = (size_t)(nl - s->buf) + 1;
    else if (final || (start == 0 && s->len >= MAX_LINE))
      end = s->len;
    else
      break;
    stage_put(prefix, plen);
    stage_put(s->buf + start, end - start);
    if (!nl) stage_put("\n", 1);
    start = end;
  }
  write_all(s->out_fd, stage, stage_len);
  memmove(s->buf, s->buf + start, s->len - start);
  s->len -= start;
}

static void stream_close(stream_t *s, const char *prefix) {
  if (s->fd < 0) return;
  close(s->fd);
  s->fd = -1;
  stream_emit(s, prefix, 1);
}

/* Reads what the pipe holds (once, or until it would block when `drain`),
 * emitting complete lines; closes the stream at EOF. */
static void stream_pump(stream_t *s, const char *prefix, int drain) {
  while (s->fd >= 0) {
    if (s->len == s->cap) {
      size_t cap = s->cap * 2 > MAX_LINE ? MAX_LINE : s->cap * 2;
      char *b = realloc(s->buf, cap);
      if (!b) { msg("out of memory"); exit(1); }
      s->buf = b;
      s->cap = cap;
    }
    ssize_t k = read(s->fd, s->buf + s->len, s->cap - s->len);
    if (k < 0 && errno == EINTR) continue;
    if (k < 0 && errno == EAGAIN) return;
    if (k <= 0) { stream_close(s, prefix); return; }
    s->len += (size_t)k;
    stream_emit(s, prefix, 0);
    if (!drain) return;
  }
}

/* ---- spawning ---- */

static void setenv_int(const char *name, long v) {
  char b[32];
  snprintf(b, sizeof b, "%ld", v);
  setenv(name, b, 1);
}

/* In the child: own process group, default signal state, pipes as 1 and 2,
 * the torchrun environment, exec. On exec failure the errno goes back to the
 * parent through err_fd (close-on-exec, so success closes it silently). */
static _Noreturn void child_exec(const opts_t *o, int local, int port,
                                 int restart, const int fds[3], pid_t parent) {
  setpgid(0, 0);
#ifdef __linux__
  /* If dgrun itself is SIGKILLed, its ranks must not live on unsupervised. */
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (getppid() != parent) _exit(127); /* it died before the prctl */
#else
  (void)parent;
#endif
  signal(SIGCHLD, SIG_DFL);
  signal(SIGPIPE, SIG_DFL);
  for (int i = 0; i < N_FWD; i++)
    if (!fwd_ignored[i]) signal(fwd_signals[i], SIG_DFL);
  block_signals(SIG_UNBLOCK);
  int null_fd = open("/dev/null", O_RDONLY);
  if (null_fd >= 0) dup2(null_fd, 0);
  dup2(fds[0], 1);
  dup2(fds[1], 2);
  setenv_int("RANK", (long)o->node_rank * o->nproc + local);
  setenv_int("WORLD_SIZE", (long)o->nnodes * o->nproc);
  setenv_int("LOCAL_RANK", local);
  setenv_int("LOCAL_WORLD_SIZE", o->nproc);
  setenv_int("GROUP_RANK", o->node_rank);
  setenv_int("GROUP_WORLD_SIZE", o->nnodes);
  setenv_int("ROLE_RANK", (long)o->node_rank * o->nproc + local);
  setenv_int("ROLE_WORLD_SIZE", (long)o->nnodes * o->nproc);
  setenv("MASTER_ADDR", o->master_addr, 1);
  setenv_int("MASTER_PORT", port);
  setenv_int("DG_RESTART_COUNT", restart);
  setenv_int("TORCHELASTIC_RESTART_COUNT", restart);
  setenv_int("TORCHELASTIC_MAX_RESTARTS", o->max_restarts);
  if (o->trace) {
    char tp[4200];
    dgrun_trace_path(tp, sizeof tp, o->trace, (int)((long)o->node_rank * o->nproc + local));
    setenv("DG_TRACE", tp, 1);
    unlink(tp); /* an earlier run's file must not pass for this one's */
  }
  execvp(o->argv[0], o->argv);
  int e = errno;
  ssize_t w = write(fds[2], &e, sizeof e);
  (void)w;
  _exit(127);
}

static int stream_init(stream_t *s, int fd, int out_fd) {
  *s = (stream_t){.fd = fd, .out_fd = out_fd, .cap = 4096};
  s->buf = malloc(s->cap);
  return s->buf ? 0 : -1;
}

/* Starts local rank i. Returns 0, or -1 after printing why (with errno of a
 * failed exec in *exec_errno). */
static int spawn_rank(const opts_t *o, group_t *g, int i, int port,
                      int restart, int *exec_errno) {
  rank_t *r = &g->r[i];
  int out[2], err[2], ex[2];
  *exec_errno = 0;
  if (pipe2(out, O_CLOEXEC) || pipe2(err, O_CLOEXEC) || pipe2(ex, O_CLOEXEC)) {
    msg("pipe: %s", strerror(errno));
    return -1;
  }
  r->rank = o->node_rank * o->nproc + i;
  snprintf(r->prefix, sizeof r->prefix, "[rank %d] ", r->rank);
  block_signals(SIG_BLOCK); /* the child must not run our handlers */
  pid_t parent = getpid(), pid = fork();
  if (pid == 0)
    child_exec(o, i, port, restart, (int[3]){out[1], err[1], ex[1]}, parent);
  int fork_errno = errno;
  block_signals(SIG_UNBLOCK);
  close(out[1]);
  close(err[1]);
  close(ex[1]);
  if (pid < 0) {
    msg("fork: %s", strerror(fork_errno));
    close(out[0]), close(err[0]), close(ex[0]);
    return -1;
  }
  setpgid(pid, pid); /* also in the child: whoever runs first wins the race */
  r->pid = pid;
  r->alive = 1;
  fcntl(out[0], F_SETFL, O_NONBLOCK);
  fcntl(err[0], F_SETFL, O_NONBLOCK);
  if (stream_init(&r->out, out[0], 1) || stream_init(&r->err, err[0], 2)) {
    msg("out of memory");
    exit(1);
  }
  /* Blocks only until the child execs or fails to: no user code runs. */
  ssize_t k;
  do k = read(ex[0], exec_errno, sizeof *exec_errno);
  while (k < 0 && errno == EINTR);
  close(ex[0]);
  if (k == (ssize_t)sizeof *exec_errno) {
    msg("cannot execute '%s': %s", o->argv[0], strerror(*exec_errno));
    return -1;
  }
  *exec_errno = 0;
  return 0;
}

/* ---- supervising the group ---- */

static int count_alive(const group_t *g) {
  int k = 0;
  for (int i = 0; i < g->n; i++) k += g->r[i].alive;
  return k;
}

/* Starts the teardown: `sig` to every live rank now, SIGKILL at the end of
 * the grace period. */
static void start_stop(group_t *g, const opts_t *o, int sig) {
  if (g->stopping) return;
  g->stopping = 1;
  g->kill_at = now_ms() + (int64_t)(o->grace_s * 1000.0);
  for (int i = 0; i < g->n; i++)
    if (g->r[i].alive) signal_rank(&g->r[i], sig);
}

static void kill_all(group_t *g, const opts_t *o, int why_grace) {
  for (int i = 0; i < g->n; i++) {
    rank_t *r = &g->r[i];
    if (!r->alive) continue;
    if (why_grace)
      msg("rank %d (pid %d) still running %g s after SIGTERM; sending SIGKILL",
          r->rank, (int)r->pid, o->grace_s);
    signal_rank(r, SIGKILL);
  }
  g->stopping = 1;
  g->killed = 1;
  g->give_up_at = now_ms() + REAP_MS;
}

static void on_rank_exit(group_t *g, const opts_t *o, int i) {
  rank_t *r = &g->r[i];
  if (WIFEXITED(r->status) && WEXITSTATUS(r->status) == 0) return;
  if (g->failed >= 0 || g->got_signal || g->stopping) return;
  char how[128];
  describe_status(r->status, how, sizeof how);
  msg("rank %d (pid %d) %s", r->rank, (int)r->pid, how);
  for (int k = 0; k < g->n; k++) /* what the failing rank probably waited for */
    if (g->r[k].alive && g->r[k].stopped_by)
      msg("rank %d (pid %d) has been stopped by signal %d (%s) for %.1f s: the other ranks "
          "probably timed out waiting for it", g->r[k].rank, (int)g->r[k].pid,
          g->r[k].stopped_by, sig_name(g->r[k].stopped_by),
          (double)(now_ms() - g->r[k].stopped_at) / 1000.0);
  g->failed = i;
  int others = count_alive(g);
  if (others > 0)
    msg("stopping the other %d rank(s): SIGTERM, SIGKILL after %g s", others,
        o->grace_s);
  start_stop(g, o, SIGTERM);
}

/* A rank stopped (SIGSTOP, SIGTSTP...) or continued: said once each way. */
static void note_stop(rank_t *r, int st) {
  if (WIFSTOPPED(st) && !r->stopped_by) {
    r->stopped_by = WSTOPSIG(st);
    r->stopped_at = now_ms();
    msg("rank %d (pid %d) was stopped by signal %d (%s)", r->rank, (int)r->pid,
        r->stopped_by, sig_name(r->stopped_by));
  } else if (WIFCONTINUED(st) && r->stopped_by) {
    r->stopped_by = 0;
    msg("rank %d (pid %d) continued", r->rank, (int)r->pid);
  }
}

static void reap(group_t *g, const opts_t *o) {
  for (;;) {
    int st;
    pid_t pid = waitpid(-1, &st, WNOHANG | WUNTRACED | WCONTINUED);
    if (pid <= 0) return;
    for (int i = 0; i < g->n; i++) {
      rank_t *r = &g->r[i];
      if (r->pid != pid || !r->alive) continue;
      if (WIFSTOPPED(st) || WIFCONTINUED(st)) {
        note_stop(r, st);
        continue;
      }
      r->alive = 0;
      r->status = st;
      /* Print what it wrote before saying how it ended. */
      stream_pump(&r->out, r->prefix, 1);
      stream_pump(&r->err, r->prefix, 1);
      on_rank_exit(g, o, i);
    }
  }
}

/* A signal to dgrun: forwarded to the ranks, then the usual teardown. The
 * same signal often arrives twice at once (timeout(1) and other supervisors
 * signal both us and our process group), so only a repeat at least 1 s later
 * means "hurry up" and sends SIGKILL. */
static void on_dgrun_signal(group_t *g, const opts_t *o, int sig) {
  int64_t now = now_ms();
  if (!g->got_signal) {
    g->got_signal = sig;
    g->signal_at = now;
    msg("received %s; forwarding it to the ranks, SIGKILL after %g s",
        sig_name(sig), o->grace_s);
    if (g->stopping) { /* already tearing down after a failure */
      for (int i = 0; i < g->n; i++)
        if (g->r[i].alive) signal_rank(&g->r[i], sig);
    }
    start_stop(g, o, sig);
    return;
  }
  if (g->killed || now - g->signal_at < 1000) return;
  msg("received %s again; sending SIGKILL to the ranks", sig_name(sig));
  kill_all(g, o, 0);
}

static void read_sig_pipe(group_t *g, const opts_t *o) {
  unsigned char b[64];
  ssize_t k;
  while ((k = read(sig_pipe[0], b, sizeof b)) > 0)
    for (ssize_t j = 0; j < k; j++)
      if (b[j] != SIGCHLD) on_dgrun_signal(g, o, b[j]);
  reap(g, o); /* SIGCHLD or not: cheap, and robust to coalesced signals */
}

/* Poll timeout: until the next deadline, at most 1 s (a safety net). */
static int poll_timeout(const group_t *g) {
  int64_t t = 1000, now = now_ms();
  if (g->stopping && !g->killed) t = g->kill_at - now;
  if (g->killed) t = g->give_up_at - now;
  if (t > 1000) t = 1000;
  return t < 0 ? 0 : (int)t;
}

/* Polls every open stream, and the signal pipe when with_sig; pumps what is
 * readable. pf and ps have room for 2n+1 entries. */
static void poll_once(group_t *g, const opts_t *o, struct pollfd *pf,
                      stream_t **ps, rank_t **pr, int with_sig, int timeout) {
  int n = 0;
  if (with_sig) pf[n++] = (struct pollfd){.fd = sig_pipe[0], .events = POLLIN};
  for (int i = 0; i < g->n; i++) {
    stream_t *s[2] = {&g->r[i].out, &g->r[i].err};
    for (int j = 0; j < 2; j++) {
      if (s[j]->fd < 0) continue;
      ps[n] = s[j];
      pr[n] = &g->r[i];
      pf[n++] = (struct pollfd){.fd = s[j]->fd, .events = POLLIN};
    }
  }
  if (n == 0) return;
  if (poll(pf, (nfds_t)n, timeout) <= 0) return;
  for (int k = with_sig ? 1 : 0; k < n; k++)
    if (pf[k].revents) stream_pump(ps[k], pr[k]->prefix, 0);
  if (with_sig && pf[0].revents) read_sig_pipe(g, o);
}

/* After the ranks are gone, their pipes may still be held open by
 * grandchildren: read for at most DRAIN_MS, then close whatever is left. */
static void drain_streams(group_t *g, const opts_t *o, struct pollfd *pf,
                          stream_t **ps, rank_t **pr) {
  int64_t end = now_ms() + DRAIN_MS;
  for (int64_t t; (t = end - now_ms()) > 0;) {
    int open = 0;
    for (int i = 0; i < g->n; i++) open += g->r[i].out.fd >= 0 || g->r[i].err.fd >= 0;
    if (!open) break;
    poll_once(g, o, pf, ps, pr, 0, (int)t);
  }
  for (int i = 0; i < g->n; i++) {
    stream_close(&g->r[i].out, g->r[i].prefix);
    stream_close(&g->r[i].err, g->r[i].prefix);
  }
}

/* Spawns every local rank; on failure stops those already running. */
static void spawn_group(group_t *g, const opts_t *o, int port, int restart) {
  for (int i = 0; i < o->nproc; i++) {
    int exec_errno;
    int rc = spawn_rank(o, g, i, port, restart, &exec_errno);
    g->n = g->r[i].pid > 0 ? i + 1 : i;
    if (rc == 0) continue;
    g->spawn_failed = exec_errno ? 127 : 1;
    start_stop(g, o, SIGTERM);
    return;
  }
}

/* Runs the group once to the end. Returns RUN_* and the exit code in *code. */
static int run_group(const opts_t *o, int port, int restart, int *code) {
  size_t np = 2 * (size_t)o->nproc + 1;
  group_t g = {.failed = -1};
  g.r = calloc((size_t)o->nproc, sizeof *g.r);
  struct pollfd *pf = malloc(np * sizeof *pf);
  stream_t **ps = malloc(np * sizeof *ps);
  rank_t **pr = malloc(np * sizeof *pr);
  if (!g.r || !pf || !ps || !pr) { msg("out of memory"); exit(1); }
  spawn_group(&g, o, port, restart);
  while (count_alive(&g) > 0) {
    int64_t now = now_ms();
    if (g.killed && now >= g.give_up_at) {
      msg("%d rank(s) still alive %d s after SIGKILL; not waiting for them",
          count_alive(&g), REAP_MS / 1000);
      break;
    }
    if (g.stopping && !g.killed && now >= g.kill_at) kill_all(&g, o, 1);
    poll_once(&g, o, pf, ps, pr, 1, poll_timeout(&g));
  }
  drain_streams(&g, o, pf, ps, pr);
  int outcome = RUN_OK;
  *code = 0;
  if (g.got_signal) {
    outcome = RUN_SIGNALED;
    *code = 128 + g.got_signal;
  } else if (g.spawn_failed) {
    outcome = RUN_SPAWN_FAILED;
    *code = g.spawn_failed;
  } else if (g.failed >= 0) {
    outcome = RUN_RANK_FAILED;
    *code = status_exit_code(g.r[g.failed].status);
  }
  for (int i = 0; i < g.n; i++) free(g.r[i].out.buf), free(g.r[i].err.buf);
  free(g.r), free(pf), free(ps), free(pr);
  return outcome;
}

/* After a run: the ranks' timelines into one file (a restart's run
 * overwrites the previous one's). A missing rank is named, never fatal. */
static void merge_trace(const opts_t *o) {
  char why[1024];
  int first = o->node_rank * o->nproc;
  int n = dgrun_trace_merge(o->trace, first, o->nproc, why, sizeof why);
  if (n < 0) msg("--trace: %s", why);
  else if (n < o->nproc)
    msg("--trace: merged %d of %d rank(s) into %s; missing: %s", n, o->nproc, o->trace, why);
}

/* DG_FLIGHT_DIR of the ranks (where their flight recorders write when
 * their group fails): the user's, else one directory per dgrun and start. */
static void flight_dir(char *dir, size_t cap, int restart) {
  static char user[4096];
  static int got;
  const char *u = getenv("DG_FLIGHT_DIR");
  if (!got++ && u) snprintf(user, sizeof user, "%s", u); /* before the first start sets it */
  const char *t = getenv("TMPDIR");
  if (user[0]) snprintf(dir, cap, "%s", user);
  else snprintf(dir, cap, "%s/dgrun-flight.%d.%d", t && *t ? t : "/tmp", (int)getpid(), restart);
  setenv("DG_FLIGHT_DIR", dir, 1);
}

/* After a failed run: says where the ranks' flight records are, if any. */
static void print_flight(const char *dir) {
  DIR *d = opendir(dir);
  int n = 0;
  for (struct dirent *e; d && (e = readdir(d));)
    n += !strncmp(e->d_name, "rank", 4) && strstr(e->d_name, ".txt") != NULL;
  if (d) closedir(d);
  if (n)
    msg("flight records of %d rank(s) (their last operations before their group failed): "
        "%s/rank<R>.txt", n, dir);
}

int main(int argc, char **argv) {
  opts_t o;
  parse_args(argc, argv, &o);
  install_handlers();
  /* As torchrun: N ranks x all-cores BLAS would oversubscribe the machine. */
  if (o.nproc > 1 && !getenv("OMP_NUM_THREADS")) setenv("OMP_NUM_THREADS", "1", 1);
  for (int restart = 0;; restart++) {
    int port = o.master_port;
    if (port == 0 && (port = pick_port(o.master_addr)) < 0) {
      msg("cannot bind a free port on %s; pass --master-port", o.master_addr);
      return 1;
    }
    char fdir[4096];
    flight_dir(fdir, sizeof fdir, restart);
    int code, outcome = run_group(&o, port, restart, &code);
    if (o.trace) merge_trace(&o);
    if (outcome == RUN_RANK_FAILED) print_flight(fdir);
    if (outcome != RUN_RANK_FAILED) return code;
    if (restart >= o.max_restarts) {
      if (o.max_restarts > 0)
        msg("giving up after %d restart(s); exit status %d", restart, code);
      return code;
    }
    msg("restart %d of %d: restarting all %d local rank(s)%s", restart + 1,
        o.max_restarts, o.nproc,
        o.master_port ? "" : " on a fresh port");
  }
}
