/* The AMX level's kernels (amx_tiles.h) over a scalar emulation of the tile instructions, for
 * the tests: the same tiling and indexing as the real level's, runnable on any x86-64 CPU.
 * Each instruction follows Intel's pseudocode (SDM, TDPBF16PS): per row m of C, per k pair, per
 * column n, c += a.bf16[2k] * b.bf16[2k] then c += a.bf16[2k + 1] * b.bf16[2k + 1] in fp32
 * (round to nearest even whatever MXCSR says), bf16 inputs denormal-as-zero and fp32 results
 * flushed to zero. A tile's rows past `rows` and bytes past `colsb` read as zero after a load,
 * as the hardware zeroes them. An operation the hardware would refuse (a tile not configured,
 * shapes that do not match: a #UD there) is skipped and counted (cf_amx_emul_faults), so that a
 * test sees it; so is a load or store with a tile row outside the span the kernel's contract
 * gives that operand (amx_tiles.h), which the hardware would run, reading or writing memory the
 * kernel does not own. Compiled with -ffp-contract=off: the two additions must stay two roundings.
 * The hardware does not follow the pseudocode's roundings bit for bit: on a Xeon with AMX-BF16,
 * random 16 x 16 x 32 tiles with widely spread exponents came out different in the last bits for
 * about half of the elements (nor did one rounding per pair, or per tile, match). So the
 * emulation checks the tiling and indexing, and results are compared within rounding bounds,
 * never bitwise against the hardware. */
#if defined(__x86_64__)
#include "tensor/amx.h"

#include <stdatomic.h>
#include <stdint.h>
#include <string.h>

typedef struct emul_state {
    amx_cfg cfg;
    bool configured;
    unsigned char data[8][16 * 64];
} emul_state;

static _Thread_local emul_state emul;
static atomic_ulong emul_faults;

unsigned long cf_amx_emul_faults(void) {
    return atomic_load(&emul_faults);
}

static void fault(void) {
    atomic_fetch_add(&emul_faults, 1);
}

static bool usable(int t) {
    return emul.configured && t >= 0 && t < 8 && emul.cfg.rows[t] > 0 && emul.cfg.colsb[t] > 0;
}

static void emul_config(const amx_cfg *c) {
    bool ok = c->palette == 1 && c->start_row == 0;
    for (int t = 0; t < 16; t++) {
        if (t >= 8 && (c->rows[t] || c->colsb[t])) ok = false;
        if (c->rows[t] > 16 || c->colsb[t] > 64 || (c->rows[t] == 0) != (c->colsb[t] == 0))
            ok = false;
    }
    if (!ok) {
        fault();
        return;
    }
    emul.cfg = *c;
    emul.configured = true;
    memset(emul.data, 0, sizeof emul.data);
}

static void emul_zero(int t) {
    if (!usable(t)) {
        fault();
        return;
    }
    memset(emul.data[t], 0, sizeof emul.data[t]);
}

/* Whether the rows[t] rows of colsb[t] bytes, stride apart from p, all lie in the span. */
static bool inside(int t, const void *p, size_t stride, amx_span s) {
    const uintptr_t base = (uintptr_t)s.base;
    for (size_t r = 0; r < emul.cfg.rows[t]; r++) {
        const uintptr_t at = (uintptr_t)p + r * stride;
        if (at < base) return false;
        const bool rows = s.rows > 1 && s.stride > 0; /* else one row */
        const size_t off = at - base, row = rows ? off / s.stride : 0,
                     col = rows ? off % s.stride : off;
        if (row >= s.rows || col + emul.cfg.colsb[t] > s.bytes) return false;
    }
    return true;
}

static void emul_load(int t, const void *base, size_t stride, amx_span span) {
    if (!usable(t) || !inside(t, base, stride, span)) {
        fault();
        return;
    }
    memset(emul.data[t], 0, sizeof emul.data[t]);
    for (int r = 0; r < emul.cfg.rows[t]; r++)
        memcpy(emul.data[t] + r * 64, (const unsigned char *)base + (size_t)r * stride,
               emul.cfg.colsb[t]);
}

static void emul_store(int t, void *base, size_t stride, amx_span span) {
    if (!usable(t) || !inside(t, base, stride, span)) {
        fault();
        return;
    }
    for (int r = 0; r < emul.cfg.rows[t]; r++)
        memcpy((unsigned char *)base + (size_t)r * stride, emul.data[t] + r * 64,
               emul.cfg.colsb[t]);
}

