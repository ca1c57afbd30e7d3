/* Runs int4_gemv.c's two products on one case file and writes their outputs: how the tests check a build they
   cannot load into this Python (aarch64 under qemu-user, tests/quant/test_kernels_c_builds.py).

       int4_harness                 prints the build: "<lanes> <rung 7's path>"
       int4_harness CASE OUT        CASE: int64 m, n, k, groups, block, lanes, then float32 x [m, k],
                                    x_sums [m, groups], uint32 words [B, k / 8, lanes], float32 scale and
                                    offset [B, groups, lanes] (kernels_c.lay_out's arrays, B = ceil(n / lanes));
                                    OUT: float32 y [m, n] of rung 6, then of rung 7, then int32 rung 7's status */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

int int4_gemv_lanes(void);
const char *int4_gemv_int8_path(void);
void int4_gemv(const float *x, const float *x_sums, const uint32_t *words, const float *scale, const float *offset,
               int64_t m_rows, int64_t n_rows, int64_t k, int64_t groups, int threads, float *y);
int int4_gemv_int8(const float *x, const uint32_t *words, const float *scale, const float *offset, int64_t m_rows,
                   int64_t n_rows, int64_t k, int64_t groups, int64_t block, int threads, float *y);

static void *read_n(FILE *f, size_t size, size_t count) {
    void *p = malloc(size * count + 1);
    if (!p || fread(p, size, count, f) != count) {
        fprintf(stderr, "int4_harness: the case file is short\n");
        exit(2);
    }
    return p;
}

int main(int argc, char **argv) {
    if (argc == 1) {
        printf("%d %s\n", int4_gemv_lanes(), int4_gemv_int8_path());
        return 0;
    }
    FILE *in = argc == 3 ? fopen(argv[1], "rb") : NULL;
    if (!in) {
        fprintf(stderr, "usage: int4_harness [CASE OUT]\n");
        return 2;
    }
    int64_t *h = read_n(in, sizeof(int64_t), 6), m = h[0], n = h[1], k = h[2], groups = h[3], block = h[4];
    if (h[5] != int4_gemv_lanes()) {
        fprintf(stderr, "int4_harness: the case is laid out for %lld lanes, this build has %d\n", (long long)h[5],
                int4_gemv_lanes());
        return 2;
    }
    const int64_t blocks = (n + h[5] - 1) / h[5];
    float *x = read_n(in, sizeof(float), (size_t)(m * k)), *x_sums = read_n(in, sizeof(float), (size_t)(m * groups));
    uint32_t *words = read_n(in, sizeof(uint32_t), (size_t)(blocks * (k / 8) * h[5]));
    float *scale = read_n(in, sizeof(float), (size_t)(blocks * groups * h[5]));
    float *offset = read_n(in, sizeof(float), (size_t)(blocks * groups * h[5]));
    fclose(in);
    float *y = calloc((size_t)(2 * m * n), sizeof(float));
    int4_gemv(x, x_sums, words, scale, offset, m, n, k, groups, 2, y);
    int32_t status = int4_gemv_int8(x, words, scale, offset, m, n, k, groups, block, 2, y + m * n);
    FILE *out = fopen(argv[2], "wb");
    if (!out || fwrite(y, sizeof(float), (size_t)(2 * m * n), out) != (size_t)(2 * m * n) ||
        fwrite(&status, sizeof status, 1, out) != 1 || fclose(out)) {
        fprintf(stderr, "int4_harness: cannot write %s\n", argv[2]);
        return 2;
    }
    return 0;
}
