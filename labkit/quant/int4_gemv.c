/* Rung 6 of lab 03's INT4 GEMV ladder (labkit.quant.kernels_c builds it, labkit.quant.kernels calls it).

   Plain C that this machine's own compiler turns into SIMD code for its own CPU (-O3 -march=native): LANES
   floats per vector, 16 where the CPU has AVX-512, else 8 (wider vectors than the registers make GCC keep
   them in memory). Output rows sit in the lanes, as in torch's own AVX-512 kernel: one input x[k], broadcast,
   multiplies the codes of LANES rows at once, and nothing is ever summed across lanes. kernels_c.lay_out
   writes the layout once per weight (as torch lays out its int4pack weight):

       words  uint32 [ceil(N / LANES), K / 8, LANES]: block b, word j, lane l holds the 8 nibbles of row
              b * LANES + l, inputs 8j .. 8j+7 (nibble t, bits 4t..4t+3 = code + 8 of input 8j + t)
       scale  float32 [ceil(N / LANES), G, LANES]: scale[n, g] of row n = b * LANES + l
       offset float32 [ceil(N / LANES), G, LANES]: scale * (24 + zero) of the same row and group

   A nibble becomes a float without a conversion instruction: ORed into the fraction bits of 1.0f it reads
   as f = 1 + nibble / 16 (the bit trick of GPU kernels such as FasterTransformer's and Marlin), and

       sum_k nibble_k x_k = 16 sum_k f_k x_k - 16 sum_k x_k, and with w = (code - zero) scale, code = nibble - 8:
       y[m, n] = sum_g scale (sum_{k in g} nibble_k x_k - (8 + zero) x_sums[m, g])
               = sum_g 16 scale[n, g] sum_{k in g} f_k x[m, k]  -  sum_g offset[n, g] x_sums[m, g]
       with offset = scale (24 + zero): 24 = 8 (the nibble's offset) + 16 (the 1 in f, times 16)

   A group holds a whole number of words (group length a multiple of 8: kernels.py refuses others). Row
   blocks are shared out over `threads` OpenMP threads; without OpenMP the pragma is ignored and one thread
   runs. x float32 [M, K]; x_sums float32 [M, G] (x summed per group); y float32 [M, N] (written). */

#include <stdint.h>
#include <string.h>

#if defined(__AVX512F__)
#define LANES 16
#else
#define LANES 8
#endif
typedef uint32_t words_v __attribute__((vector_size(4 * LANES))); /* GCC/clang vectors: the compiler maps */
typedef float floats_v __attribute__((vector_size(4 * LANES)));   /* them onto the CPU's SIMD registers */

int int4_gemv_lanes(void) { return LANES; } /* the layout kernels_c.lay_out must write */

static words_v load_words(const uint32_t *p) { words_v v; memcpy(&v, p, sizeof v); return v; }
static floats_v load_floats(const float *p) { floats_v v; memcpy(&v, p, sizeof v); return v; }

/* nibble t of each lane (0..15) as the float 1 + nibble / 16: moved to the top 4 of the 23 fraction bits
   (19..22) and ORed into the bit pattern of 1.0f (0x3F800000). Nibble 5: 0x3F800000 | 5 << 19 = 0x3FA80000,
   the float 1.3125 = 1 + 5/16 (each fraction bit 19..22 is worth 1/16, 1/8, 1/4, 1/2). */
static inline floats_v one_plus_sixteenth(words_v w, int t) {
    words_v at19 = t < 5 ? w << (19 - 4 * t) : w >> (4 * t - 19);
    words_v bits = (at19 & (15u << 19)) | 0x3F800000u;
    floats_v f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

/* LANES rows' sum over one group of sum_k f_k x_k (words: the group's first word; x: its first input) */
static inline floats_v group_sum(const uint32_t *words, const float *x, int64_t words_per_group) {
    floats_v part0 = {0}, part1 = {0}; /* two sums in flight: one would wait for the previous add */
    for (int64_t j = 0; j < words_per_group; j++) {
        const words_v w = load_words(words + j * LANES);
        const float *xj = x + 8 * j;
        for (int t = 0; t < 8; t += 2) { /* the compiler unrolls this: constant shifts */
            part0 += one_plus_sixteenth(w, t) * xj[t];
            part1 += one_plus_sixteenth(w, t + 1) * xj[t + 1];
        }
    }
    return part0 + part1;
}

void int4_gemv(const float *x, const float *x_sums, const uint32_t *words, const float *scale,
               const float *offset, int64_t m_rows, int64_t n_rows, int64_t k, int64_t groups, int threads,
               float *y) {
    const int64_t blocks = (n_rows + LANES - 1) / LANES, words_per_group = k / groups / 8;
#pragma omp parallel for num_threads(threads) schedule(static)
    for (int64_t b = 0; b < blocks; b++) {
        const uint32_t *block = words + b * (k / 8) * LANES;
        const float *s = scale + b * groups * LANES, *o = offset + b * groups * LANES;
        for (int64_t m = 0; m < m_rows; m++) {
            const float *xm = x + m * k, *xs = x_sums + m * groups;
            floats_v acc = {0}, off = {0};
            for (int64_t g = 0; g < groups; g++) {
                const floats_v sums = group_sum(block + g * words_per_group * LANES, xm + g * 8 * words_per_group,
                                                words_per_group);
                acc += load_floats(s + g * LANES) * sums;
                off += load_floats(o + g * LANES) * xs[g];
            }
            const floats_v rows = 16.0f * acc - off;
            for (int l = 0; l < LANES && b * LANES + l < n_rows; l++)
                y[m * n_rows + b * LANES + l] = rows[l];
        }
    }
}
