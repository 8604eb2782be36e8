/* A dgrad checkpoint read by PyTorch: builds a small CNN (conv, relu,
 * maxpool, flatten, linear, GELU, layernorm, linear), takes two AdamW steps,
 * saves a checkpoint and writes the input and dgrad's output for it; then
 * runs torch_check.py under /usr/bin/python3, which parses the safetensors
 * header itself, loads the tensors into the same model in torch and compares
 * outputs. Exit 77 (skipped) when /usr/bin/python3 has no torch.
 *
 *   test_ckpt_torch path/to/torch_check.py */
#include <sys/wait.h>
#include <unistd.h>

#include "ckpt_util.h"

static dg_module *build(dg_params *ps) {
  dg_module *seq, *m;
  REQUIRE(dg_nn_sequential(&seq) == DG_OK);
  REQUIRE(dg_nn_conv2d(&m, 1, 4, 3, 1, 1, 1) == DG_OK);
  dg_sequential_add(seq, m, NULL);
  REQUIRE(dg_nn_relu(&m) == DG_OK);
  dg_sequential_add(seq, m, NULL);
  REQUIRE(dg_nn_maxpool2d(&m, 2, 2) == DG_OK);
  dg_sequential_add(seq, m, NULL);
  REQUIRE(dg_nn_flatten(&m) == DG_OK);
  dg_sequential_add(seq, m, NULL);
  REQUIRE(dg_nn_linear(&m, 64, 16, 1) == DG_OK);
  dg_sequential_add(seq, m, NULL);
  REQUIRE(dg_nn_gelu(&m) == DG_OK);
  dg_sequential_add(seq, m, NULL);
  REQUIRE(dg_nn_layernorm(&m, 16, 1e-5f) == DG_OK);
  dg_sequential_add(seq, m, NULL);
  REQUIRE(dg_nn_linear(&m, 16, 10, 1) == DG_OK);
  dg_sequential_add(seq, m, NULL);
  REQUIRE(dg_module_bind(seq, ps, "net", 42) == DG_OK);
  return seq;
}

/* Two AdamW steps on a cross-entropy loss, so that the weights differ from
 * their initialisation and the optimizer has state. */
static void train(dg_ctx *ctx, dg_module *net, dg_params *ps, dg_optim *o, float *xin) {
  int64_t y[3] = {1, 7, 3}, n = 3, xs[4] = {3, 1, 8, 8};
  for (int s = 0; s < 2; s++) {
    dg_params_zero_grad(ps);
    dg_tensor *out = dg_module_forward(net, ctx, dg_wrap(ctx, DG_F32, 4, xs, xin));
    dg_tensor *loss = dg_cross_entropy(ctx, out, dg_wrap(ctx, DG_I64, 1, &n, y));
    REQUIRE(loss != NULL);
    REQUIRE(dg_backward(ctx, loss) == DG_OK);
    REQUIRE(dg_optim_step(o) == DG_OK);
    dg_ctx_reset(ctx);
  }
}

static int run_python(const char *script, const char *dir) {
  if (access("/usr/bin/python3", X_OK)) TEST_SKIP("/usr/bin/python3 not found");
  pid_t pid = fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    execl("/usr/bin/python3", "python3", script, dir, (char *)NULL);
    _exit(127);
  }
  int st;
  waitpid(pid, &st, 0);
  return WIFEXITED(st) ? WEXITSTATUS(st) : 1;
}

int main(int argc, char **argv) {
  REQUIRE(argc == 2);
  char dir[64] = "/tmp/dg_ckpt_torch_XXXXXX", path[128], err[512];
  REQUIRE(mkdtemp(dir) != NULL);
  dg_ctx *ctx;
  dg_params *ps;
  dg_optim *o;
  REQUIRE(dg_ctx_new(&ctx, NULL) == DG_OK);
  REQUIRE(dg_params_new(&ps) == DG_OK);
  dg_module *net = build(ps);
  REQUIRE(dg_optim_new_adamw(&o, ps, NULL, NULL, 0) == DG_OK);
  float xin[3 * 64];
  dg_rng_normal(7, 0, xin, 3 * 64);
  int64_t xs[4] = {3, 1, 8, 8};
  train(ctx, net, ps, o, xin);
  dg_ctx_set_train(ctx, 0);
  dg_tensor *out = dg_module_forward(net, ctx, dg_wrap(ctx, DG_F32, 4, xs, xin));
  REQUIRE(out != NULL && dg_tensor_numel(out) == 30);
  snprintf(path, sizeof path, "%s/model.safetensors", dir);
  dg_checkpoint c = {ps, o, ctx, NULL, 2, 0, NULL, NULL};
  CHECK_OK(dg_checkpoint_save(path, &c, err, sizeof err));
  snprintf(path, sizeof path, "%s/input.f32", dir);
  ck_write_file(path, xin, sizeof xin);
  snprintf(path, sizeof path, "%s/expected.f32", dir);
  ck_write_file(path, dg_tensor_data(out), 30 * sizeof(float));
  int rc = run_python(argv[1], dir);
  const char *names[] = {"model.safetensors", "input.f32", "expected.f32"};
  for (int i = 0; i < 3; i++) snprintf(path, sizeof path, "%s/%s", dir, names[i]), unlink(path);
  rmdir(dir);
  dg_module_free(net);
  dg_optim_free(o);
  dg_params_free(ps);
  dg_ctx_free(ctx);
  if (rc == 77) TEST_SKIP("/usr/bin/python3 has no torch (apt-get install python3-torch)");
  CHECK_EQ_INT(rc, 0);
  return TEST_DONE();
}
