/* Custom modules: a user's residual block that only fills children and a
 * forward binds every parameter of its tree (names, seeds, empty prefix),
 * trains, and is freed with its children (the ASan suite checks the leaks);
 * children filled by hand as the user did; a module with parameters
 * of its own and a destroy; a struct the user allocates; misuse. */
#include <dgrad.h>

#include "test.h"

/* ---- the user's code: x + conv2(relu(conv1(x))) ---- */

typedef struct {
  dg_module base; /* first: dgrad sees a dg_module */
  int channels;
} resblock;

static dg_tensor *res_fwd(dg_module *m, dg_ctx *ctx, dg_tensor *x) {
  dg_tensor *h = dg_relu(ctx, dg_module_forward(m->children[0], ctx, x));
  return dg_add(ctx, x, dg_module_forward(m->children[1], ctx, h));
}

static const dg_module_vtable res_vt = {"ResBlock", res_fwd, NULL, NULL, NULL};

/* cout2 != c makes the residual add fail (for the error test). */
static dg_module *resblock_new(int c, int cout2) {
  dg_module *m = NULL, *conv = NULL;
  REQUIRE(dg_module_new(&m, sizeof(resblock), &res_vt) == DG_OK);
  ((resblock *)m)->channels = c;
  REQUIRE(dg_nn_conv2d(&conv, c, c, 3, 1, 1, 1) == DG_OK);
  REQUIRE(dg_module_add_child(m, conv, "conv1") == DG_OK);
  REQUIRE(dg_nn_conv2d(&conv, c, cout2, 3, 1, 1, 1) == DG_OK);
  REQUIRE(dg_module_add_child(m, conv, "conv2") == DG_OK);
  return m;
}

/* stem conv -> relu -> res -> pool -> flatten -> fc: 8 parameters. */
static dg_module *model(void) {
  dg_module *seq = NULL, *m = NULL;
  REQUIRE(dg_nn_sequential(&seq) == DG_OK);
  REQUIRE(dg_nn_conv2d(&m, 1, 4, 3, 1, 1, 1) == DG_OK && !dg_sequential_add(seq, m, "stem"));
  REQUIRE(dg_nn_relu(&m) == DG_OK && !dg_sequential_add(seq, m, "act"));
  REQUIRE(!dg_sequential_add(seq, resblock_new(4, 4), "res"));
  REQUIRE(dg_nn_maxpool2d(&m, 2, 2) == DG_OK && !dg_sequential_add(seq, m, "pool"));
  REQUIRE(dg_nn_flatten(&m) == DG_OK && !dg_sequential_add(seq, m, "flat"));
  REQUIRE(dg_nn_linear(&m, 4 * 4 * 4, 3, 1) == DG_OK && !dg_sequential_add(seq, m, "fc"));
  return seq;
}

static int same_values(dg_tensor *a, dg_tensor *b) {
  return a && b && dg_tensor_numel(a) == dg_tensor_numel(b) &&
         !memcmp(dg_tensor_data(a), dg_tensor_data(b), (size_t)dg_tensor_numel(a) * 4);
}

/* A built-in module bound alone at `name`'s prefix gets the same values as
 * the same parameter inside the user's tree: seeds follow full names. */
static void check_seed_rule(dg_params *ps, const char *prefix, const char *pname, uint64_t seed) {
  dg_params *ref = NULL;
  dg_module *conv = NULL;
  REQUIRE(dg_params_new(&ref) == DG_OK && dg_nn_conv2d(&conv, 4, 4, 3, 1, 1, 1) == DG_OK);
  CHECK_OK(dg_module_bind(conv, ref, prefix, seed));
  char full[128];
  snprintf(full, sizeof full, "%s.weight", prefix);
  CHECK(same_values(dg_params_find(ref, full), dg_params_find(ps, pname)));
  dg_module_free(conv);
  dg_params_free(ref);
}