/* A bf16 operand as fp32, a denormal read as zero (of its sign). */
static float bf16_daz(uint16_t h) {
    if ((h & 0x7f80u) == 0) h &= 0x8000u;
    const uint32_t bits = (uint32_t)h << 16;
    float x;
    memcpy(&x, &bits, sizeof x);
    return x;
}

/* An fp32 result with a denormal flushed to zero (of its sign). */
static float ftz(float x) {
    uint32_t bits;
    memcpy(&bits, &x, sizeof bits);
    if ((bits & 0x7f800000u) == 0) bits &= 0x80000000u;
    memcpy(&x, &bits, sizeof x);
    return x;
}

static void emul_dp(int c, int a, int b) {
    if (!usable(c) || !usable(a) || !usable(b) || c == a || c == b || a == b) {
        fault();
        return;
    }
    const amx_cfg *g = &emul.cfg;
    if (g->colsb[c] % 4 || g->colsb[a] % 4 || g->rows[c] != g->rows[a] ||
        g->colsb[c] != g->colsb[b] || g->colsb[a] / 4 != g->rows[b]) {
        fault();
        return;
    }
    for (int m = 0; m < g->rows[c]; m++) {
        float row[16];
        memcpy(row, emul.data[c] + m * 64, sizeof row);
        for (int k = 0; k < g->colsb[a] / 4; k++) {
            uint16_t av[2];
            memcpy(av, emul.data[a] + m * 64 + 4 * k, sizeof av);
            for (int n = 0; n < g->colsb[c] / 4; n++) {
                uint16_t bv[2];
                memcpy(bv, emul.data[b] + k * 64 + 4 * n, sizeof bv);
                row[n] = ftz(row[n] + bf16_daz(av[0]) * bf16_daz(bv[0]));
                row[n] = ftz(row[n] + bf16_daz(av[1]) * bf16_daz(bv[1]));
            }
        }
        memcpy(emul.data[c] + m * 64, row, (size_t)g->colsb[c]);
    }
}

static void emul_release(void) {
    emul.configured = false;
    memset(emul.data, 0, sizeof emul.data);
}

/* PyTorch's round to nearest even, as cf_fp32_to_bf16 (bf16.c), whatever the active level. */
static void emul_to_bf16(const float *x, uint16_t *y, size_t n) {
    for (size_t i = 0; i < n; i++) {
        uint32_t bits;
        memcpy(&bits, &x[i], sizeof bits);
        y[i] = x[i] != x[i] ? (uint16_t)((bits >> 16) | 0x40u)
                            : (uint16_t)((bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16);
    }
}

#define AMX_CONFIG(cfg) emul_config(cfg)
#define AMX_ZERO(t) emul_zero(t)
#define AMX_LOAD(t, base, stride, span) emul_load(t, base, stride, span)
#define AMX_STORE(t, base, stride, span) emul_store(t, base, stride, span)
#define AMX_DP(c, a, b) emul_dp(c, a, b)
#define AMX_RELEASE() emul_release()
#define AMX_TO_BF16(x, y, n) emul_to_bf16(x, y, n)
#include "tensor/amx_tiles.h"

void cf_amx_emul_kernels(cf_bf16_kernels *k) {
    k->gemm = amx_gemm;
    /* the tile GEMM packs its own A (the Winograd products call it per product) */
    k->gemm_a_words = NULL;
    k->gemm_pack_a = NULL;
    k->gemm_packed = NULL;
    k->gemm_paired = NULL;
    k->gemm_rows = NULL;
    k->gemm_pack_a_rows = NULL;
    k->gemm_unpack_a = NULL;
    k->wino_pack_a = NULL;
    k->conv_run = amx_conv_run;
    k->conv_wgrad = amx_conv_wgrad;
    k->conv_wgrad_runs = NULL; /* the tiles sum every pair in their own order */
    k->conv_order = amx_conv_order;
    k->conv_cols = NULL;   /* the tiles' conv_run is the forward's kernel */
    k->conv_spread = NULL; /* conv_run's sums are the tiles' */
    k->cols_spread = NULL; /* no conv_cols */
}
#endif
