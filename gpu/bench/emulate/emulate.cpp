// Runs the logit kernels of gpu/src/cuda/logits.cu on the CPU (cuda_emu.h).
// usage: emulate P_FILE P_DTYPE Q_FILE|- Q_DTYPE ROWS VOCAB K OUT_FILE
// Inputs are raw little-endian f32 or bf16 (dtype "f32" / "bf16"); the
// outputs, poisoned first like the Rust side does, are written back to back:
// lse, entropy, kl (f32 x rows), status, count (i32 x rows), ids (i32 x
// rows*k), logprobs (f32 x rows*k).
#include <cstdio>
#include <cstdlib>
#include <string>
#include "cuda_emu.h"
#include "../../src/cuda/logits.cu"

static std::vector<unsigned char> read_file(const char* path, size_t align_bytes) {
    std::vector<unsigned char> out;
    FILE* f = std::fopen(path, "rb");
    if (!f) { std::perror(path); std::exit(2); }
    std::fseek(f, 0, SEEK_END); long n = std::ftell(f); std::fseek(f, 0, SEEK_SET);
    out.resize((size_t)n + align_bytes);
    if (std::fread(out.data(), 1, (size_t)n, f) != (size_t)n) { std::perror(path); std::exit(2); }
    std::fclose(f);
    out.resize((size_t)n);
    return out;
}

// 256-byte aligned copy, as cudaMalloc gives.
static void* aligned_copy(const std::vector<unsigned char>& v) {
    void* p = std::aligned_alloc(256, ((v.size() + 255) / 256) * 256 + 256);
    std::memcpy(p, v.data(), v.size());
    return p;
}

int main(int argc, char** argv) {
    if (argc != 9) { std::fprintf(stderr, "usage: emulate P P_DTYPE Q|- Q_DTYPE ROWS VOCAB K OUT\n"); return 2; }
    const std::string pd = argv[2], qd = argv[4];
    const bool pair = std::string(argv[3]) != "-";
    const int rows = std::atoi(argv[5]), V = std::atoi(argv[6]), k = std::atoi(argv[7]);
    void* p = aligned_copy(read_file(argv[1], 0));
    void* q = pair ? aligned_copy(read_file(argv[3], 0)) : p;
    const unsigned poison_f = 0x7fc0bad0u; const int poison_i = (int)(0x80000000u + 0xbadu);
    std::vector<float> lse(rows), ent(rows), kl(rows), lp((size_t)rows * k);
    std::vector<int> status(rows, poison_i), count(rows, poison_i), ids((size_t)rows * k, poison_i);
    for (auto* v : {&lse, &ent, &kl, &lp}) for (auto& x : *v) x = __uint_as_float(poison_f);
    float* klp = pair ? kl.data() : nullptr;
    auto run = [&](auto entry, auto* pp, auto* qq) {
        launch(rows, BLOCK, [=, &lse, &ent, &status, &count, &ids, &lp] {
            entry(pp, qq, V, k, lse.data(), ent.data(), klp, status.data(), count.data(), ids.data(), lp.data());
        });
    };
    auto* pf = (const float*)p; auto* pb = (const bf16_t*)p;
    auto* qf = (const float*)q; auto* qb = (const bf16_t*)q;
    if (!pair && pd == "f32") run(logit_stats_f32, pf, pf);
    else if (!pair) run(logit_stats_bf16, pb, pb);
    else if (pd == "f32" && qd == "f32") run(logit_stats_pair_f32_f32, pf, qf);
    else if (pd == "bf16" && qd == "bf16") run(logit_stats_pair_bf16_bf16, pb, qb);
    else if (pd == "f32") run(logit_stats_pair_f32_bf16, pf, qb);
    else run(logit_stats_pair_bf16_f32, pb, qf);
    FILE* o = std::fopen(argv[8], "wb");
    if (!o) { std::perror(argv[8]); return 2; }
    std::fwrite(lse.data(), 4, rows, o); std::fwrite(ent.data(), 4, rows, o); std::fwrite(kl.data(), 4, rows, o);
    std::fwrite(status.data(), 4, rows, o); std::fwrite(count.data(), 4, rows, o);
    std::fwrite(ids.data(), 4, (size_t)rows * k, o); std::fwrite(lp.data(), 4, (size_t)rows * k, o);
    std::fclose(o);
    return 0;
}