static void test_residual_trains(void) {
  dg_module *net = model();
  dg_params *ps = NULL;
  dg_ctx *ctx = NULL;
  REQUIRE(dg_params_new(&ps) == DG_OK && dg_ctx_new(&ctx, NULL) == DG_OK);
  CHECK_OK(dg_module_bind(net, ps, "", 5));
  const char *want[] = {"stem.weight",      "stem.bias",        "res.conv1.weight",
                        "res.conv1.bias",   "res.conv2.weight", "res.conv2.bias",
                        "fc.weight",        "fc.bias"};
  CHECK_EQ_INT(dg_params_count(ps), 8);
  for (int i = 0; i < 8 && i < dg_params_count(ps); i++)
    CHECK(!strcmp(dg_tensor_name(dg_params_get(ps, i)), want[i]));
  dg_module *res = dg_sequential_get(net, 2);
  REQUIRE(res && res->path && res->children[1]->path);
  CHECK(!strcmp(res->path, "res"));
  CHECK(!strcmp(res->children[1]->path, "res.conv2"));
  CHECK(!strcmp(net->path, ""));
  check_seed_rule(ps, "res.conv1", "res.conv1.weight", 5);
  check_seed_rule(ps, "res.conv2", "res.conv2.weight", 5);

  /* learns: every parameter reached, the loss falls */
  float x[8 * 64];
  int64_t y[8], xs[4] = {8, 1, 8, 8}, ys[1] = {8};
  dg_rng_normal(3, 0, x, 8 * 64);
  for (int i = 0; i < 8; i++) y[i] = i % 3;
  dg_optim *opt = NULL;
  dg_sgd_opts so = {.lr = 0.05f, .momentum = 0.9f};
  REQUIRE(dg_optim_new_sgd(&opt, ps, &so, NULL, 0) == DG_OK);
  float first = 0, last = 0;
  for (int step = 0; step < 30; step++) {
    dg_params_zero_grad(ps);
    dg_tensor *out = dg_module_forward(net, ctx, dg_wrap(ctx, DG_F32, 4, xs, x));
    dg_tensor *loss = dg_cross_entropy(ctx, out, dg_wrap(ctx, DG_I64, 1, ys, y));
    if (!loss) fprintf(stderr, "%s\n", dg_ctx_errmsg(ctx));
    REQUIRE(loss);
    CHECK_OK(dg_backward(ctx, loss));
    if (step == 0) CHECK_EQ_INT(dg_params_unreached_count(ps), 0);
    if (step == 0) first = dg_tensor_item(loss);
    last = dg_tensor_item(loss);
    CHECK_OK(dg_optim_step(opt));
    dg_ctx_reset(ctx);
  }
  fprintf(stderr, "residual CNN loss %.4f -> %.4f\n", first, last);
  CHECK(last < 0.5f * first);
  dg_optim_free(opt);
  dg_module_free(net); /* frees the block and its convs */
  dg_params_free(ps);
  dg_ctx_free(ctx);
}

/* The block alone at "" names its parameters "conv1.weight" ...; those draw
 * from their own names, so they differ from "res.conv1.weight". */
static void test_empty_prefix(void) {
  dg_module *blk = resblock_new(4, 4), *net = model();
  dg_params *ps = NULL, *p2 = NULL;
  REQUIRE(dg_params_new(&ps) == DG_OK && dg_params_new(&p2) == DG_OK);
  CHECK_OK(dg_module_bind(blk, ps, NULL, 5)); /* NULL prefix: "" */
  CHECK_EQ_INT(dg_params_count(ps), 4);
  CHECK(dg_params_find(ps, "conv1.weight") && dg_params_find(ps, "conv2.bias"));
  check_seed_rule(ps, "conv1", "conv1.weight", 5);
  CHECK_OK(dg_module_bind(net, p2, "", 5));
  CHECK(!same_values(dg_params_find(ps, "conv1.weight"), dg_params_find(p2, "res.conv1.weight")));
  dg_module_free(blk);
  dg_module_free(net);
  dg_params_free(ps);
  dg_params_free(p2);
}

