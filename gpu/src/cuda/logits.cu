// Fused logit analytics on the GPU: per row of logits [T, V] the top-k ids and
// log-probabilities, log-sum-exp, entropy, and KL(p || q) against a second
// logit set, reading each input row once.
//
// Compiled by NVRTC at first use (no #include: NVRTC may have no headers).
// One block of BLOCK threads per row. Each thread streams a strided share of
// the row with 16-byte loads and keeps the same accumulators as the CPU pass
// (gpu/src/logits/fused.rs, whose module comment derives them):
//   m       running max of p               n_max, s_rest  sum exp(x - m), split
//   a       sum e (x - m)                  b              sum e (x - y')
//   f       sum exp(y' - m)                g              sum (exp(y' - m) - e)
// with e = exp(x - m) and y' = y - c0. Per-thread states are merged with warp
// shuffles and shared memory; per-thread top-k lists (local memory, sorted,
// ties to the lower id) are merged by k rounds of a block-wide argmax. A row
// whose q shift c0 proves misjudged is streamed once more (realigned_shift).
//
// Rows take 16-byte vector loads when p's row start can be aligned by a short
// scalar head and q is then aligned too; otherwise the whole row is scalar
// (slow but right). Status per row: 0 ok, 1 p has NaN/+inf, 2 q has NaN/+inf,
// 3 p is -inf everywhere, 4 q is -inf everywhere. Every output slot is written.

#define BLOCK 256
#define WARPS (BLOCK / 32)
#define KMAX 20
#define D_FLOOR (-1000.0f)
#define OVER 80.0f
#define F_UNDERFLOW 1e-25f
#define REALIGN 2.0f
#define MAX_SHIFT 16777216.0f
#define LOG2E 1.4426950408889634f
#define LOG2E_LO 1.925963033500011e-8f
#define LN2 0.6931471805599453f

typedef unsigned short bf16_t;
typedef unsigned int u32;

__device__ __forceinline__ float neg_inf() { return __int_as_float(0xff800000); }
__device__ __forceinline__ float pos_inf() { return __int_as_float(0x7f800000); }

// 2^x on the special-function unit (about 2 ulp; 0 below -126 with ftz).
// CUDA_EMULATION: gpu/bench/emulate/ runs this file as C++ on the CPU.
#ifdef CUDA_EMULATION
__device__ __forceinline__ float ex2_approx(float x) { return exp2f(x); }
#else
__device__ __forceinline__ float ex2_approx(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}
#endif

// exp(d) for d in [-1000, OVER]. The product d * log2(e) is carried to twice
// float precision (its rounding error would otherwise add |d| * 6e-8 relative
// error, which the KL difference terms feel), then corrected after ex2.
__device__ __forceinline__ float exp_acc(float d) {
    float hi = d * LOG2E;
    float lo = fmaf(d, LOG2E, -hi);
    lo = fmaf(d, LOG2E_LO, lo);
    float e = ex2_approx(hi);
    return fmaf(e, lo * LN2, e);
}

__device__ __forceinline__ float widen(float v) { return v; }
__device__ __forceinline__ float widen(bf16_t v) { return __uint_as_float(((u32)v) << 16); }

// W consecutive elements from an address aligned to W * sizeof(T) bytes.
template <int W, typename T> struct Load;
template <> struct Load<4, float> {
    static __device__ __forceinline__ void run(const float* ptr, float* out) {
        float4 v = __ldg(reinterpret_cast<const float4*>(ptr));
        out[0] = v.x; out[1] = v.y; out[2] = v.z; out[3] = v.w;
    }
};
template <> struct Load<8, float> {
    static __device__ __forceinline__ void run(const float* ptr, float* out) {
        Load<4, float>::run(ptr, out);
        Load<4, float>::run(ptr + 4, out + 4);
    }
};
template <> struct Load<4, bf16_t> {
    static __device__ __forceinline__ void run(const bf16_t* ptr, float* out) {
        uint2 v = __ldg(reinterpret_cast<const uint2*>(ptr));
        out[0] = __uint_as_float(v.x << 16); out[1] = __uint_as_float(v.x & 0xffff0000u);
        out[2] = __uint_as_float(v.y << 16); out[3] = __uint_as_float(v.y & 0xffff0000u);
    }
};
template <> struct Load<8, bf16_t> {
    static __device__ __forceinline__ void run(const bf16_t* ptr, float* out) {
        uint4 v = __ldg(reinterpret_cast<const uint4*>(ptr));
        out[0] = __uint_as_float(v.x << 16); out[1] = __uint_as_float(v.x & 0xffff0000u);
        out[2] = __uint_as_float(v.y << 16); out[3] = __uint_as_float(v.y & 0xffff0000u);
        out[4] = __uint_as_float(v.z << 16); out[5] = __uint_as_float(v.z & 0xffff0000u);
        out[6] = __uint_as_float(v.w << 16); out[7] = __uint_as_float(v.w & 0xffff0000u);
    }
};

