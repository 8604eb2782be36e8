/* Stands in for the UCX tests in a build without UCX: skipped (77). */
#include <stdio.h>

int main(void) {
  fprintf(stderr, "built without UCX (-Ducx=disabled or libucx-dev missing): skipped\n");
  return 77;
}