/* The block: arrays filled by hand (malloc is dgrad's allocator by
 * default); with child_names NULL the children are named by index. Before
 * the fix this bound 0 parameters and its forward failed "Conv2d: forward
 * before dg_module_bind". */
static void test_filled_by_hand(void) {
  dg_module *m = NULL;
  REQUIRE(dg_module_new(&m, sizeof(resblock), &res_vt) == DG_OK);
  m->children = malloc(2 * sizeof *m->children);
  REQUIRE(m->children);
  REQUIRE(dg_nn_conv2d(&m->children[0], 4, 4, 3, 1, 1, 1) == DG_OK);
  REQUIRE(dg_nn_conv2d(&m->children[1], 4, 4, 3, 1, 1, 0) == DG_OK);
  m->nchildren = 2;
  dg_params *ps = NULL;
  dg_ctx *ctx = NULL;
  REQUIRE(dg_params_new(&ps) == DG_OK && dg_ctx_new(&ctx, NULL) == DG_OK);
  CHECK_OK(dg_module_bind(m, ps, "blk", 1));
  CHECK_EQ_INT(dg_params_count(ps), 3);
  CHECK(dg_params_find(ps, "blk.0.bias") && dg_params_find(ps, "blk.1.weight"));
  CHECK_EQ_INT(dg_module_add_child(m, m->children[0], "x"), DG_EINVAL); /* no names array */
  int64_t xs[4] = {2, 4, 5, 5};
  dg_tensor *y = dg_module_forward(m, ctx, dg_randn(ctx, 4, xs, 0, 1));
  CHECK(y != NULL);
  if (!y) fprintf(stderr, "%s\n", dg_ctx_errmsg(ctx));
  dg_module_free(m);
  dg_params_free(ps);
  dg_ctx_free(ctx);
}

/* ---- parameters of its own, a destroy, and children ---- */

typedef struct {
  dg_module base;
  dg_tensor *gain;
  float *scratch; /* the user's own allocation, freed by destroy */
} gated;

static int g_destroyed;

static dg_tensor *gated_fwd(dg_module *m, dg_ctx *ctx, dg_tensor *x) {
  return dg_mul(ctx, dg_module_forward(m->children[0], ctx, x), ((gated *)m)->gain);
}

static int gated_bind(dg_module *m, dg_params *ps, const char *prefix, uint64_t seed) {
  gated *g = (gated *)m;
  char full[128];
  snprintf(full, sizeof full, "%s%sgain", prefix, *prefix ? "." : "");
  int64_t one = 1;
  int rc = dg_params_add(ps, full, 1, &one, &g->gain);
  if (rc) return rc;
  dg_init_uniform(g->gain, 0.5f, 1.5f, dg_module_param_seed(seed, full));
  return DG_OK;
}

static void gated_destroy(dg_module *m) {
  gated *g = (gated *)m;
  CHECK(m->nchildren == 1); /* children are freed after destroy */
  free(g->scratch);
  g->scratch = NULL;
  g_destroyed++;
}

static const dg_module_vtable gated_vt = {"Gated", gated_fwd, gated_bind, gated_destroy, NULL};

