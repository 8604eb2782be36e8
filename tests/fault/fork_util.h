/* Ranks as forked processes for the dist, fault, DDP and interop tests: each
 * child gets the torch environment (rank 0 hosts the TCPStore) and runs fn;
 * the parent collects exit statuses with a deadline and kills stragglers. */
#ifndef DG_TEST_FORK_UTIL_H
#define DG_TEST_FORK_UTIL_H

#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

/* A port for a rendezvous, free when checked. Not one the kernel picks
 * (bind to port 0): those come from the ephemeral range, from which any
 * outgoing connection or another test's port-0 listener may take it again
 * before rank 0 binds it (interop_td was seen failing so). A random port
 * below that range (ip_local_port_range) is only ever taken by a program
 * asking for it by number. */
static inline int fu_bind_ok(int port) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port),
                          .sin_addr.s_addr = htonl(INADDR_ANY)};
  int ok = fd >= 0 && bind(fd, (struct sockaddr *)&a, sizeof a) == 0;
  socklen_t l = sizeof a;
  if (ok && port == 0) ok = getsockname(fd, (struct sockaddr *)&a, &l) == 0;
  if (fd >= 0) close(fd);
  return ok ? ntohs(a.sin_port) : -1;
}

static inline int fu_free_port(void) {
  int lo = 32768, hi = 60999;
  FILE *f = fopen("/proc/sys/net/ipv4/ip_local_port_range", "r");
  if (f) {
    if (fscanf(f, "%d %d", &lo, &hi) != 2) lo = 32768;
    fclose(f);
  }
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  unsigned seed = (unsigned)getpid() * 2654435761u ^ (unsigned)t.tv_nsec;
  for (int i = 0; lo > 21024 && i < 500; i++) {
    int port = 20000 + (int)(rand_r(&seed) % (unsigned)(lo - 20000));
    if (fu_bind_ok(port) == port) return port;
  }
  return fu_bind_ok(0); /* an odd port range: the kernel's choice */
}

/* Waits for the W children pid[] for up to `secs`; status[r] gets each wait
 * status, -1 for one still running then (killed and reaped). */
static inline void fu_reap(int W, pid_t *pid, int secs, int *status) {
  time_t end = time(NULL) + secs;
  int left = W;
  while (left > 0 && time(NULL) < end) {
    int st;
    pid_t p = waitpid(-1, &st, WNOHANG);
    if (p <= 0) {
      usleep(5000);
      continue;
    }
    for (int r = 0; r < W; r++)
      if (pid[r] == p) status[r] = st, pid[r] = 0, left--;
  }
  for (int r = 0; r < W; r++)
    if (pid[r]) {
      kill(pid[r], SIGKILL);
      waitpid(pid[r], NULL, 0);
      status[r] = -1;
    }
}

/* Runs fn(rank, W) in W children; status[r] gets each wait status (-1: had
 * to be killed after `secs`). */
static inline void fu_run(int W, int (*fn)(int, int), int secs, int *status) {
  pid_t pid[16];
  char ps[16], ws[16];
  snprintf(ps, sizeof ps, "%d", fu_free_port());
  snprintf(ws, sizeof ws, "%d", W);
  for (int r = 0; r < W; r++) {
    pid[r] = fork();
    if (pid[r] == 0) {
      char rs[16];
      snprintf(rs, sizeof rs, "%d", r);
      setenv("MASTER_ADDR", "127.0.0.1", 1);
      setenv("MASTER_PORT", ps, 1);
      setenv("RANK", rs, 1);
      setenv("WORLD_SIZE", ws, 1);
      _exit(fn(r, W));
    }
  }
  fu_reap(W, pid, secs, status);
}

static inline double fu_ms_since(const struct timespec *t0) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (t.tv_sec - t0->tv_sec) * 1e3 + (t.tv_nsec - t0->tv_nsec) / 1e6;
}

#endif
