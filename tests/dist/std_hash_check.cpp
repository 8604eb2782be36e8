// Checks dgrad's copy of libstdc++'s std::hash<std::string> (Gloo's
// FileStore names files with it) against the real one.
#include <cstdint>
#include <cstdio>
#include <functional>
#include <string>

extern "C" uint64_t dg__std_hash_bytes(const void *p, size_t len, uint64_t seed);

int main() {
  int bad = 0;
  std::string s;
  for (int i = 0; i < 300; i++) {
    uint64_t want = std::hash<std::string>{}(s);
    uint64_t got = dg__std_hash_bytes(s.data(), s.size(), 0xc70f6907UL);
    if (want != got) {
      std::fprintf(stderr, "FAIL len %zu: %llu vs %llu\n", s.size(),
                   (unsigned long long)want, (unsigned long long)got);
      bad++;
    }
    s.push_back(static_cast<char>((i * 131 + 7) & 0xff));
  }
  for (const char *k : {"0", "1", "rank_0", "/default_pg/0/0/1", "0/1"}) {
    std::string ks(k);
    if (std::hash<std::string>{}(ks) != dg__std_hash_bytes(k, ks.size(), 0xc70f6907UL)) bad++;
  }
  std::fprintf(stderr, bad ? "%d mismatches\n" : "ok\n", bad);
  return bad ? 1 : 0;
}