static void test_own_params_and_destroy(void) {
  dg_module *m = NULL, *lin = NULL;
  REQUIRE(dg_module_new(&m, sizeof(gated), &gated_vt) == DG_OK);
  ((gated *)m)->scratch = malloc(64);
  REQUIRE(dg_nn_linear(&lin, 3, 2, 1) == DG_OK && !dg_module_add_child(m, lin, "proj"));
  dg_params *ps = NULL;
  dg_ctx *ctx = NULL;
  REQUIRE(dg_params_new(&ps) == DG_OK && dg_ctx_new(&ctx, NULL) == DG_OK);
  CHECK_OK(dg_module_bind(m, ps, "g", 9));
  const char *want[] = {"g.gain", "g.proj.weight", "g.proj.bias"}; /* own first */
  CHECK_EQ_INT(dg_params_count(ps), 3);
  for (int i = 0; i < 3 && i < dg_params_count(ps); i++)
    CHECK(!strcmp(dg_tensor_name(dg_params_get(ps, i)), want[i]));
  float v = dg_tensor_item(dg_params_find(ps, "g.gain"));
  CHECK(v >= 0.5f && v < 1.5f);
  int64_t xs[2] = {4, 3};
  dg_tensor *y = dg_module_forward(m, ctx, dg_randn(ctx, 2, xs, 0, 1));
  REQUIRE(y);
  CHECK_OK(dg_backward(ctx, dg_sum(ctx, y)));
  CHECK_EQ_INT(dg_params_unreached_count(ps), 0);
  dg_module_set_train(m, 0);
  CHECK_EQ_INT(lin->train, 0); /* set_train reaches the children */
  dg_module_free(m);
  CHECK_EQ_INT(g_destroyed, 1);
  dg_params_free(ps);
  dg_ctx_free(ctx);
}

/* A struct the user owns (here on the stack): dg_module_release frees what
 * dgrad allocated in it, the struct stays the user's. */
static void test_user_owned_struct(void) {
  resblock blk = {.base = {.vt = &res_vt, .train = 1}, .channels = 2};
  dg_module *conv = NULL;
  REQUIRE(dg_nn_conv2d(&conv, 2, 2, 3, 1, 1, 1) == DG_OK);
  CHECK_OK(dg_module_add_child(&blk.base, conv, "a"));
  REQUIRE(dg_nn_conv2d(&conv, 2, 2, 3, 1, 1, 1) == DG_OK);
  CHECK_OK(dg_module_add_child(&blk.base, conv, NULL)); /* named "1" */
  dg_params *ps = NULL;
  REQUIRE(dg_params_new(&ps) == DG_OK);
  CHECK_OK(dg_module_bind(&blk.base, ps, "u", 1));
  CHECK(dg_params_find(ps, "u.a.weight") && dg_params_find(ps, "u.1.bias"));
  dg_module_release(&blk.base);
  CHECK(blk.base.nchildren == 0 && !blk.base.children && !blk.base.path);
  dg_module_release(NULL);
  dg_params_free(ps);
}

static void test_misuse(void) {
  dg_module *m = (dg_module *)1, *lin = NULL;
  CHECK_EQ_INT(dg_module_new(&m, sizeof(dg_module) - 1, &res_vt), DG_EINVAL);
  CHECK(m == NULL);
  CHECK_EQ_INT(dg_module_new(&m, sizeof(resblock), NULL), DG_EINVAL);
  CHECK_EQ_INT(dg_module_new(NULL, sizeof(resblock), &res_vt), DG_EINVAL);
  REQUIRE(dg_module_new(&m, sizeof(resblock), &res_vt) == DG_OK);
  REQUIRE(dg_nn_linear(&lin, 2, 2, 0) == DG_OK);
  CHECK_EQ_INT(dg_module_add_child(m, m, "self"), DG_EINVAL);
  CHECK_EQ_INT(dg_module_add_child(m, NULL, "none"), DG_EINVAL);
  CHECK_EQ_INT(dg_module_add_child(m, lin, ""), DG_EINVAL); /* would name "p..weight" */
  CHECK_EQ_INT(dg_module_add_child(NULL, lin, "x"), DG_EINVAL);
  CHECK_EQ_INT(dg_sequential_add(m, lin, "x"), DG_EINVAL); /* not a Sequential */
  CHECK_OK(dg_module_add_child(m, lin, "x"));
  /* a name that does not fit is refused, not cut (cut names could clash) */
  char longp[300];
  memset(longp, 'a', sizeof longp - 1);
  longp[sizeof longp - 1] = 0;
  dg_params *ps = NULL;
  REQUIRE(dg_params_new(&ps) == DG_OK);
  CHECK_EQ_INT(dg_module_bind(m, ps, longp, 1), DG_EINVAL);
  CHECK_STR_HAS(dg_params_errmsg(ps), "module path longer than 255 bytes");
  CHECK_EQ_INT(dg_params_count(ps), 0);
  longp[250] = 0; /* the path fits, "<path>.x.weight" does not */
  CHECK_EQ_INT(dg_module_bind(m, ps, longp, 1), DG_EINVAL);
  CHECK_STR_HAS(dg_params_errmsg(ps), "parameter name longer than 255 bytes");
  CHECK_STR_HAS(dg_params_errmsg(ps), "aa.x.weight\"");
  CHECK_EQ_INT(dg_params_count(ps), 0);
  dg_module_free(m);
  dg_params_free(ps);
}

