/* Parameter counts (dg_params_numel) and the model summary
 * (dg_module_summary): rows, subtree counts, own tensors with shapes,
 * frozen and buffer marks, totals, parameters outside the tree, truncation
 * as snprintf, misuse. */
#include <dgrad.h>

#include "test.h"

/* Sequential bound at "": 0 Linear(8, 16), 1 LayerNorm(16), 2 ReLU,
 * head = Sequential(0 Linear(16, 4)). */
static dg_module *build(dg_params *ps) {
  dg_module *seq, *head, *m;
  REQUIRE(dg_nn_sequential(&seq) == DG_OK);
  REQUIRE(dg_nn_linear(&m, 8, 16, 1) == DG_OK && dg_sequential_add(seq, m, NULL) == DG_OK);
  REQUIRE(dg_nn_layernorm(&m, 16, 1e-5f) == DG_OK && dg_sequential_add(seq, m, NULL) == DG_OK);
  REQUIRE(dg_nn_relu(&m) == DG_OK && dg_sequential_add(seq, m, NULL) == DG_OK);
  REQUIRE(dg_nn_sequential(&head) == DG_OK);
  REQUIRE(dg_nn_linear(&m, 16, 4, 1) == DG_OK && dg_sequential_add(head, m, NULL) == DG_OK);
  REQUIRE(dg_sequential_add(seq, head, "head") == DG_OK);
  REQUIRE(dg_module_bind(seq, ps, "", 1) == DG_OK);
  return seq;
}

/* The line of `text` that starts (after indentation) with `path  `. */
static const char *row(const char *text, const char *path) {
  char key[64];
  snprintf(key, sizeof key, "\n%s ", path);
  for (const char *p = text; (p = strchr(p, '\n')); p++) {
    const char *q = p + 1;
    while (*q == ' ') q++;
    if (!strncmp(q, key + 1, strlen(key + 1))) return q;
  }
  return NULL;
}

static int has_in_row(const char *text, const char *path, const char *what) {
  const char *r = row(text, path);
  if (!r) return 0;
  const char *end = strchr(r, '\n'), *hit = strstr(r, what);
  return hit && (!end || hit < end);
}

int main(void) {
  dg_params *ps;
  REQUIRE(dg_params_new(&ps) == DG_OK);
  dg_module *net = build(ps);
  /* 8*16 + 16 + 16 + 16 + 16*4 + 4 = 244 */
  CHECK_EQ_INT(dg_params_numel(ps, 0), 244);
  CHECK_EQ_INT(dg_params_numel(ps, 1), 244);
  int lnw = -1;
  for (int i = 0; i < dg_params_count(ps); i++)
    if (!strcmp(dg_tensor_name(dg_params_get(ps, i)), "1.weight")) lnw = i;
  REQUIRE(lnw >= 0);
  dg_params_set_trainable(ps, lnw, 0);
  CHECK_EQ_INT(dg_params_numel(ps, 1), 228);
  CHECK_EQ_INT(dg_params_numel(NULL, 0), 0);
  REQUIRE(dg_params_add_buffer(ps, "1.running_stat", 1, (int64_t[]){16}, NULL) == DG_OK);
  CHECK_EQ_INT(dg_params_numel(ps, 0), 244); /* buffers are not parameters */

  int n = dg_module_summary(net, ps, NULL, 0);
  REQUIRE(n > 0);
  char *text = malloc((size_t)n + 1);
  CHECK_EQ_INT(dg_module_summary(net, ps, text, (size_t)n + 1), n);
  CHECK_EQ_INT(strlen(text), n);
  fprintf(stderr, "%s", text);
  CHECK(!strncmp(text, "module ", 7));
  CHECK(has_in_row(text, "(root)", "Sequential"));
  CHECK(has_in_row(text, "(root)", " 244 "));
  CHECK(has_in_row(text, "(root)", " 228\n"));
  CHECK(has_in_row(text, "0", "Linear"));
  CHECK(has_in_row(text, "0", " 144 "));
  CHECK(has_in_row(text, "0", "weight (16, 8), bias (16,)"));
  CHECK(has_in_row(text, "1", "LayerNorm"));
  CHECK(has_in_row(text, "1", "weight (16,) frozen, bias (16,), running_stat (16,) buffer"));
  CHECK(has_in_row(text, "2", "ReLU"));
  CHECK(has_in_row(text, "head", "Sequential"));
  CHECK(has_in_row(text, "head", " 68 "));
  CHECK(has_in_row(text, "head.0", "Linear"));
  CHECK(has_in_row(text, "head.0", "weight (4, 16), bias (4,)"));
  CHECK(strstr(text, "\n    head.0 ") != NULL); /* indented by depth */
  CHECK_STR_HAS(text, "total: 244 parameters in 6 tensors (228 trainable, 16 frozen); "
                      "16 buffer elements in 1 buffers; 6 modules\n");
  CHECK(strstr(text, "outside this module") == NULL);

  /* cut like snprintf: the full length back, a terminated prefix */
  char small[16];
  CHECK_EQ_INT(dg_module_summary(net, ps, small, sizeof small), n);
  CHECK_EQ_INT(strlen(small), sizeof small - 1);
  CHECK(!strncmp(small, text, sizeof small - 1));

  /* a subtree of the same store: the rest is counted as outside it */
  dg_module *head = dg_sequential_get(net, 3);
  char buf[2048];
  int k = dg_module_summary(head, ps, buf, sizeof buf);
  CHECK(k > 0 && k < (int)sizeof buf);
  CHECK(has_in_row(buf, "head", " 68 "));
  CHECK_STR_HAS(buf, "total: 68 parameters in 2 tensors (68 trainable, 0 frozen)");
  CHECK_STR_HAS(buf, "the store holds 4 more parameters (176 elements) outside this module");

  /* misuse */
  dg_module *lone;
  REQUIRE(dg_nn_linear(&lone, 2, 2, 1) == DG_OK);
  CHECK_EQ_INT(dg_module_summary(lone, ps, buf, sizeof buf), DG_ESTATE); /* never bound */
  CHECK_EQ_INT(dg_module_summary(NULL, ps, buf, sizeof buf), DG_EINVAL);
  CHECK_EQ_INT(dg_module_summary(net, NULL, buf, sizeof buf), DG_EINVAL);
  CHECK_EQ_INT(dg_module_summary(net, ps, NULL, 5), DG_EINVAL);
  dg_module_free(lone);
  free(text);
  dg_module_free(net);
  dg_params_free(ps);
  return TEST_DONE();
}