// Flags, OR-ed together across threads.
#define F_BAD_P 1
#define F_BAD_Q 2
#define F_Q_ZERO 4
#define F_Q_FAR 8
#define F_Q_FINITE 16

struct State {
    float m, n_max, s_rest, a, b, f, g;
    float pend_m, pend_s;  // q mass met while this thread's p was all -inf (base pend_m, y' units)
    int flags;
};

__device__ __forceinline__ void state_init(State& s) {
    s.m = neg_inf(); s.n_max = 0.f; s.s_rest = 0.f; s.a = 0.f; s.b = 0.f; s.f = 0.f; s.g = 0.f;
    s.pend_m = neg_inf(); s.pend_s = 0.f; s.flags = 0;
}

// Move the pending q mass onto p's base m (finite).
__device__ __forceinline__ void fold_pending(State& s) {
    if (s.pend_s > 0.f) {
        float arg = s.pend_m - s.m;
        if (arg > OVER) {
            s.flags |= F_Q_FAR;
        } else {
            float add = s.pend_s * exp_acc(fmaxf(arg, D_FLOOR));
            s.f += add;
            s.g += add;
        }
        s.pend_s = 0.f;
        s.pend_m = neg_inf();
    }
}

// v * exp(dm) for q's sums (b, f, g) when p's base rises by -dm, given
// c = exp(dm) as computed. Where c is 0 (dm < -87) the product may still
// count, since f may sit up to e^OVER above the base: it is then taken in
// two halves.
__device__ __forceinline__ float scale_q(float v, float c, float dm) {
    if (c != 0.f) return c * v;
    float half = exp_acc(fmaxf(0.5f * dm, D_FLOOR));
    return (v * half) * half;
}

// p's running max rises to new_m (rare after the first few vectors).
__device__ __forceinline__ void raise_p(State& s, float new_m) {
    if (s.m != neg_inf()) {
        float dm = s.m - new_m;
        float c = exp_acc(fmaxf(dm, D_FLOOR));
        if (c == 0.f) {
            // p's own sums are negligible next to the new max; q's may not be.
            s.n_max = 0.f; s.s_rest = 0.f; s.a = 0.f;
            s.b = scale_q(s.b, 0.f, dm); s.f = scale_q(s.f, 0.f, dm); s.g = scale_q(s.g, 0.f, dm);
        } else {
            float tot = s.n_max + s.s_rest;
            s.a = c * (s.a + dm * tot);
            s.s_rest = c * tot;
            s.n_max = 0.f;
            s.b *= c; s.f *= c; s.g *= c;
        }
        s.m = new_m;
    } else {
        s.m = new_m;
        fold_pending(s);
    }
}

__device__ __forceinline__ void add_pending(State& s, float y) {
    if (y > neg_inf()) {
        if (y > s.pend_m) {
            s.pend_s = (s.pend_m == neg_inf()) ? 0.f : s.pend_s * exp_acc(fmaxf(s.pend_m - y, D_FLOOR));
            s.pend_m = y;
        }
        s.pend_s += exp_acc(fmaxf(y - s.pend_m, D_FLOOR));
    }
}

// A thread's top-k list, best first. It lives in local memory (indexed at
// run time); its length and entry threshold stay in registers.
struct TopK {
    float v[KMAX];
    int id[KMAX];
};