/* ---- tuples: modules of several inputs and outputs ---- */

/* x -> (relu(x), x); with mode 1 returns nothing, mode 2 fails silently */
typedef struct {
  dg_module base;
  int mode;
} split2;

static int split_fwd(dg_module *m, dg_ctx *c, dg_tensor *const *xs, int nx, dg_tensor **ys,
                     int *ny) {
  const int mode = ((split2 *)m)->mode;
  if (mode == 2 || nx != 1) return DG_EINVAL;
  ys[0] = dg_relu(c, xs[0]), ys[1] = xs[0];
  *ny = mode == 1 ? 0 : 2;
  return DG_OK;
}

/* (a, b) -> child(a) + b */
static int merge_fwd(dg_module *m, dg_ctx *c, dg_tensor *const *xs, int nx, dg_tensor **ys,
                     int *ny) {
  if (nx != 2) return DG_EINVAL;
  ys[0] = dg_add(c, dg_module_forward(m->children[0], c, xs[0]), xs[1]);
  *ny = 1;
  return ys[0] ? DG_OK : dg_ctx_errcode(c);
}

static const dg_module_vtable split_vt = {"Split", NULL, NULL, NULL, split_fwd};
static const dg_module_vtable merge_vt = {"Merge", NULL, NULL, NULL, merge_fwd};

static dg_module *split_new(int mode) {
  dg_module *m = NULL;
  REQUIRE(dg_module_new(&m, sizeof(split2), &split_vt) == DG_OK);
  ((split2 *)m)->mode = mode;
  return m;
}

/* A Sequential threads a tuple from layer to layer: Linear, Split,
 * Merge(Linear) computes lin2(relu(h)) + h with h = lin1(x), the same as
 * by hand, through dg_module_forward and dg_module_forward_n; errors name
 * the module and say what was wrong. */
