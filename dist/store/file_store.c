/* File store in Gloo's FileStore layout: key k lives in <dir>/<decimal
 * std::hash<std::string>(k)>, written to a dot-file first and then put in
 * place atomically; readers poll every 10 ms. dgrad's own ADD, COMPARE_SET
 * and DELETE (not in Gloo) serialise through flock on <dir>/.dglock. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include "dist/store/store_impl.h"
#include "dist/net/net_impl.h"
#include "base/common_impl.h"

typedef struct {
  dg_store base;
  char *dir;
} file_store;

#define F(s) ((file_store *)(s))

static void obj_path(dg_store *s, const char *key, char *buf, size_t cap) {
  uint64_t h = dg__std_hash_bytes(key, strlen(key), 0xc70f6907UL);
  snprintf(buf, cap, "%s/%" PRIu64, F(s)->dir, h);
}

static int write_file(const char *path, const void *val, size_t len) {
  int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return -errno;
  const char *p = val;
  while (len > 0) {
    ssize_t w = write(fd, p, len);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) {
      int e = errno;
      close(fd);
      return -e;
    }
    p += w;
    len -= (size_t)w;
  }
  return close(fd) < 0 ? -errno : 0;
}

/* Writes a temp file and links (set) or renames (replace) it into place. */
static int put(dg_store *s, const char *key, const void *val, size_t len, int replace) {
  char path[PATH_MAX], tmp[PATH_MAX + 64];
  obj_path(s, key, path, sizeof path);
  uint64_t h = dg__std_hash_bytes(key, strlen(key), 0xc70f6907UL);
  snprintf(tmp, sizeof tmp, "%s/.%" PRIu64 ".%d.%" PRId64, F(s)->dir, h, (int)getpid(),
           dg__now_ns());
  int rc = write_file(tmp, val, len);
  if (rc < 0) {
    unlink(tmp);
    return dg__store_fail(s, DG_EIO, "file store: cannot write %s: %s", tmp, strerror(-rc));
  }
  /* link() fails when the key exists: Gloo's check-then-rename, race free. */
  rc = replace ? rename(tmp, path) : link(tmp, path);
  int e = errno;
  if (!replace || rc < 0) unlink(tmp);
  if (rc < 0 && e == EEXIST)
    return dg__store_fail(s, DG_ESTATE, "file store: key \"%s\" already set (%s)", key, path);
  if (rc < 0) return dg__store_fail(s, DG_EIO, "file store: %s: %s", path, strerror(e));
  return DG_OK;
}

static int fs_set(dg_store *s, const char *key, const void *val, size_t len) {
  return put(s, key, val, len, 0);
}

static int read_path(const char *path, void **val, size_t *len) {
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return -errno;
  struct stat st;
  if (fstat(fd, &st) < 0) {
    close(fd);
    return -EIO;
  }
  size_t n = (size_t)st.st_size, got = 0;
  char *b = dg__malloc(n ? n : 1);
  if (!b) {
    close(fd);
    return -ENOMEM;
  }
  while (got < n) {
    ssize_t r = read(fd, b + got, n - got);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) break;
    got += (size_t)r;
  }
  close(fd);
  *val = b;
  *len = got;
  return 0;
}

static int exists(dg_store *s, const char *key) {
  char path[PATH_MAX];
  obj_path(s, key, path, sizeof path);
  return access(path, F_OK) == 0;
}

static int fs_check(dg_store *s, const char *const *keys, int nkeys, int *present) {
  *present = 1;
  for (int i = 0; i < nkeys && *present; i++) *present = exists(s, keys[i]);
  return DG_OK;
}

static int fs_wait(dg_store *s, const char *const *keys, int nkeys, int64_t deadline) {
  int64_t start = dg__now_ms();
  for (;;) {
    int present;
    fs_check(s, keys, nkeys, &present);
    if (present) return DG_OK;
    if (dg__now_ms() >= deadline)
      return dg__store_timeout(s, keys, nkeys, (int)(deadline - start));
    usleep(10000);
  }
}

static int fs_get(dg_store *s, const char *key, void **val, size_t *len, int64_t deadline) {
  int rc = fs_wait(s, &key, 1, deadline);
  if (rc != DG_OK) return rc;
  char path[PATH_MAX];
  obj_path(s, key, path, sizeof path);
  rc = read_path(path, val, len);
  if (rc == -ENOMEM) return DG_ENOMEM;
  if (rc < 0) return dg__store_fail(s, DG_EIO, "file store: %s: %s", path, strerror(-rc));
  return DG_OK;
}

