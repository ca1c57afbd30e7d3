/* Rungs 6 and 7 of lab 03's INT4 GEMV ladder (labkit.quant.kernels_c builds them, labkit.quant.kernels calls
   them): int4_gemv (float arithmetic, exact) and int4_gemv_int8 (x rounded to int8, integer dot products).

   Plain C that this machine's own compiler turns into SIMD code for its own CPU (-O3 -march=native): LANES
   floats per vector, 16 where the CPU has AVX-512, else 8, unless -DLANES says otherwise (wider vectors than
   the registers make GCC keep them in memory). Output rows sit in the lanes, as in torch's own AVX-512
   kernel: one input x[k], broadcast, multiplies the codes of LANES rows at once, and nothing is ever summed
   across lanes. kernels_c.lay_out writes the layout once per weight (as torch lays out its int4pack weight):

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
   blocks are shared out over `threads` OpenMP threads; without OpenMP one thread runs. x float32 [M, K];
   x_sums float32 [M, G] (x summed per group); y float32 [M, N] (written).

   Checked builds (tests/quant/test_kernels_c.py, test_kernels_c_builds.py): GCC and clang, with and without
   OpenMP, for x86-64 (8 and 16 lanes; plain C, AVX2, AVX-VNNI, AVX-512 VNNI) and aarch64 (run under qemu), all
   without a warning under -Wall -Wextra. */

#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#include <immintrin.h>
#endif
#if defined(_OPENMP)
#define PARALLEL_FOR(threads) _Pragma("omp parallel for num_threads(threads) schedule(static)")
#else
#define PARALLEL_FOR(threads) (void)(threads); /* one thread */
#endif
/* Every function that returns a vector is inlined, and none takes one by value: no vector crosses a call, whose
   ABI GCC and clang warn about in builds without AVX. */
#define INLINE static inline __attribute__((always_inline))
#pragma GCC diagnostic ignored "-Wpsabi"

#if !defined(LANES) /* -DLANES=16 builds AVX-512's layout on an AVX2 CPU as well (tests/quant/test_kernels_c.py) */
#if defined(__AVX512F__)
#define LANES 16
#else
#define LANES 8
#endif
#endif
#if LANES != 8 && LANES != 16
#error "LANES must be 8 or 16"
#endif
typedef uint32_t words_v __attribute__((vector_size(4 * LANES))); /* GCC/clang vectors: the compiler maps */
typedef float floats_v __attribute__((vector_size(4 * LANES)));   /* them onto the CPU's SIMD registers */

int int4_gemv_lanes(void) { return LANES; } /* the layout kernels_c.lay_out must write */

INLINE words_v load_words(const uint32_t *p) { words_v v; memcpy(&v, p, sizeof v); return v; }
INLINE floats_v load_floats(const float *p) { floats_v v; memcpy(&v, p, sizeof v); return v; }

/* nibble t of each lane (0..15) as the float 1 + nibble / 16: moved to the top 4 of the 23 fraction bits
   (19..22) and ORed into the bit pattern of 1.0f (0x3F800000). Nibble 5: 0x3F800000 | 5 << 19 = 0x3FA80000,
   the float 1.3125 = 1 + 5/16 (each fraction bit 19..22 is worth 1/16, 1/8, 1/4, 1/2). */