static void test_tuples(void) {
  dg_module *seq = NULL, *lin = NULL, *mg = NULL;
  dg_params *ps = NULL;
  dg_ctx *c = NULL;
  REQUIRE(dg_params_new(&ps) == DG_OK && dg_ctx_new(&c, NULL) == DG_OK);
  REQUIRE(dg_nn_sequential(&seq) == DG_OK);
  REQUIRE(dg_nn_linear(&lin, 3, 4, 1) == DG_OK && !dg_sequential_add(seq, lin, "lin1"));
  REQUIRE(!dg_sequential_add(seq, split_new(0), "split"));
  REQUIRE(dg_module_new(&mg, sizeof(dg_module), &merge_vt) == DG_OK);
  REQUIRE(dg_nn_linear(&lin, 4, 4, 1) == DG_OK && !dg_module_add_child(mg, lin, "lin2"));
  REQUIRE(!dg_sequential_add(seq, mg, "merge"));
  CHECK_OK(dg_module_bind(seq, ps, "", 3));
  float xv[6] = {1, -2, 3, -4, 5, -6};
  dg_tensor *x = dg_wrap(c, DG_F32, 2, (int64_t[]){2, 3}, xv);
  dg_tensor *y = dg_module_forward(seq, c, x), *ys[DG_MODULE_MAX_IO];
  int ny = -1;
  CHECK_OK(dg_module_forward_n(seq, c, &x, 1, ys, &ny));
  CHECK_EQ_INT(ny, 1);
  dg_tensor *h = dg_module_forward(dg_sequential_get(seq, 0), c, x);
  dg_tensor *want = dg_add(c, dg_module_forward(lin, c, dg_relu(c, h)), h);
  REQUIRE(y && want && ny == 1);
  CHECK(same_values(y, want) && same_values(ys[0], want));
  /* the tuple from the first two layers */
  dg_module *head = NULL;
  REQUIRE(dg_sequential_split(seq, 2, &head) == DG_OK); /* seq: lin1, split; head: merge */
  CHECK_OK(dg_module_forward_n(seq, c, &x, 1, ys, &ny));
  CHECK_EQ_INT(ny, 2);
  CHECK(same_values(ys[1], h));
  CHECK(dg_module_forward(seq, c, x) == NULL); /* two tensors where one is wanted */
  CHECK_EQ_INT(dg_ctx_errcode(c), DG_EINVAL);
  CHECK_STR_HAS(dg_ctx_errmsg(c), "Sequential: its last layer returns 2 tensors where one was "
                "wanted (call dg_module_forward_n)");
  dg_ctx_clear_error(c);
  CHECK_EQ_INT(dg_module_forward_n(lin, c, ys, 2, ys + 2, &ny), DG_EINVAL); /* one-tensor module */
  CHECK_STR_HAS(dg_ctx_errmsg(c), "merge.lin2 (Linear): takes one tensor, got 2");
  CHECK_EQ_INT(ny, 0);
  dg_ctx_clear_error(c);
  CHECK_EQ_INT(dg_module_forward_n(head, c, &x, 1, ys, &ny), DG_EINVAL); /* Merge wants 2 */
  CHECK_STR_HAS(dg_ctx_errmsg(c), "merge (Merge): forward failed (");
  CHECK_STR_HAS(dg_ctx_errmsg(c), ") and recorded no error");
  dg_ctx_clear_error(c);
  dg_module *bad = split_new(1);
  CHECK_EQ_INT(dg_module_forward_n(bad, c, &x, 1, ys, &ny), DG_EINVAL);
  CHECK_STR_HAS(dg_ctx_errmsg(c), "Split: forward returned 0 tensors (1 to 8 allowed)");
  dg_ctx_clear_error(c);
  CHECK_EQ_INT(dg_module_forward_n(bad, c, NULL, 1, ys, &ny), DG_EINVAL);
  CHECK_EQ_INT(dg_module_forward_n(bad, c, &x, 9, ys, &ny), DG_EINVAL);
  dg_ctx_clear_error(c);
  ((split2 *)bad)->mode = 2;
  CHECK(dg_module_forward(bad, c, x) == NULL); /* forward_n only, failing silently */
  CHECK_STR_HAS(dg_ctx_errmsg(c), "Split: forward failed (");
  dg_ctx_clear_error(c);
  ((split2 *)bad)->mode = 0;
  CHECK(dg_module_forward(bad, c, x) == NULL); /* forward_n only, two outputs */
  CHECK_STR_HAS(dg_ctx_errmsg(c), "forward returned 2 tensors where one was wanted");
  dg_module_free(bad);
  dg_module_free(head);
  dg_module_free(seq);
  dg_params_free(ps);
  dg_ctx_free(c);
}

int main(void) {
  test_tuples();
  test_residual_trains();
  test_empty_prefix();
  test_filled_by_hand();
  test_own_params_and_destroy();
  test_user_owned_struct();
  test_misuse();
  return TEST_DONE();
}
