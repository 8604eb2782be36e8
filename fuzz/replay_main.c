/* Runs a harness over files without libFuzzer (a gcc build, the ASan
 * suite): every file named, and every file of every directory named. The
 * meson tests of suite 'fuzz' replay each harness's corpus this way, so the
 * inputs that once found a defect (corpus/<harness>/crash-*) stay fixed.
 * A harness aborts on a broken invariant; a sanitizer fails the run. */
#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static int run_file(const char *path) {
  FILE *f = fopen(path, "rb");
  if (!f) {
    fprintf(stderr, "replay: cannot open %s\n", path);
    return 1;
  }
  uint8_t *buf = NULL;
  size_t n = 0, cap = 0;
  for (;;) {
    if (n == cap && !(buf = realloc(buf, cap = cap ? 2 * cap : 4096))) abort();
    size_t got = fread(buf + n, 1, cap - n, f);
    if (!got) break;
    n += got;
  }
  fclose(f);
  /* a copy of exactly n bytes: ASan sees any read past the input */
  uint8_t *exact = malloc(n ? n : 1);
  if (!exact) abort();
  memcpy(exact, buf, n);
  free(buf);
  LLVMFuzzerTestOneInput(exact, n);
  free(exact);
  return 0;
}

int main(int argc, char **argv) {
  int bad = 0, count = 0;
  for (int i = 1; i < argc; i++) {
    struct stat st;
    if (stat(argv[i], &st) != 0) {
      fprintf(stderr, "replay: %s: no such file or directory\n", argv[i]);
      return 1;
    }
    if (!S_ISDIR(st.st_mode)) {
      bad |= run_file(argv[i]), count++;
      continue;
    }
    struct dirent **ents;
    int ne = scandir(argv[i], &ents, NULL, alphasort);
    for (int k = 0; k < ne; k++) {
      char p[4096];
      snprintf(p, sizeof p, "%s/%s", argv[i], ents[k]->d_name);
      if (ents[k]->d_name[0] != '.' && stat(p, &st) == 0 && S_ISREG(st.st_mode))
        bad |= run_file(p), count++;
      free(ents[k]);
    }
    free(ents);
  }
  printf("replay: %d inputs, %s\n", count, bad ? "FAILED" : "all passed");
  return bad || count == 0;
}
