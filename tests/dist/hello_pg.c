/* The smallest distributed program (issue #16): join from the torchrun
 * environment, print the rank, leave. No collective and no barrier, so
 * nothing but the group's own shut-down keeps the store-hosting rank
 * serving until the others have finished their rendezvous. */
#include <stdio.h>

#include "dgrad/dist.h"

int main(void) {
  dg_pg *pg = NULL;
  char err[512] = "";
  int rc = dg_pg_new_from_env(&pg, 30000, err, sizeof err);
  if (rc != DG_OK) {
    fprintf(stderr, "dg_pg_new_from_env: %s: %s\n", dg_err_name(rc), err);
    return 1;
  }
  printf("hello from rank %d of %d\n", dg_pg_rank(pg), dg_pg_size(pg));
  dg_pg_free(pg);
  return 0;
}
