// A C++ rank linking Debian's libgloo for dgrad's interop test: Gloo
// FileStore rendezvous, then dg_rank.c's sequence with Gloo's own
// collectives, tags counted as ProcessGroupGloo does. Writes raw results.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <vector>

#include <gloo/allreduce.h>
#include <gloo/barrier.h>
#include <gloo/broadcast.h>
#include <gloo/math.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/file_store.h>
#include <gloo/transport/tcp/device.h>

static double f0(int r, size_t) { return r + 1; }
static double f1(int r, size_t i) { return r * (double)i + 0.5; }
static double f2(int r, size_t i) { return (r + 1) * (double)(i % 1000) / 8.0; }

int main(int argc, char **argv) {
  if (argc < 3) return 2;
  int rank = std::atoi(std::getenv("RANK")), size = std::atoi(std::getenv("WORLD_SIZE"));
  FILE *out = std::fopen(argv[1], "wb");
  try {
    gloo::transport::tcp::attr attr("127.0.0.1");
    auto dev = gloo::transport::tcp::CreateDevice(attr);
    gloo::rendezvous::FileStore fs(argv[2]);
    auto ctx = std::make_shared<gloo::rendezvous::Context>(rank, size);
    ctx->setTimeout(std::chrono::seconds(60));
    ctx->connectFullMesh(fs, dev);
    uint32_t tag = 0;
    using fn_t = double (*)(int, size_t);
    struct { size_t n; fn_t f; } seq[] = {{0, f0}, {1, f0}, {5, f1}, {1000001, f2}};
    for (auto &s : seq) {
      std::vector<float> b(s.n);
      for (size_t i = 0; i < s.n; i++) b[i] = (float)s.f(rank, i);
      if (s.n > 0) {  // Gloo rejects empty allreduces; torch skips them but takes a tag
        gloo::AllreduceOptions o(ctx);
        o.setOutput(b.data(), s.n);
        o.setReduceFunction(static_cast<void (*)(void *, const void *, const void *, size_t)>(
            &gloo::sum<float>));
        o.setTag(tag);
        gloo::allreduce(o);
      }
      tag++;
      for (size_t i = 0; i < s.n; i++) {
        double want = 0;
        for (int q = 0; q < size; q++) want += s.f(q, i);
        if (b[i] != (float)want) {
          std::fprintf(stderr, "gloo rank %d: allreduce %zu wrong at %zu\n", rank, s.n, i);
          return 1;
        }
      }
      if (s.n) std::fwrite(b.data(), 4, s.n, out);
    }
    std::vector<float> bc(1000);
    for (int i = 0; i < 1000; i++) bc[i] = rank == size - 1 ? i * 2 + 0.25f : 0;
    gloo::BroadcastOptions bo(ctx);
    bo.setOutput(bc.data(), bc.size());
    bo.setRoot(size - 1);
    bo.setTag(tag++);
    gloo::broadcast(bo);
    std::fwrite(bc.data(), 4, bc.size(), out);
    gloo::BarrierOptions ba(ctx);
    ba.setTag(tag++);
    gloo::barrier(ba);
    std::vector<float> b(5);
    for (size_t i = 0; i < 5; i++) b[i] = (float)f1(rank, i);
    gloo::AllreduceOptions o(ctx);
    o.setOutput(b.data(), 5);
    o.setReduceFunction(
        static_cast<void (*)(void *, const void *, const void *, size_t)>(&gloo::sum<float>));
    o.setTag(tag++);
    gloo::allreduce(o);
    std::fwrite(b.data(), 4, 5, out);
    std::fclose(out);
    gloo::BarrierOptions ba2(ctx);
    ba2.setTag(tag++);
    gloo::barrier(ba2);
  } catch (const std::exception &e) {
    std::fprintf(stderr, "gloo rank %d: %s\n", rank, e.what());
    return 1;
  }
  return 0;
}