// Insert x for id (ids arrive in increasing order; x > the threshold) into a
// list of `len` entries; returns the new threshold (a value must be strictly
// greater to enter). Equal values keep their order, so the lower id wins.
__device__ __noinline__ float topk_insert(TopK& t, int k, int& len, float x, int id) {
    int i;
    if (len < k) { i = len; len += 1; } else { i = k - 1; }
    while (i > 0 && t.v[i - 1] < x) {
        t.v[i] = t.v[i - 1];
        t.id[i] = t.id[i - 1];
        i -= 1;
    }
    t.v[i] = x;
    t.id[i] = id;
    return (len < k) ? neg_inf() : t.v[k - 1];
}

// W elements of p (and q) starting at token id0.
template <int W, bool PAIR>
__device__ __forceinline__ void consume(State& s, TopK& t, int k, int& len, float& thr, const float* xs,
                                        const float* ys, float c0, int id0) {
    float vmax = neg_inf();
    #pragma unroll
    for (int j = 0; j < W; ++j) {
        vmax = fmaxf(vmax, xs[j]);
        if (!(xs[j] < pos_inf())) s.flags |= F_BAD_P;
        if (PAIR) {
            if (!(ys[j] < pos_inf())) s.flags |= F_BAD_Q;
            if (ys[j] > neg_inf()) s.flags |= F_Q_FINITE;
        }
    }
    if (vmax > s.m) raise_p(s, vmax);
    if (PAIR && s.m == neg_inf()) {
        #pragma unroll
        for (int j = 0; j < W; ++j) {
            float y = ys[j] - c0;
            if (y < pos_inf()) add_pending(s, y);
        }
        return;
    }
    const float m = s.m;
    float n_max = 0.f, s_rest = 0.f, a = 0.f, b = 0.f, f = 0.f, g = 0.f;
    #pragma unroll
    for (int j = 0; j < W; ++j) {
        float x = xs[j];
        float d = fmaxf(x - m, D_FLOOR);  // NaN (from -inf - -inf) becomes D_FLOOR
        float e = exp_acc(d);
        bool at_max = d == 0.f;
        n_max += at_max ? 1.f : 0.f;
        s_rest += at_max ? 0.f : e;
        a = fmaf(e, d, a);
        if (PAIR) {
            float y = ys[j] - c0;
            float df = y - m;
            bool over = df > OVER;
            float fe = over ? 0.f : exp_acc(fminf(fmaxf(df, D_FLOOR), OVER));
            f += fe;
            g += fe - e;
            b += (e > 0.f) ? e * (x - y) : 0.f;
            if (over) s.flags |= F_Q_FAR;
            if (x > neg_inf() && ys[j] == neg_inf()) s.flags |= F_Q_ZERO;
        }
    }
    s.n_max += n_max; s.s_rest += s_rest; s.a += a;
    if (PAIR) { s.b += b; s.f += f; s.g += g; }
    if (vmax > thr) {
        #pragma unroll
        for (int j = 0; j < W; ++j) {
            if (xs[j] > thr) thr = topk_insert(t, k, len, xs[j], id0 + j);
        }
    }
}

// Merge state o into s (p's maxima may differ; pending q mass merges on its own base).
__device__ __forceinline__ void merge(State& s, const State& o) {
    float M = fmaxf(s.m, o.m);
    if (M != neg_inf()) {
        float tot_s = s.n_max + s.s_rest, tot_o = o.n_max + o.s_rest;
        float cs = (s.m == neg_inf()) ? 0.f : exp_acc(fmaxf(s.m - M, D_FLOOR));
        float co = (o.m == neg_inf()) ? 0.f : exp_acc(fmaxf(o.m - M, D_FLOOR));
        float n_max = (s.m == M ? s.n_max : 0.f) + (o.m == M ? o.n_max : 0.f);
        float s_rest = (s.m == M ? s.s_rest : cs * tot_s) + (o.m == M ? o.s_rest : co * tot_o);
        float as = (s.m == M) ? s.a : (cs == 0.f ? 0.f : cs * (s.a + (s.m - M) * tot_s));
        float ao = (o.m == M) ? o.a : (co == 0.f ? 0.f : co * (o.a + (o.m - M) * tot_o));
        s.n_max = n_max;
        s.s_rest = s_rest;
        s.a = as + ao;
        // 0 where that side's p is all -inf (its q sums are then 0 too).
        float ds = (s.m == neg_inf()) ? D_FLOOR : s.m - M, d_o = (o.m == neg_inf()) ? D_FLOOR : o.m - M;
        s.b = scale_q(s.b, cs, ds) + scale_q(o.b, co, d_o);
        s.f = scale_q(s.f, cs, ds) + scale_q(o.f, co, d_o);
        s.g = scale_q(s.g, cs, ds) + scale_q(o.g, co, d_o);
        s.m = M;
    }
    // pending q sums: an online merge on their own maxima
    float P = fmaxf(s.pend_m, o.pend_m);
    if (P != neg_inf()) {
        float ps = (s.pend_m == neg_inf()) ? 0.f : s.pend_s * exp_acc(fmaxf(s.pend_m - P, D_FLOOR));
        float po = (o.pend_m == neg_inf()) ? 0.f : o.pend_s * exp_acc(fmaxf(o.pend_m - P, D_FLOOR));
        s.pend_s = ps + po;
        s.pend_m = P;
    }
    s.flags |= o.flags;
}

