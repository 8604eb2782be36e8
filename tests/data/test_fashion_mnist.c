/* The real Fashion-MNIST from Debian's dataset-fashion-mnist (skipped, exit
 * 77, when the package is absent). */
#include <dgrad.h>
#include <dgrad/data.h>
#include <unistd.h>

#include "test.h"

int main(void) {
  if (access(DG_FASHION_MNIST_DIR, R_OK) != 0)
    TEST_SKIP("dataset-fashion-mnist is not installed (" DG_FASHION_MNIST_DIR ")");
  char err[1024];
  for (int train = 1; train >= 0; train--) {
    dg_mnist *ds = NULL;
    dg_mnist_opts op = {DG_MNIST_NORM_UNIT, 0, 0, 0};
    CHECK_OK(dg_mnist_open_opts(&ds, NULL, train, &op, err, sizeof err));
    if (!ds) {
      fprintf(stderr, "%s\n", err);
      return TEST_DONE();
    }
    int64_t n = dg_mnist_count(ds);
    CHECK_EQ_INT(n, train ? 60000 : 10000);
    CHECK_EQ_INT(dg_mnist_rows(ds), 28);
    CHECK_EQ_INT(dg_mnist_cols(ds), 28);
    int64_t per_class[10] = {0};
    for (int64_t i = 0; i < n; i++) per_class[dg_mnist_labels(ds)[i]]++;
    for (int c = 0; c < 10; c++) CHECK_EQ_INT(per_class[c], n / 10);
    double sum = 0, sq = 0;
    const uint8_t *px = dg_mnist_pixels(ds);
    for (int64_t i = 0; i < n * 784; i++) {
      sum += px[i] / 255.0;
      sq += (px[i] / 255.0) * (px[i] / 255.0);
    }
    double mean = sum / (n * 784.0), sd = sqrt(sq / (n * 784.0) - mean * mean);
    fprintf(stderr, "%s: mean %.4f std %.4f\n", train ? "train" : "test", mean, sd);
    if (train) {
      CHECK_NEAR(mean, 0.2860, 5e-4);
      CHECK_NEAR(sd, 0.3530, 5e-4);
    }
    dg_mnist_free(ds);
  }
  /* default normalisation: the training set comes out near mean 0, std 1 */
  dg_mnist *ds = NULL;
  CHECK_OK(dg_mnist_open(&ds, NULL, 1, err, sizeof err));
  REQUIRE(ds);
  float im[784];
  double s = 0;
  for (int64_t i = 0; i < 1000; i++) {
    CHECK_OK(dg_mnist_image(ds, i, im));
    for (int j = 0; j < 784; j++) s += im[j];
  }
  CHECK_NEAR(s / (1000 * 784.0), 0.0, 0.05);
  dg_mnist_free(ds);
  return TEST_DONE();
}