/* Takes the exclusive flock on <dir>/.dglock; unlock() releases it. */
static int locked(dg_store *s, int *lockfd) {
  char path[PATH_MAX];
  snprintf(path, sizeof path, "%s/.dglock", F(s)->dir);
  *lockfd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (*lockfd < 0 || flock(*lockfd, LOCK_EX) < 0) {
    if (*lockfd >= 0) close(*lockfd);
    return dg__store_fail(s, DG_EIO, "file store: lock %s: %s", path, strerror(errno));
  }
  return DG_OK;
}

static void unlock(int fd) {
  flock(fd, LOCK_UN);
  close(fd);
}

static int fs_add(dg_store *s, const char *key, int64_t delta, int64_t *result) {
  int fd, rc = locked(s, &fd);
  if (rc != DG_OK) return rc;
  char path[PATH_MAX];
  obj_path(s, key, path, sizeof path);
  void *v = NULL;
  size_t n = 0;
  int64_t cur = 0;
  if (read_path(path, &v, &n) == 0) {
    char tmp[32];
    char *end;
    if (n == 0 || n >= sizeof tmp) {
      rc = DG_EFORMAT;
    } else {
      memcpy(tmp, v, n);
      tmp[n] = 0;
      cur = strtoll(tmp, &end, 10);
      if (*end) rc = DG_EFORMAT;
    }
    dg__free(v);
  }
  if (rc == DG_OK) {
    char buf[32];
    cur += delta;
    int len = snprintf(buf, sizeof buf, "%lld", (long long)cur);
    rc = put(s, key, buf, (size_t)len, 1);
    *result = cur;
  } else {
    dg__store_fail(s, rc, "file store: value of \"%s\" is not an integer", key);
  }
  unlock(fd);
  return rc;
}

static int fs_cas(dg_store *s, const char *key, const void *e, size_t elen, const void *d,
                  size_t dlen, void **cur, size_t *curlen) {
  int fd, rc = locked(s, &fd);
  if (rc != DG_OK) return rc;
  char path[PATH_MAX];
  obj_path(s, key, path, sizeof path);
  void *v = NULL;
  size_t n = 0;
  int have = read_path(path, &v, &n) == 0;
  const void *res = have ? v : e;
  size_t rlen = have ? n : elen;
  if ((have && n == elen && (!elen || !memcmp(v, e, elen))) || (!have && elen == 0)) {
    rc = put(s, key, d, dlen, 1);
    res = d;
    rlen = dlen;
  }
  if (rc == DG_OK) {
    *cur = dg__malloc(rlen ? rlen : 1);
    if (!*cur) rc = DG_ENOMEM;
    else if (rlen) memcpy(*cur, res, rlen);
    *curlen = rlen;
  }
  dg__free(v);
  unlock(fd);
  return rc;
}

static int fs_del(dg_store *s, const char *key, int *deleted) {
  char path[PATH_MAX];
  obj_path(s, key, path, sizeof path);
  *deleted = unlink(path) == 0;
  return DG_OK;
}

static int fs_num_keys(dg_store *s, int64_t *n) {
  DIR *d = opendir(F(s)->dir);
  if (!d) return dg__store_fail(s, DG_EIO, "file store: %s: %s", F(s)->dir, strerror(errno));
  struct dirent *de;
  *n = 0;
  while ((de = readdir(d)))
    if (de->d_name[0] != '.') (*n)++;
  closedir(d);
  return DG_OK;
}

static void fs_destroy(dg_store *s) {
  dg__free(F(s)->dir);
  dg__free(s);
}

static const dg_store_vt file_vt = {
    .kind = "file", .set = fs_set, .get = fs_get, .add = fs_add, .compare_set = fs_cas,
    .check = fs_check, .wait = fs_wait, .del = fs_del, .num_keys = fs_num_keys,
    .port = NULL, .destroy = fs_destroy};

int dg_store_new_file(dg_store **out, const char *dir, int timeout_ms, char *err, size_t cap) {
  if (!out || !dir || !*dir)
    return dg__fail_msg(err, cap, DG_EINVAL, "store_new_file: need out and a directory");
  *out = NULL;
  if (mkdir(dir, 0755) < 0 && errno != EEXIST)
    return dg__fail_msg(err, cap, DG_EIO, "store_new_file: mkdir %s: %s", dir, strerror(errno));
  char real[PATH_MAX];
  if (!realpath(dir, real))
    return dg__fail_msg(err, cap, DG_EIO, "store_new_file: %s: %s", dir, strerror(errno));
  file_store *f = dg__calloc(1, sizeof *f);
  if (!f || !(f->dir = dg__strdup(real))) {
    dg__free(f);
    return dg__fail_msg(err, cap, DG_ENOMEM, "store_new_file: out of memory");
  }
  dg__store_init(&f->base, &file_vt, timeout_ms);
  *out = &f->base;
  return DG_OK;
}