__device__ __forceinline__ State shfl_state(const State& s, int mask) {
    State o;
    o.m = __shfl_xor_sync(0xffffffffu, s.m, mask);
    o.n_max = __shfl_xor_sync(0xffffffffu, s.n_max, mask);
    o.s_rest = __shfl_xor_sync(0xffffffffu, s.s_rest, mask);
    o.a = __shfl_xor_sync(0xffffffffu, s.a, mask);
    o.b = __shfl_xor_sync(0xffffffffu, s.b, mask);
    o.f = __shfl_xor_sync(0xffffffffu, s.f, mask);
    o.g = __shfl_xor_sync(0xffffffffu, s.g, mask);
    o.pend_m = __shfl_xor_sync(0xffffffffu, s.pend_m, mask);
    o.pend_s = __shfl_xor_sync(0xffffffffu, s.pend_s, mask);
    o.flags = __shfl_xor_sync(0xffffffffu, s.flags, mask);
    return o;
}

// The whole block's state, valid in every thread afterwards.
__device__ __forceinline__ State block_merge(State s, State* scratch) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    #pragma unroll
    for (int mask = 16; mask > 0; mask >>= 1) merge(s, shfl_state(s, mask));
    if (lane == 0) scratch[warp] = s;
    __syncthreads();
    if (warp == 0) {
        State w;
        if (lane < WARPS) w = scratch[lane]; else state_init(w);
        #pragma unroll
        for (int mask = 16; mask > 0; mask >>= 1) merge(w, shfl_state(w, mask));
        if (lane == 0) scratch[WARPS] = w;
    }
    __syncthreads();
    State out = scratch[WARPS];
    __syncthreads();
    return out;
}

// The shift to stream the row again with when c0 left q misaligned with p
// (the CPU's RowState::realigned_shift): |b / S| = |E_p[x - y']| over
// REALIGN, q's mass underflowing on p's base, or q far above it. c0 itself
// where the row is fine (or bad, or KL is +inf anyway).
__device__ __forceinline__ float realigned_shift(const State& r, float c0) {
    if ((r.flags & (F_BAD_P | F_BAD_Q | F_Q_ZERO)) || !(r.flags & F_Q_FINITE) || r.m == neg_inf()) return c0;
    const float mean = r.b / (r.n_max + r.s_rest);
    if (!((r.flags & F_Q_FAR) || r.f < F_UNDERFLOW || fabsf(mean) > REALIGN)) return c0;
    const float c1 = roundf(c0 - mean);
    return (fabsf(c1) < MAX_SHIFT) ? c1 : c0;
}

// (value, id) order: larger value first, then lower id.
__device__ __forceinline__ bool better(float v1, int i1, float v2, int i2) {
    return v1 > v2 || (v1 == v2 && i1 < i2);
}

__device__ __forceinline__ float block_max(float v, float* scratch) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    #pragma unroll
    for (int mask = 16; mask > 0; mask >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, mask));
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    float r = neg_inf();
    #pragma unroll
    for (int w = 0; w < WARPS; ++w) r = fmaxf(r, scratch[w]);
    __syncthreads();
    return r;
}

__device__ __forceinline__ float block_sum(float v, float* scratch) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    #pragma unroll
    for (int mask = 16; mask > 0; mask >>= 1) v += __shfl_xor_sync(0xffffffffu, v, mask);
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    float r = 0.f;
    #pragma unroll
    for (int w = 0; w < WARPS; ++w) r += scratch[w];
    __syncthreads();
    return r;
}

