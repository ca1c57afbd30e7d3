/* Rung 6 of lab 03's INT4 GEMV ladder (labkit.quant.kernels_c builds it, labkit.quant.kernels calls it).

   Plain C that this machine's own compiler turns into SIMD code for its own CPU (-O3 -march=native): LANES
   floats per vector, 16 where the CPU has AVX-512, else 8 (two AVX2 or NEON registers hold 8 floats or
   fewer, and wider vectors than the registers make GCC keep them in memory). It reads a second layout of
   the codes, made for those lanes (kernels.pack_weight lays it out once, as torch lays out its int4pack
   weight for its own kernel):

       words uint32 [N, ceil(K / (8 LANES)), LANES]: lane l of chunk c holds 8 nibbles; nibble t (bits
       4t..4t+3) is the code + 8 of input c * 8 LANES + t LANES + l      (step t: LANES consecutive inputs)

   so that a shift and a mask give LANES consecutive codes at once, with no widening of bytes. Each nibble
   becomes a float without a conversion instruction: ORed into the fraction bits of 1.0f it reads as
   f = 1 + nibble / 16 (the bit trick of GPU kernels such as FasterTransformer's and Marlin), and

       sum_k nibble_k x_k = 16 sum_k f_k x_k - 16 sum_k x_k, so with code = nibble - 8:
       y[m, n] = sum_g 16 scale[n, g] sum_{k in g} f_k x[m, k]  -  sum_g scale[n, g] (24 + zero[n, g]) x_sums[m, g]

   Two steps at a time lie in one group, and a group holds 2**log_steps steps (log_steps >= 1: groups of
   32 * 2**j inputs, kernels.py refuses others), so a step's group is one shift away. Four vector sums are
   carried along a row and added up once at its end (no sum per group). Rows are shared out over `threads`
   OpenMP threads; without OpenMP the pragma is ignored and one thread runs. x float32 [M, K]; x_sums
   float32 [M, G] (x summed per group); scale, zero float32 [N, G]; y float32 [M, N] (written). */

#include <stdint.h>
#include <string.h>

#if defined(__AVX512F__)
#define LANES 16
#else
#define LANES 8
#endif
typedef uint32_t words_v __attribute__((vector_size(4 * LANES))); /* GCC/clang vectors: the compiler maps */
typedef float floats_v __attribute__((vector_size(4 * LANES)));   /* them onto the CPU's SIMD registers */

int int4_gemv_lanes(void) { return LANES; } /* the layout kernels_c.words must write */

static words_v load_words(const uint32_t *p) { words_v v; memcpy(&v, p, sizeof v); return v; }
static floats_v load_floats(const float *p) { floats_v v; memcpy(&v, p, sizeof v); return v; }

/* nibble t of each lane (0..15) as the float 1 + nibble / 16: moved to the top 4 of the 23 fraction bits
   (19..22) and ORed into the bit pattern of 1.0f (0x3F800000) */
static inline floats_v one_plus_sixteenth(words_v w, int t) {
    words_v at19 = t < 5 ? w << (19 - 4 * t) : w >> (4 * t - 19);
    words_v bits = (at19 & (15u << 19)) | 0x3F800000u;
    floats_v f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

/* steps 2p and 2p + 1 of a chunk (w: its word; xc: its inputs), both in one group: sum of f * x per lane */
static inline floats_v pair(words_v w, int p, const float *xc) {
    return one_plus_sixteenth(w, 2 * p) * load_floats(xc + 2 * p * LANES)
         + one_plus_sixteenth(w, 2 * p + 1) * load_floats(xc + (2 * p + 1) * LANES);
}

/* sum_g scale * sum_{k in g} f_k x_k over a row (row: its words; x: the inputs). Four sums in flight (one
   would wait for the previous add every step), as four variables: in an array they would end up in memory */
static float row_sum(const uint32_t *row, const float *s_row, const float *x, int64_t chunks, int64_t full,
                     int64_t steps, int log_steps) {
    floats_v acc0 = {0}, acc1 = {0}, acc2 = {0}, acc3 = {0};
    for (int64_t c = 0; c < full; c++) {
        const words_v w = load_words(row + c * LANES);
        const float *xc = x + c * 8 * LANES, *sc = s_row + ((c * 8) >> log_steps);
        acc0 += sc[0] * pair(w, 0, xc);
        acc1 += sc[2 >> log_steps] * pair(w, 1, xc);
        acc2 += sc[4 >> log_steps] * pair(w, 2, xc);
        acc3 += sc[6 >> log_steps] * pair(w, 3, xc);
    }
    if (full < chunks) { /* the last chunk when K is not a multiple of 8 LANES: 1 to 3 pairs */
        const words_v w = load_words(row + full * LANES);
        const float *xc = x + full * 8 * LANES, *sc = s_row + ((full * 8) >> log_steps);
        const int64_t pairs = (steps - 8 * full) / 2;
        acc0 += sc[0] * pair(w, 0, xc);
        if (pairs > 1) acc1 += sc[2 >> log_steps] * pair(w, 1, xc);
        if (pairs > 2) acc2 += sc[4 >> log_steps] * pair(w, 2, xc);
    }
    const floats_v sums = (acc0 + acc1) + (acc2 + acc3);
    float total = 0.0f;
    for (int l = 0; l < LANES; l++)
        total += sums[l];
    return total;
}

/* sum_g scale * (24 + zero) * x_sums over a row's groups, LANES groups at a time */
static float offsets(const float *s, const float *z, const float *xs, int64_t groups) {
    floats_v acc = {0};
    int64_t g = 0;
    for (; g + LANES <= groups; g += LANES)
        acc += load_floats(s + g) * (24.0f + load_floats(z + g)) * load_floats(xs + g);
    float total = 0.0f;
    for (int l = 0; l < LANES; l++)
        total += acc[l];
    for (; g < groups; g++)
        total += s[g] * (24.0f + z[g]) * xs[g];
    return total;
}

void int4_gemv(const float *x, const float *x_sums, const uint32_t *words, const float *scale,
               const float *zero, int64_t m_rows, int64_t n_rows, int64_t k, int64_t groups, int log_steps,
               int threads, float *y) {
    const int64_t steps = k / LANES, chunks = (steps + 7) / 8, full = steps / 8; /* a chunk: 8 steps */
#pragma omp parallel for num_threads(threads) schedule(static)
    for (int64_t n = 0; n < n_rows; n++) {
        const float *s_row = scale + n * groups, *z_row = zero + n * groups;
        for (int64_t m = 0; m < m_rows; m++) {
            const float total = row_sum(words + n * chunks * LANES, s_row, x + m * k, chunks, full, steps, log_steps);
            y[m * n_rows + n] = 16.0f * total - offsets(s_row, z_row, x_sums + m * groups, groups);
        }
    }
}