INLINE floats_v one_plus_sixteenth(const words_v *w, int t) { /* w by address: no vector argument */
    words_v at19 = t < 5 ? *w << (19 - 4 * t) : *w >> (4 * t - 19);
    words_v bits = (at19 & (15u << 19)) | 0x3F800000u;
    floats_v f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

/* LANES rows' sum over one group of sum_k f_k x_k (words: the group's first word; x: its first input) */
INLINE floats_v group_sum(const uint32_t *words, const float *x, int64_t words_per_group) {
    floats_v part0 = {0}, part1 = {0}; /* two sums in flight: one would wait for the previous add */
    for (int64_t j = 0; j < words_per_group; j++) {
        const words_v w = load_words(words + j * LANES);
        const float *xj = x + 8 * j;
        for (int t = 0; t < 8; t += 2) { /* the compiler unrolls this: constant shifts */
            part0 += one_plus_sixteenth(&w, t) * xj[t];
            part1 += one_plus_sixteenth(&w, t + 1) * xj[t + 1];
        }
    }
    return part0 + part1;
}

void int4_gemv(const float *x, const float *x_sums, const uint32_t *words, const float *scale,
               const float *offset, int64_t m_rows, int64_t n_rows, int64_t k, int64_t groups, int threads,
               float *y) {
    const int64_t blocks = (n_rows + LANES - 1) / LANES, words_per_group = k / groups / 8;
    PARALLEL_FOR(threads)
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

/* Rung 7: rung 5's arithmetic (x rounded to int8 per block, as llama.cpp's Q8_0) on rung 6's layout. The
   codes stay bytes: one instruction multiplies 32 unsigned bytes (nibbles 0..15: 8 rows x 4 inputs) by 32 signed
   bytes (the same 4 bytes of x in every row). A word's low nibbles hold inputs 8j, 8j+2, 8j+4, 8j+6 and its high
   nibbles 8j+1, .., 8j+7, so each meets four bytes of x_even or x_odd broadcast to every lane. Which instruction
   is chosen at build time, as the lanes are, from what the compiler targets (int4_gemv_int8_path names it):

     VNNI     vpdpbusd (AVX-512 VNNI with VL, or AVX-VNNI): the 4 products of each row summed into its int32, as
              ggml's x86 kernels do. Exact: 16 * 15 * 127 per block of 32 fits an int32 with room to spare.
     AVX2     vpmaddubsw adds neighbouring products into 16 int16s, vpmaddwd adds those pairs into 8 int32s, one
              per output row: two instructions and an add where VNNI has one. Per x block (8, 16 or 32 inputs)
              each int16 sum is at most 4 words * 2 * 2 * 15 * 127 = 30,480 < 32,767 (no saturation).
     plain C  the same integer sums, one row and one input at a time (another CPU, or no -march=native).

   Both SIMD paths work on 8 rows per 256-bit register, twice on a 16-lane build. All three give the same int32
   sums, so the same y to the bit. Then one float conversion per block and row, and

       y[m, n] = sum_b scale[n, g(b)] x_scale[m, b] sum_{k in b} nibble_k xq_k  -  sum_g scale (8 + zero) xs[m, g]

   with xs the group sums of the rounded x (x_scale * xq), and scale (8 + zero) = offset - 16 scale (offset
   is rung 6's). Exact for the rounded x up to float rounding. x is checked and rounded here, once per call
   (quantize_row): in torch ops it cost about a tenth of a 4096 x 14336 product, here about 6 us for 4096 inputs
   (AVX2 EPYC). */
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
#define DPBUSD(acc, u, s) _mm256_dpbusd_epi32(acc, u, s) /* EVEX encoding */
#elif defined(__AVXVNNI__)
#define DPBUSD(acc, u, s) _mm256_dpbusd_avx_epi32(acc, u, s) /* VEX encoding */
#elif defined(__AVX2__) && defined(LABKIT_EMULATE_VNNI)
/* tests only: vpdpbusd's definition in AVX2 (exact for nibbles, whose byte pairs stay far below int16's limit),
   so that the VNNI path's loop runs on a CPU without VNNI (tests/quant/test_kernels_c.py) */
#define DPBUSD(acc, u, s) _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1)))
#endif

INLINE void int8_block(const uint32_t *words, const int8_t *xe, const int8_t *xo, int64_t n_words,
                       int32_t *dots /* [LANES] */) {
#if defined(DPBUSD)
    const __m256i low = _mm256_set1_epi8(0x0F);
    for (int h = 0; h < LANES; h += 8) { /* 8 rows per 256-bit register: 1 or 2 halves */
        __m256i sums = _mm256_setzero_si256(); /* int32, one per row */
        for (int64_t j = 0; j < n_words; j++) {
            const __m256i w = _mm256_loadu_si256((const __m256i *)(words + j * LANES + h));
            int32_t e, o;
            memcpy(&e, xe + 4 * j, 4);
            memcpy(&o, xo + 4 * j, 4);
            sums = DPBUSD(sums, _mm256_and_si256(w, low), _mm256_set1_epi32(e));
            sums = DPBUSD(sums, _mm256_and_si256(_mm256_srli_epi16(w, 4), low), _mm256_set1_epi32(o));
        }
        _mm256_storeu_si256((__m256i *)(dots + h), sums);
    }
#elif defined(__AVX2__)
    const __m256i low = _mm256_set1_epi8(0x0F), ones = _mm256_set1_epi16(1);
    for (int h = 0; h < LANES; h += 8) {
        __m256i sums = _mm256_setzero_si256(); /* int16, two per row */
        for (int64_t j = 0; j < n_words; j++) {
            const __m256i w = _mm256_loadu_si256((const __m256i *)(words + j * LANES + h));
            int32_t e, o;
            memcpy(&e, xe + 4 * j, 4);
            memcpy(&o, xo + 4 * j, 4);
            sums = _mm256_add_epi16(sums, _mm256_maddubs_epi16(_mm256_and_si256(w, low), _mm256_set1_epi32(e)));
            sums = _mm256_add_epi16(sums, _mm256_maddubs_epi16(_mm256_and_si256(_mm256_srli_epi16(w, 4), low),
                                                               _mm256_set1_epi32(o)));
        }
        _mm256_storeu_si256((__m256i *)(dots + h), _mm256_madd_epi16(sums, ones));
    }
#else
    for (int l = 0; l < LANES; l++) {
        int32_t dot = 0;
        for (int64_t j = 0; j < n_words; j++) {
            const uint32_t w = words[j * LANES + l];
            for (int t = 0; t < 8; t++)
                dot += (int32_t)((w >> (4 * t)) & 15u) * (t % 2 ? xo[4 * j + t / 2] : xe[4 * j + t / 2]);
        }
        dots[l] = dot;
    }
#endif
}

/* rung 7's byte products, as available() reports them */
const char *int4_gemv_int8_path(void) {
#if defined(DPBUSD) && defined(LABKIT_EMULATE_VNNI) && !defined(__AVX512VNNI__) && !defined(__AVXVNNI__)
    return "vpdpbusd emulated in AVX2 (a test build)";
#elif defined(DPBUSD) && defined(__AVX512VNNI__) && defined(__AVX512VL__)
    return "AVX-512 VNNI vpdpbusd";
#elif defined(DPBUSD)
    return "AVX-VNNI vpdpbusd";
#elif defined(__AVX2__)
    return "AVX2 vpmaddubsw + vpmaddwd";
#else
    return "plain C";
#endif
}

/* The x86 instruction sets this build uses that the CPU running it lacks ("" when none): a library built for
   another CPU (a shared folder, a copied checkout, $LABKIT_CFLAGS) is refused by kernels_c before any of its
   vector code runs, instead of dying with an illegal instruction. */
#if defined(__x86_64__) || defined(__i386__)
__attribute__((target("arch=x86-64"))) /* this check itself in instructions every x86-64 CPU runs */
#endif
const char *int4_gemv_missing_isa(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_cpu_init();
#if defined(__AVX512VNNI__)
    if (!__builtin_cpu_supports("avx512vnni")) return "avx512vnni";
#endif
#if defined(__AVX512F__)
    if (!__builtin_cpu_supports("avx512f")) return "avx512f";
#endif
#if defined(__AVXVNNI__) /* CPUID leaf 7, subleaf 1, EAX bit 4 (clang 14's __builtin_cpu_supports lacks it) */
    unsigned int eax = 0, ebx = 0, ecx = 0, edx = 0;
    if (!__get_cpuid_count(7, 1, &eax, &ebx, &ecx, &edx) || !(eax & (1u << 4))) return "avxvnni";
#endif
#if defined(__AVX2__)
    if (!__builtin_cpu_supports("avx2")) return "avx2";
#endif
#if defined(__FMA__)
    if (!__builtin_cpu_supports("fma")) return "fma";
#endif
#endif
    return "";
}

/* x's row [K] rounded as llama.cpp's Q8_0 (and labkit.quant.kernels.quantize_activations): per block,
   x_scale = max |x| / 127 (1 for an all-zero block) and xq = round(x / x_scale), ties to even; the even and
   odd inputs apart (xe, xo [K / 2]); xs [G] = the group sums of the rounded x, x_scale * sum xq per block.
   Returns 0, or 1 when the row holds a NaN or an inf (which would round to a code and pass for a number). */
static int quantize_row(const float *x, int64_t k, int64_t block, int64_t group_len, int8_t *xe, int8_t *xo,
                        float *x_scale, float *xs) {
    for (int64_t g = 0; g < k / group_len; g++)
        xs[g] = 0;
    for (int64_t b = 0; b < k / block; b++) {
        const float *xb = x + b * block;
        int8_t *e = xe + b * block / 2, *o = xo + b * block / 2;
        float amax = 0, q[32]; /* block <= 32 (int4_gemv_int8 checks) */
        int finite = 1;
        for (int64_t i = 0; i < block; i++) {
            const float a = xb[i] < 0 ? -xb[i] : xb[i];
            amax = a > amax ? a : amax;
            uint32_t bits;
            memcpy(&bits, xb + i, 4);
            finite &= (bits & 0x7f800000u) != 0x7f800000u; /* exponent all ones: a NaN or an inf, under any flags */
        }
        if (!finite)
            return 1;
        const float d = amax > 0 ? amax / 127.0f : 1.0f;
        for (int64_t i = 0; i < block; i++) { /* SIMD: divide, round (to nearest, ties to even), clamp */
            const float r = __builtin_rintf(xb[i] / d);
            q[i] = r > -127 ? (r < 127 ? r : 127) : -127; /* not fminf/fmaxf, which are calls; a NaN gives -127 */
        }
        int32_t sum = 0;
        for (int64_t i = 0; i < block / 2; i++) {
            e[i] = (int8_t)q[2 * i];
            o[i] = (int8_t)q[2 * i + 1];
            sum += (int32_t)q[2 * i] + (int32_t)q[2 * i + 1];
        }
        x_scale[b] = d;
        xs[b * block / group_len] += d * (float)sum;
    }
    return 0;
}

/* x float32 [M, K]; `block` (8, 16 or 32) divides the group length K / groups. Returns 0 once y is written,
   else y is left as it was and the status says why (kernels_c.gemv_int8 raises the matching error). */
enum { INT8_DONE = 0, INT8_NO_MEMORY = 1, INT8_X_NOT_FINITE = 2, INT8_BAD_BLOCK = 3 };
int int4_gemv_int8(const float *x, const uint32_t *words, const float *scale, const float *offset, int64_t m_rows,
                    int64_t n_rows, int64_t k, int64_t groups, int64_t block, int threads, float *y) {
    if (block != 8 && block != 16 && block != 32)
        return INT8_BAD_BLOCK; /* quantize_row's buffer holds 32 */
    const int64_t blocks = (n_rows + LANES - 1) / LANES, group_len = k / groups, x_blocks = k / block;
    int8_t *xq = malloc((size_t)(m_rows * k)); /* [M, K]: row m's even inputs, then its odd ones */
    float *x_scale = malloc(sizeof(float) * (size_t)(m_rows * (x_blocks + groups))), *xs = x_scale + m_rows * x_blocks;
    if (!xq || !x_scale) {
        free(xq);
        free(x_scale);
        return INT8_NO_MEMORY;
    }
    for (int64_t m = 0; m < m_rows; m++)
        if (quantize_row(x + m * k, k, block, group_len, xq + m * k, xq + m * k + k / 2, x_scale + m * x_blocks,
                         xs + m * groups)) {
            free(xq);
            free(x_scale);
            return INT8_X_NOT_FINITE;
        }
    PARALLEL_FOR(threads)
    for (int64_t b = 0; b < blocks; b++) {
        const uint32_t *rows = words + b * (k / 8) * LANES;
        const float *s = scale + b * groups * LANES, *o = offset + b * groups * LANES;
        for (int64_t m = 0; m < m_rows; m++) {
            const int8_t *xe = xq + m * k, *xo = xq + m * k + k / 2;
            floats_v acc = {0}, off = {0};
            int32_t dots[LANES];
            for (int64_t xb = 0; xb < x_blocks; xb++) {
                const int64_t g = xb * block / group_len;
                if (block == 32) /* Q8_0's block: a constant count of words, which the compiler unrolls */
                    int8_block(rows + xb * 4 * LANES, xe + xb * 16, xo + xb * 16, 4, dots);
                else
                    int8_block(rows + xb * (block / 8) * LANES, xe + xb * block / 2, xo + xb * block / 2, block / 8,
                               dots);
                floats_v d;
                for (int l = 0; l < LANES; l++)
                    d[l] = (float)dots[l];
                acc += load_floats(s + g * LANES) * x_scale[m * x_blocks + xb] * d;
            }
            for (int64_t g = 0; g < groups; g++)
                off += (load_floats(o + g * LANES) - 16.0f * load_floats(s + g * LANES)) * xs[m * groups + g];
            const floats_v rows_y = acc - off;
            for (int l = 0; l < LANES && b * LANES + l < n_rows; l++)
                y[m * n_rows + b * LANES + l] = rows_y[l];
        }
    }
    free(xq);
    free(x_scale);
    return INT8_DONE;
}