template <typename TP, typename TQ, int W, bool PAIR>
__device__ __forceinline__ void logit_stats(
    const TP* __restrict__ p, const TQ* __restrict__ q, int V, int k,
    float* __restrict__ out_lse, float* __restrict__ out_entropy, float* __restrict__ out_kl,
    int* __restrict__ out_status, int* __restrict__ out_count, int* __restrict__ out_ids,
    float* __restrict__ out_logprobs)
{
    __shared__ State scratch[WARPS + 1];
    __shared__ float fscratch[WARPS];
    __shared__ float win_v[WARPS];
    __shared__ int win_i[WARPS];
    __shared__ float winner_v;
    __shared__ int winner_i;

    const int row = blockIdx.x;
    const int tid = threadIdx.x;
    const TP* prow = p + (size_t)row * (size_t)V;
    const TQ* qrow = PAIR ? q + (size_t)row * (size_t)V : nullptr;

    // q's shift c0 (the CPU's q_shift over the first 256 entries): q as
    // log-probabilities sits about lse below p, and unshifted, b / S and
    // ln(F / S) would be two large terms whose rounding swamps a small KL.
    float c0 = 0.f;
    if (PAIR) {
        float mx = neg_inf(), my = neg_inf();
        for (int i = tid; i < V && i < 256; i += BLOCK) {
            float x = widen(prow[i]), y = widen(qrow[i]);
            if (x > mx) mx = x;
            if (y > my) my = y;
        }
        mx = block_max(mx, fscratch);
        my = block_max(my, fscratch);
        float shift = my - mx;
        if (mx > neg_inf() && my > neg_inf() && isfinite(shift)) c0 = roundf(shift);
    }

    // Alignment: a scalar head brings p to a W * sizeof(TP) boundary.
    const size_t align_p = W * sizeof(TP), align_q = W * sizeof(TQ);
    size_t mis = ((size_t)prow) % align_p;
    int head = mis ? (int)((align_p - mis) / sizeof(TP)) : 0;
    bool vec_ok = head <= V;
    if (PAIR && vec_ok) vec_ok = (((size_t)(qrow + head)) % align_q) == 0;
    if (!vec_ok) head = V;
    const int nvec = (V - head) / W;
    const int tail = head + nvec * W;

    State r;
    TopK t;
    int len;
    float thr;
    // A second pass only where the probe misjudged q's shift (realigned_shift).
    for (int pass = 0;; ++pass) {
        State s;
        state_init(s);
        len = 0;
        thr = (k == 0) ? pos_inf() : neg_inf();

        float xs[W], ys[W];
        for (int i = tid; i < head; i += BLOCK) {
            xs[0] = widen(prow[i]);
            ys[0] = PAIR ? widen(qrow[i]) : 0.f;
            consume<1, PAIR>(s, t, k, len, thr, xs, ys, c0, i);
        }
        for (int v = tid; v < nvec; v += BLOCK) {
            const int i = head + v * W;
            Load<W, TP>::run(prow + i, xs);
            if (PAIR) Load<W, TQ>::run(qrow + i, ys);
            consume<W, PAIR>(s, t, k, len, thr, xs, ys, c0, i);
        }
        for (int i = tail + tid; i < V; i += BLOCK) {
            xs[0] = widen(prow[i]);
            ys[0] = PAIR ? widen(qrow[i]) : 0.f;
            consume<1, PAIR>(s, t, k, len, thr, xs, ys, c0, i);
        }

        r = block_merge(s, scratch);
        // q mass no thread could place (its p was all -inf) lands on the row's base.
        if (PAIR && r.m != neg_inf()) fold_pending(r);
        if (!PAIR || pass == 1) break;
        const float c1 = realigned_shift(r, c0);  // the same in every thread
        if (c1 == c0) break;
        c0 = c1;
    }

    int status = 0;
    if (r.flags & F_BAD_P) status = 1;
    else if (PAIR && (r.flags & F_BAD_Q)) status = 2;
    else if (r.m == neg_inf()) status = 3;
    else if (PAIR && !(r.flags & F_Q_FINITE)) status = 4;

    float S = r.n_max + r.s_rest;
    float ln_s = (r.n_max == 1.f) ? log1pf(r.s_rest) : logf(S);
    float lse = r.m + ln_s;
    float kl = 0.f;
    if (PAIR && status == 0) {
        if (r.flags & F_Q_ZERO) {
            kl = pos_inf();
        } else if ((r.flags & F_Q_FAR) || r.f < F_UNDERFLOW) {
            // The rare second pass: q's own log-sum-exp (block-uniform branch).
            float mq = neg_inf();
            for (int i = tid; i < V; i += BLOCK) mq = fmaxf(mq, widen(qrow[i]));
            mq = block_max(mq, fscratch);
            float sq = 0.f;
            for (int i = tid; i < V; i += BLOCK) sq += exp_acc(fmaxf(widen(qrow[i]) - mq, D_FLOOR));
            sq = block_sum(sq, fscratch);
            kl = r.b / S - c0 + (mq + logf(sq)) - lse;
        } else {
            float gs = r.g / S;
            kl = r.b / S + (fabsf(gs) < 0.5f ? log1pf(gs) : logf(r.f / S));
        }
        kl = fmaxf(kl, 0.f);
    }

    // Top-k: k rounds of a block-wide argmax over the threads' list heads.
    const int lane = tid & 31, warp = tid >> 5;
    int h = 0, taken = 0;
    for (int round = 0; round < k; ++round) {
        float v = (h < len) ? t.v[h] : neg_inf();
        int id = (h < len) ? t.id[h] : 0x7fffffff;
        #pragma unroll
        for (int mask = 16; mask > 0; mask >>= 1) {
            float v2 = __shfl_xor_sync(0xffffffffu, v, mask);
            int id2 = __shfl_xor_sync(0xffffffffu, id, mask);
            if (better(v2, id2, v, id)) { v = v2; id = id2; }
        }
        if (lane == 0) { win_v[warp] = v; win_i[warp] = id; }
        __syncthreads();
        if (tid == 0) {
            float bv = win_v[0];
            int bi = win_i[0];
            for (int w = 1; w < WARPS; ++w) {
                if (better(win_v[w], win_i[w], bv, bi)) { bv = win_v[w]; bi = win_i[w]; }
            }
            winner_v = bv;
            winner_i = bi;
        }
        __syncthreads();
        const float wv = winner_v;
        const int wi = winner_i;
        __syncthreads();
        if (wv == neg_inf()) break;  // fewer than k finite logits: block-uniform
        if (h < len && t.id[h] == wi) h += 1;
        if (tid == 0) {
            out_ids[(size_t)row * k + round] = wi;
            out_logprobs[(size_t)row * k + round] = wv - lse;
        }
        taken = round + 1;
    }

    if (tid == 0) {
        for (int j = taken; j < k; ++j) {
            out_ids[(size_t)row * k + j] = -1;
            out_logprobs[(size_t)row * k + j] = neg_inf();
        }
        out_count[row] = taken;
        out_status[row] = status;
        out_lse[row] = lse;
        out_entropy[row] = fmaxf(ln_s - r.a / S, 0.f);
        if (PAIR) out_kl[row] = kl;
    }
}

#define ENTRY(name, TP, TQ, W, PAIR)                                                                  \
    extern "C" __global__ void __launch_bounds__(BLOCK) name(                                         \
        const TP* __restrict__ p, const TQ* __restrict__ q, int V, int k, float* out_lse,            \
        float* out_entropy, float* out_kl, int* out_status, int* out_count, int* out_ids,            \
        float* out_logprobs) {                                                                        \
        logit_stats<TP, TQ, W, PAIR>(p, q, V, k, out_lse, out_entropy, out_kl, out_status, out_count, \
                                     out_ids, out_logprobs);                                          \
    }

ENTRY(logit_stats_f32, float, float, 4, false)
ENTRY(logit_stats_bf16, bf16_t, bf16_t, 8, false)
ENTRY(logit_stats_pair_f32_f32, float, float, 4, true)
ENTRY(logit_stats_pair_bf16_bf16, bf16_t, bf16_t, 8, true)
ENTRY(logit_stats_pair_f32_bf16, float, bf16_t, 4, true)
ENTRY(logit_stats_pair_bf16_f32, bf16_t, float, 4, true)
