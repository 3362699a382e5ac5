/* The bfloat16 implicit convolution of mixed-precision training: stride 1, the output as large as
 * the input (an odd square kernel above 1x1 with padding (k - 1) / 2, ResNets' 3x3 layers), no
 * patch matrix, bf16 products with fp32 sums through the active kernel table's bf16 kernels
 * (vdpbf16ps, which multiplies the two bf16 halves of a 32-bit lane pairwise and adds both
 * products into an fp32 lane).
 *
 * Layouts. The input of a call is converted once per image into channel pairs: plane p holds,
 * per position of the zero-padded image (hp x wp, row-major), bf16(x[2p]) | bf16(x[2p + 1]) << 16,
 * so one 32-bit lane is the pair that one dot-product step reads. Output positions are counted in
 * the padded image's row stride, q = i * wp + j: then tap (ki, kj) reads the planes at q + ki *
 * wp + kj, a plain shift with no masks, and the columns j >= ow (k - 1 of every wp) are computed
 * and dropped when the rows are copied out.
 *
 *   forward  y[o] = sum over taps t and channel pairs p of w-pair(o, p, t) . xpairs[p][q + off(t)]
 *   dx       the same kernel on dy's pairs with the weights transposed and the taps reversed: for
 *            stride 1 and padding (k - 1) / 2, dx is the "same" convolution of dy with the
 *            flipped kernel; for stride 2, one such correlation per phase plane of dx, with the
 *            taps of that phase (dx_stride2)
 *   dW       dW[t][o][c] = sum over positions q of dy[o][q] * xpad[c][q + off(t)]: here the pairs
 *            run along the positions. dy is converted into padded-stride rows (zero in the dropped
 *            columns), a 32-bit word holding two neighbouring positions; x into the transposed
 *            rows X0[q][c] = (xpad[c][2q], xpad[c][2q + 1]) and X1[q][c] = (xpad[c][2q + 1],
 *            xpad[c][2q + 2]), so that a tap with an even offset reads X0 and an odd one X1, each
 *            a whole row of channels per step. A block of small images is laid end to end (each
 *            hp x wp positions), so that a register tile sums hundreds of positions. Where the
 *            level has conv_wgrad_runs, the sums skip the position pairs whose dy words are both
 *            zero (pad rows, dropped columns: dy_runs), adding the same products in the same order.
 *            cf_conv_bf16_backward then pairs the same bf16 rows of dy into dx's pair planes
 *            (halves_rows) rather than rounding dy from fp32 again. x's rows are copied from the
 *            forward's bf16 words of x where it kept them (cf_conv_bf16_forward_keep; rows_h,
 *            deal_h) rather than read in fp32 and rounded again; dy's rows likewise from the bf16
 *            words a BatchNorm wrote in place of dy (cf_conv_bf16_backward_words; rows_h), where
 *            dx reads dy only through those rows.
 *
 * The forward of W1-sized layers (17 to 64 output channels, planes of at most 256 positions:
 * cols_make) reads the same pair planes through the table's conv_cols instead, which computes the
 * image's own positions alone (no dropped columns) and writes y's planes directly; the sums are
 * conv_run's, term for term. Stride 1's dx of such layers (17 to 64 input channels) takes the
 * same kernel over dy's pair planes with the dx order's columns (dx_cols), and so does each phase
 * of stride 2's dx (dx2_cols, with each phase's columns), a paired shortcut's 1x1 dx too.
 *
 * Weights are packed (rounded to bf16, both orders, and the columns of each for conv_cols) by
 * cf_conv_bf16_pack, once per forward pass, and the backward pass reads the same pack: once per
 * training step. */
#include "corefit/tensor.h"
#include "tensor/kernel_table.h"

#include <stdatomic.h>
#include <stdint.h>
#include <string.h>

#define MAX_TAPS 49 /* 7x7 */
#define ROWS 8      /* the kernels' register tile rows */
#define WGRAD_POSITIONS 512

typedef struct layout {
    bool sub; /* a 1x1 stride-2 layer without padding: the layout of its subsampled image's */
    int k, pad, taps, hp, wp;
    int stride, phases;  /* 1 and 1, or 2 and 4 (the phase planes of a stride-2 image) */
    int hq, wq;          /* the padded image's size, or a phase plane's (stride 2) */
    int c, o, cp, op;    /* channels and channel pairs of the input and output */
    int nq;              /* output positions computed per image (oh * wp rounded up to 16) */
    size_t plane;        /* words per pair plane */
    int phase[MAX_TAPS]; /* tap t = (ki, kj) reads phase plane (ki % s) * 2 + kj % s ... */
    int shift[MAX_TAPS]; /* ... at (ki / s) * wq + kj / s from the output position */
    int off[MAX_TAPS];   /* the weight gradient's offset: phase * lp + shift */
    int half[MAX_TAPS];  /* off / 2, and whether it is odd */
    unsigned char odd[MAX_TAPS];
    /* the weight gradient's blocks */
    int s;      /* positions per image (hq * wq, less pad rows at stride 1; even) */
    size_t lp;  /* uint16 per phase of a channel row (a block's positions, stride 2) */
    int block;  /* images per block */
    size_t lx;  /* uint16 per channel row of the padded block */
    int rows;   /* rows of X0 and X1 */
    size_t ldb; /* their row stride in words (the channels rounded up to 16) */
    size_t dl;  /* uint16 per output-channel row of dy (the block's positions) */
    /* stride 2's dx: dy's pair planes padded by pad on every side (wd wide), and per phase of dx
     * the taps that reach it (their kernel index and offset) */
    int wd, nqd;
    size_t planed;
    int ntap[4], dtap[4][MAX_TAPS], doff[4][MAX_TAPS];
    int dbase[4]; /* where phase ph's first position of dx (its row u0, column v0) is in dy's
                   * planes: its nqd positions are computed from there, oh rows of wd */
    int du0[2];   /* u0 by the phase's row parity */
    /* small planes (compact_pays): every tap's inputs gathered to the output positions alone */
    bool compact;
    int ohw, ppi; /* output positions per image, and rounded up to even (dW's pairs) */
    int bf, qf;   /* the forward's images per call of conv_run and positions (of 16s) */
    int bw, qw;   /* the weight gradient's images per block and positions (bw * ppi) */
    size_t lxc;   /* uint16 per channel row of the weight gradient's gathered taps */
    int xrows;    /* rows of its X0 (and X1): taps * qw / 2 */
    /* the forward over output positions (cols_make): whether it applies, whether stride 1's dx
     * takes the same kernel (dcols), their words per pair plane (plane, or more for the last
     * tile's positions past the image) and images per call of conv_cols */
    bool cols, dcols;
    size_t cplane;
    int cnb;
    /* stride 2's dx over its phases' own positions (d2cols; a subsampled layer: its 1x1 dx paired
     * with such a layer's), through conv_cols with dx's columns of each phase */
    bool d2cols;
} layout;

static size_t up(size_t n, size_t m) {
    return (n + m - 1) / m * m;
}

/* Words of conv_order's scratch: 16 rows of the largest block's taps and pairs. */
static size_t order_words(const layout *l) {
    return (size_t)16 * l->taps * (size_t)(l->cp > l->op ? l->cp : l->op);
}

/* A 1x1 stride-2 layer without padding (a residual shortcut) is the 1x1 stride-1 convolution of
 * the subsampled image x[:, 2i, 2j]: it takes that one's layout, and only its conversions (which
 * read every other row and column of x, and write dx's even rows' even columns) differ. */
static bool subsampled(const cf_conv_geom *g) {
    return g->kh == 1 && g->kw == 1 && g->sh == 2 && g->sw == 2 && g->ph == 0 && g->pw == 0 &&
           g->oh == (g->h + 1) / 2 && g->ow == (g->w + 1) / 2;
}

/* Where a stride-2 layer's phase planes hold x[2i][2j], the subsampled image of a 1x1 stride-2
 * shortcut on the same input: padded (2i + pad, 2j + pad) is in phase (pad % 2, pad % 2), at
 * (i + pad / 2, j + pad / 2) of rows wq apart (the same for dx's phase rows, wd apart). */
static int sub_phase(int pad) {
    return 3 * (pad % 2);
}

static int sub_shift(int pad, int ld) {
    return pad / 2 * (ld + 1);
}

/* The shortcut's pack: its forward's (1 tap, up(o, ROWS) x cp), then its dx's. */
static const uint32_t *shortcut_dx_pack(const cf_conv_shortcut *sc, int c) {
    return (const uint32_t *)sc->w + up((size_t)sc->out_channels, ROWS) * (((size_t)c + 1) / 2);
}

/* The level's conversions into pair planes and rows on its conversion instructions where it
 * has them (fwd_pairs_rows, fwd_deal_pairs, rows_short: vcvtne2ps2bf16, with the rounding in
 * integer operations for a vector that holds a subnormal), else the plain ones: bitwise the same
 * words (test_bf16_ne_paths runs every path with and without them; test_bf16_cols,
 * test_bf16_wgrad_runs), in about a third of the instructions. */
typedef void (*pairs_rows_fn)(const float *, const float *, int, int, uint32_t *, size_t);
typedef void (*deal_pairs_fn)(const float *, const float *, size_t, int, int, uint32_t *,
                              uint32_t *, size_t);
typedef void (*rows_fn)(const float *, int, int, uint16_t *, size_t);

static pairs_rows_fn pairs_rows_of(const cf_bf16_kernels *k) {
    return k->fwd_pairs_rows ? k->fwd_pairs_rows : k->pairs_rows;
}

static deal_pairs_fn deal_pairs_of(const cf_bf16_kernels *k) {
    return k->fwd_deal_pairs ? k->fwd_deal_pairs : k->deal_pairs;
}

static rows_fn rows_of(const cf_bf16_kernels *k) {
    return k->rows_short ? k->rows_short : k->rows;
}

/* Whether a layer's output planes are so small that the padded-stride positions waste much of the
 * kernels' work, so that its taps are better gathered (compact): at stride 1 the kernels compute
 * oh x wp positions per image, rounded up to 16 (resnet18's 4 x 4 stage at 128 px: 32 for 16
 * outputs, its weight gradient 30 per image), at stride 2 oh x wq (its 8 -> 4 layer: 32 for 16).
 * The gather copies each input value once per tap (9x a 3x3 layer's input, in bf16), a cost per
 * output channel that pays where at least a fifth of the positions are waste, the planes are
 * small (at most 64 outputs: a call's images share one run of the kernel) and the layer is wide
 * (128 channels or more each way). bench_conv w3 cpu-bf16, CPU ms forward + backward of 64
 * images: the 4 x 4 layer 46.8 + 91.4 -> 28.2 + 62.3, the 8 -> 4 one 24.1 + 48.0 -> 13.8 + 38.2,
 * the 8 x 8 one 27.9 + 63.1 -> 24.1 + 54.0, the 16 -> 8 one 15.4 + 36.6 -> 13.3 + 32.2; on
 * W1's 64-channel 7 x 7 layers (64 positions for 49) it lost (1.43 + 3.09 -> 1.66 + 3.93), and
 * on 16 x 16 planes (12% waste) it was even. */
static bool compact_pays(const layout *l, const cf_conv_geom *g) {
    const int ohw = g->oh * g->ow;
    return !l->sub && ohw <= 64 && (size_t)l->nq * 4 >= (size_t)ohw * 5 && l->c >= 128 &&
           l->o >= 128;
}

#define COLS_POSITIONS 256 /* the most output positions per image of the forward's cols path */
#define COLS_TILE 12       /* the most positions of conv_cols' tiles (kernel_table.h) */
#define COLS_CALL 400      /* about the most positions per call of conv_cols */

/* Whether the forward takes conv_cols (where the level has it): 17 to 64 output channels, planes
 * of at most COLS_POSITIONS positions at least a tile wide, not compact. conv_run computes the
 * padded rows' positions, the dropped columns too (and rounds them up to 16): 64 for W1's 7 x 7
 * planes' 49, 224 for the 14 x 14 ones' 196; conv_cols computes the image's positions alone and
 * writes them into y's planes (no copy_rows). A call takes as many images as fit in COLS_CALL
 * positions, its tiles running on from one image's positions to the next's (W1's 7 x 7 planes:
 * 8 images, 392 positions in 66 tiles of 6, where one image alone would take 9 tiles for 49).
 * Its last tile reads past the last image, as far as COLS_TILE - 1 positions on in row-major
 * order, in the next image's slot: the scratch keeps a slot's words after the call's slots
 * (run_words). */
static bool cols_fit(int m, const cf_conv_geom *g) {
    const int nv = (m + 15) / 16, np = nv >= 2 && nv <= 4 ? 24 / nv : 0;
    return np && g->ow >= np && g->oh * g->ow <= COLS_POSITIONS;
}

/* ... and whether stride 2's dx does (d2cols): each phase of dx is a stride-1 correlation of dy's
 * pair planes into c channels over oh x ow positions (dx_stride2). conv_run computes them in
 * dy's padded rows, (oh - 1) x wd + ow rounded up to 16 per phase: 224 for W1's 14 x 14 phases'
 * 196, 64 for the 7 x 7 ones' 49. 17 to 64 channels, planes of at most COLS_POSITIONS positions at
 * least 6 wide (conv_cols takes a row per tile on planes narrower than its usual tile: W1's
 * second block, 7 x 7 phases, where it computes 49 positions for conv_run's 64). Not 16 or fewer
 * (W1's first block): a tile of one vector by 12 positions (13 loads for 12 products) measured
 * its backward 4% slower than conv_run's 8 x 48 tile over 224 positions. */
static bool d2cols_fit(int c, const cf_conv_geom *g) {
    return c >= 17 && c <= 64 && g->ow >= 6 && g->oh * g->ow <= COLS_POSITIONS;
}

/* ... and whether stride 1's dx does (dcols): a stride-1 convolution of dy's op pairs into c
 * channels, the same planes (padded by pad around dy's oh x ow, rows wp apart) with the dx
 * order's taps, so the same rule on c; not the subsampled layer (its own dx_subsampled). */
static void cols_make(layout *l, const cf_conv_geom *g) {
    const int ohw = g->oh * g->ow;
    l->cols = !l->compact && cols_fit(l->o, g);
    l->dcols = !l->compact && !l->sub && l->stride == 1 && cols_fit(l->c, g);
    l->d2cols = !l->compact && (l->stride == 2 || l->sub) && d2cols_fit(l->c, g);
    l->cplane = l->plane;
    l->cnb = 1;
    if (l->d2cols) l->cnb = COLS_CALL / ohw > 1 ? COLS_CALL / ohw : 1;
    if (!l->cols && !l->dcols) return;
    const int reach = (l->k - 1) / l->stride * (l->wq + 1);
    const size_t last = (size_t)(ohw + COLS_TILE - 2) / g->ow * l->wq + g->ow + reach;
    if (last > l->cplane) l->cplane = up(last, 16);
    l->cnb = COLS_CALL / ohw > 1 ? COLS_CALL / ohw : 1;
}

static void layout_make(layout *l, const cf_conv_geom *g0, int out_channels) {
    cf_conv_geom s = *g0;
    l->sub = subsampled(g0);
    if (l->sub) {
        s.h = g0->oh;
        s.w = g0->ow;
        s.sh = s.sw = 1;
    }
    const cf_conv_geom *g = &s;
    l->k = g->kh;
    l->pad = g->ph;
    l->taps = g->kh * g->kw;
    l->hp = g->h + 2 * g->ph;
    l->wp = g->w + 2 * g->pw;
    l->stride = g->sh;
    l->phases = g->sh * g->sh;
    l->hq = (l->hp + l->stride - 1) / l->stride;
    l->wq = (l->wp + l->stride - 1) / l->stride;
    l->c = g->c;
    l->o = out_channels;
    l->cp = (g->c + 1) / 2;
    l->op = (out_channels + 1) / 2;
    l->nq = (int)up((size_t)g->oh * l->wq, 16);
    const int reach = (l->k - 1) / l->stride * (l->wq + 1); /* the largest shift */
    l->plane = up((size_t)l->nq + reach > (size_t)l->hq * l->wq ? (size_t)l->nq + reach
                                                                : (size_t)l->hq * l->wq,
                  16);
    /* stride 1: an image's last pad rows are the next one's first (both zero), so a block
     * carries pad rows fewer per image (dy is zero there; the sums skip them) */
    l->s = (int)up((size_t)(l->phases == 1 ? l->hq - l->pad : l->hq) * l->wq, 2);
    l->block = WGRAD_POSITIONS / l->s > 1 ? WGRAD_POSITIONS / l->s : 1;
    const size_t positions = (size_t)l->block * l->s;
    l->lp = l->phases == 1 ? 0 : up(positions + reach + 2, 2);
    for (int t = 0; t < l->taps; t++) {
        const int ki = t / l->k, kj = t % l->k;
        l->phase[t] = l->stride == 1 ? 0 : (ki % 2) * 2 + kj % 2;
        l->shift[t] = ki / l->stride * l->wq + kj / l->stride;
        l->off[t] = (int)(l->phase[t] * l->lp) + l->shift[t];
        l->half[t] = l->off[t] / 2;
        l->odd[t] = (unsigned char)(l->off[t] & 1);
    }
    const int maxoff = (int)((l->phases - 1) * l->lp) + reach;
    l->rows = (int)(positions / 2 + maxoff / 2 + 1);
    l->lx = up(2 * (size_t)l->rows + 2, 32);
    l->ldb = up((size_t)l->c, 16);
    l->dl = positions;
    l->wd = g->ow + 2 * l->pad;
    /* a phase of dx holds oh x ow values from (u0, v0): dx's rows r with (r + pad) % 2 = a at
     * u = (r + pad) / 2 (and the same for the columns), so u0 = (r0 + pad) / 2 for its first
     * row r0; the positions from there to its last value, rounded up to 16 */
    l->nqd = (int)up((size_t)(g->oh - 1) * l->wd + g->ow, 16);
    int dbase_most = 0;
    for (int a = 0; a < 2; a++) l->du0[a] = (((a - l->pad) % 2 + 2) % 2 + l->pad) / 2;
    for (int ph = 0; ph < 4; ph++) {
        l->dbase[ph] = l->du0[ph / 2] * l->wd + l->du0[ph % 2];
        if (l->dbase[ph] > dbase_most) dbase_most = l->dbase[ph];
    }
    const size_t dreach = (size_t)l->pad * (l->wd + 1), hd = (size_t)g->oh + 2 * l->pad,
                 dread = (size_t)dbase_most + l->nqd + dreach;
    l->planed = up(dread > hd * l->wd ? dread : hd * l->wd, 16);
    for (int ph = 0; ph < 4; ph++) l->ntap[ph] = 0;
    if (l->stride == 2)
        for (int t = 0; t < l->taps; t++) {
            const int ki = t / l->k, kj = t % l->k, ph = (ki % 2) * 2 + kj % 2;
            l->dtap[ph][l->ntap[ph]] = t;
            l->doff[ph][l->ntap[ph]++] = (l->pad - ki / 2) * l->wd + (l->pad - kj / 2);
        }
    l->ohw = g->oh * g->ow;
    l->ppi = (int)up((size_t)l->ohw, 2);
    l->compact = compact_pays(l, g);
    cols_make(l, g);
    if (l->compact) {
        /* the forward's gathered taps of a call stay in L2 while every block of 8 output rows
         * sweeps them: 96 positions (two full register tiles), or down to 48 for wide layers */
        const size_t pairs = (size_t)(l->cp > l->op ? l->cp : l->op);
        /* the fewest positions rounded up to 16 per image (7 x 7: 3 images, 160 for 147), then
         * the most images, within 192 positions and 512 KB of gathered taps */
        l->bf = 1;
        for (int b = 2; b * l->ohw <= 192 && (size_t)l->taps * pairs * b * l->ohw <= 131072; b++) {
            const size_t q = up((size_t)b * l->ohw, 16), best = up((size_t)l->bf * l->ohw, 16);
            if (q * l->bf * 1000 / b <= best * 1000) l->bf = b; /* waste per image no higher */
        }
        l->qf = (int)up((size_t)l->bf * l->ohw, 16);
        /* the weight gradient sums about 128 positions per block */
        l->bw = 128 / l->ppi > 1 ? 128 / l->ppi : 1;
        l->qw = l->bw * l->ppi;
        l->xrows = l->taps * l->qw / 2;
        l->lxc = up(2 * (size_t)l->xrows + 2, 32);
    }
}

bool cf_conv_bf16_supported(const cf_conv_geom *g, int out_channels) {
    const cf_bf16_kernels *k = cf_active_kernels->bf16;
    if (!k || !k->conv_run || !k->conv_wgrad || !k->pairs || !k->rows || !k->pairs_rows ||
        !k->deal || !k->deal_pairs || !k->interleave || !k->position_pairs || !k->add_even ||
        !k->copy_rows || !k->halves_rows || !k->interleave_rows)
        return false;
    if (g->c < 1 || out_channels < 1) return false;
    if (subsampled(g)) return true;
    if (g->kh != g->kw || g->sh != g->sw || g->ph != g->pw || g->ph != (g->kh - 1) / 2)
        return false;
    if (g->kh < 2 || g->kh % 2 == 0 || g->kh * g->kw > MAX_TAPS) return false;
    if (g->sh == 1) return g->oh == g->h && g->ow == g->w;
    return g->sh == 2 && g->h % 2 == 0 && g->w % 2 == 0 && 2 * g->oh == g->h && 2 * g->ow == g->w;
}

/* A pack ends with its stamp: the level whose kernels it was ordered for and the layout it
 * holds. A pack made at one level and read at another would be read in the wrong order (amx's
 * tile rows against avx512_bf16's blocks of 8, or the reverse) and give wrong sums without any
 * sign: every call checks the stamp, and cf_conv_bf16_repack reorders a pack for the active
 * level from the bf16 weights it keeps. */
#define STAMP_WORDS 4
#define STAMP_MAGIC 0x6b635042u /* "BPck" */

static void stamp_make(const layout *l, uint32_t s[STAMP_WORDS]) {
    s[0] = STAMP_MAGIC ^ (uint32_t)l->k << 8 ^ (uint32_t)l->stride << 16 ^ (uint32_t)l->sub << 24;
    s[1] = (uint32_t)l->c;
    s[2] = (uint32_t)l->o;
    s[3] = (uint32_t)cf_isa_active();
}

/* Words of the forward's weights as columns (conv_cols), where cols_make chose it. */
static size_t cols_words(const layout *l) {
    return l->cols ? (size_t)l->taps * l->cp * up((size_t)l->o, 16) : 0;
}

/* ... and of dx's (dy's op pairs into c channels), where it chose dcols or d2cols (stride 2: the
 * phases' one after the other, each phase's taps in dx_stride2's order). */
static size_t dcols_words(const layout *l) {
    return l->dcols || l->d2cols ? (size_t)l->taps * l->op * up((size_t)l->c, 16) : 0;
}

static size_t pack_words(const layout *l) {
    const size_t fwd = up((size_t)l->o, ROWS) * l->taps * l->cp,
                 dx = up((size_t)l->c, ROWS) * l->taps * l->op;
    /* and the weights rounded to bf16 before they are permuted, the forward's and dx's columns,
     * a level's reordering (level_order), the stamp */
    return fwd + dx + ((size_t)l->o * l->c * l->taps + 1) / 2 + cols_words(l) + dcols_words(l) +
           order_words(l) + STAMP_WORDS;
}

size_t cf_conv_bf16_packed_floats(const cf_conv_geom *g, int out_channels) {
    layout l;
    layout_make(&l, g, out_channels);
    return pack_words(&l);
}

static uint32_t *stamp_at(const layout *l, const float *packed) {
    return (uint32_t *)packed + pack_words(l) - STAMP_WORDS;
}

/* CF_OK when packed holds this layout's weights for the active level; else CF_ERR_STATE naming
 * the call, what the pack was made for and what is active. */
static cf_status pack_check(const layout *l, const float *packed, const char *call) {
    uint32_t want[STAMP_WORDS];
    stamp_make(l, want);
    const uint32_t *have = stamp_at(l, packed);
    if (memcmp(want, have, STAMP_WORDS * sizeof(uint32_t)) == 0) return CF_OK;
    if (memcmp(want, have, 3 * sizeof(uint32_t)) != 0)
        return cf_fail(CF_ERR_STATE,
                       "%s: the packed weights were not made by cf_conv_bf16_pack for this layer "
                       "(%d -> %d channels, kernel %d, stride %d)",
                       call, l->c, l->o, l->k, l->stride);
    return cf_fail(CF_ERR_STATE,
                   "%s: the weights were packed for the %s kernels but the active level is %s "
                   "(cf_set_isa or CF_ISA changed it in between): repack them "
                   "(cf_conv_bf16_repack or cf_conv_bf16_pack)",
                   call, cf_isa_name((cf_isa)have[3]), cf_isa_name(cf_isa_active()));
}

/* A level with its own order of the packed weights (kernel_table.h's conv_order, the AMX
 * level's tiles) reorders each block after it is packed, through tmp (order_words). */
static void level_order(uint32_t *block, int taps, int pairs, int rows, uint32_t *tmp) {
    const cf_bf16_kernels *k = cf_active_kernels->bf16;
    if (k && k->conv_order && taps > 0) k->conv_order(block, taps, pairs, rows, tmp);
}

/* The pair of bf16 values a and b (either may be absent: zero). */
static uint32_t pair_of(const uint16_t *a, const uint16_t *b) {
    return (uint32_t)(a ? *a : 0) | (uint32_t)(b ? *b : 0) << 16;
}

/* The bf16 weights a pack keeps ([out][in][tap], before they are permuted). */
static uint16_t *pack_weights(const layout *l, float *packed) {
    return (uint16_t *)((uint32_t *)packed + up((size_t)l->o, ROWS) * l->taps * l->cp +
                        up((size_t)l->c, ROWS) * l->taps * l->op);
}

static void pack_from_bf16(const layout *lay, float *packed);

/* The forward's columns in a pack (cols_words; after its bf16 weights). */
static uint32_t *pack_cols(const layout *l, const float *packed) {
    return (uint32_t *)pack_weights(l, (float *)packed) + ((size_t)l->o * l->c * l->taps + 1) / 2;
}

/* dx's columns (dcols_words; after the forward's). */
static uint32_t *pack_dcols(const layout *l, const float *packed) {
    return pack_cols(l, packed) + cols_words(l);
}

/* conv_cols' weights of m rows, pair (r, t, p) at cols[(t * pairs + p) * up(m, 16) + r], zero
 * past m, from a pack's blocks before the level orders them (blocks: [block of 8 rows][tap][pair]
 * [8], rows past m zero; the forward's, r an output channel, or dx's, r an input channel): per
 * tap and pair, each block's 8 words side by side. */
static void cols_fill(const uint32_t *blocks, int taps, int pairs, int m, uint32_t *cols) {
    const int nb = (int)(up((size_t)m, ROWS) / ROWS);
    const size_t ld = up((size_t)m, 16);
    for (int t = 0; t < taps; t++)
        for (int p = 0; p < pairs; p++) {
            uint32_t *row = cols + ((size_t)t * pairs + p) * ld;
            for (int b = 0; b < nb; b++)
                memcpy(row + (size_t)b * ROWS, blocks + (((size_t)b * taps + t) * pairs + p) * ROWS,
                       ROWS * sizeof(uint32_t));
            memset(row + (size_t)nb * ROWS, 0, (ld - (size_t)nb * ROWS) * sizeof(uint32_t));
        }
}

void cf_conv_bf16_pack(const cf_conv_geom *g, int out_channels, const float *w, float *packed) {
    layout l;
    layout_make(&l, g, out_channels);
    cf_fp32_to_bf16(w, pack_weights(&l, packed), (size_t)l.o * l.c * l.taps);
    pack_from_bf16(&l, packed);
}

bool cf_conv_bf16_pack_current(const cf_conv_geom *g, int out_channels, const float *packed) {
    layout l;
    layout_make(&l, g, out_channels);
    uint32_t want[STAMP_WORDS];
    stamp_make(&l, want);
    return memcmp(want, stamp_at(&l, packed), sizeof want) == 0;
}

cf_status cf_conv_bf16_repack(const cf_conv_geom *g, int out_channels, float *packed) {
    layout l;
    layout_make(&l, g, out_channels);
    uint32_t want[STAMP_WORDS];
    stamp_make(&l, want);
    if (memcmp(want, stamp_at(&l, packed), 3 * sizeof(uint32_t)) != 0)
        return pack_check(&l, packed, "cf_conv_bf16_repack");
    if (!cf_conv_bf16_supported(g, out_channels))
        return cf_fail(CF_ERR_UNSUPPORTED,
                       "cf_conv_bf16_repack: the active level (%s) has no bf16 convolution",
                       cf_isa_name(cf_isa_active()));
    pack_from_bf16(&l, packed);
    return CF_OK;
}

/* dx's words before the level orders them, [row block of 8 inputs][tap][output pair][8]: per
 * phase at stride 2 (its taps, the phases one after the other), else every tap reversed. In the
 * order the bf16 weights lie ([out][in][tap]): per block of 8 input channels and output pair, the
 * two output rows' 8 kernels (8 x taps halves in a row each) give that pair's words of every tap,
 * so each line of the weights is read once. (Per tap and input channel over the output pairs, as
 * dx_plain, the reads were 2 C taps halves apart: 4.6 KiB on W3's l4, 8 of the L1 sets, and each
 * line was fetched again from L2 for every input channel and tap; 5% of that layer's step.) */
static void dx_words(const layout *lay, const uint16_t *wb, uint32_t *dx) {
    const layout l = *lay;
    const int O = l.o, C = l.c, T = l.taps, blocks = (int)(up((size_t)C, ROWS) / ROWS);
    uint32_t *at[4]; /* each phase's words (stride 2), or all taps' */
    int ntap[4] = {T, 0, 0, 0}, tap[4][MAX_TAPS];
    const int phases = l.stride == 2 ? 4 : 1;
    for (int ph = 0; ph < phases; ph++) {
        if (l.stride == 2) ntap[ph] = l.ntap[ph];
        for (int j = 0; j < ntap[ph]; j++) tap[ph][j] = l.stride == 2 ? l.dtap[ph][j] : T - 1 - j;
        at[ph] = ph ? at[ph - 1] + up((size_t)C, ROWS) * ntap[ph - 1] * l.op : dx;
    }
    for (int cb = 0; cb < blocks; cb++)
        for (int p = 0; p < l.op; p++) {
            /* rows 2p and 2p + 1 from input channel 8 cb: channel c's taps at (c - 8 cb) T */
            const uint16_t *lo = wb + ((size_t)2 * p * C + (size_t)cb * ROWS) * T,
                           *hi = 2 * p + 1 < O ? lo + (size_t)C * T : NULL;
            for (int ph = 0; ph < phases; ph++)
                for (int j = 0; j < ntap[ph]; j++) {
                    uint32_t *out = at[ph] + (((size_t)cb * ntap[ph] + j) * l.op + p) * ROWS;
                    const int t = tap[ph][j];
                    for (int r = 0; r < ROWS; r++) {
                        const bool in = cb * ROWS + r < C;
                        out[r] = pair_of(in ? lo + (size_t)r * T + t : NULL,
                                         in && hi ? hi + (size_t)r * T + t : NULL);
                    }
                }
        }
}

/* dx_words' words as they were made before, per tap and input channel over the output pairs:
 * the reference that test_bf16_pack compares dx_words with (cf__conv_bf16_dx_words). */
static void dx_plain(const layout *lay, const uint16_t *wb, uint32_t *dx) {
    const layout l = *lay;
    const int O = l.o, C = l.c, T = l.taps;
#define W(o, c, t) (&wb[((size_t)(o)*C + (c)) * T + (t)])
    if (l.stride == 2) {
        for (int ph = 0; ph < 4; ph++) {
            for (int c = 0; c < (int)up((size_t)C, ROWS); c++)
                for (int j = 0; j < l.ntap[ph]; j++)
                    for (int p = 0; p < l.op; p++) {
                        const bool in = c < C;
                        const int t = l.dtap[ph][j];
                        dx[(((size_t)(c / ROWS) * l.ntap[ph] + j) * l.op + p) * ROWS + c % ROWS] =
                            pair_of(in ? W(2 * p, c, t) : NULL,
                                    in && 2 * p + 1 < O ? W(2 * p + 1, c, t) : NULL);
                    }
            dx += up((size_t)C, ROWS) * l.ntap[ph] * l.op; /* the next phase's */
        }
        return;
    }
    for (int c = 0; c < (int)up((size_t)C, ROWS); c++)
        for (int t = 0; t < T; t++)
            for (int p = 0; p < l.op; p++) {
                const bool in = c < C;
                const int tf = T - 1 - t;
                dx[(((size_t)(c / ROWS) * T + t) * l.op + p) * ROWS + c % ROWS] = pair_of(
                    in ? W(2 * p, c, tf) : NULL, in && 2 * p + 1 < O ? W(2 * p + 1, c, tf) : NULL);
            }
#undef W
}

/* Words of dx's part of a pack (before the level orders them). */
static size_t dx_part_words(const layout *l) {
    return up((size_t)l->c, ROWS) * l->taps * l->op;
}

/* For test_bf16_pack: dx's words of the bf16 weights wb ([out][in][tap]) made by the pack's loop
 * (plain: false) or by the reference (true) into dx (cf__conv_bf16_dx_words_size words). */
size_t cf__conv_bf16_dx_words_size(const cf_conv_geom *g, int out_channels);
size_t cf__conv_bf16_dx_words_size(const cf_conv_geom *g, int out_channels) {
    layout l;
    layout_make(&l, g, out_channels);
    return dx_part_words(&l);
}
void cf__conv_bf16_dx_words(const cf_conv_geom *g, int out_channels, const uint16_t *wb,
                            uint32_t *dx, bool plain);
void cf__conv_bf16_dx_words(const cf_conv_geom *g, int out_channels, const uint16_t *wb,
                            uint32_t *dx, bool plain) {
    layout l;
    layout_make(&l, g, out_channels);
    (plain ? dx_plain : dx_words)(&l, wb, dx);
}

/* The pack's two orders from its bf16 weights, for the active level, and its stamp. */
static void pack_from_bf16(const layout *lay, float *packed) {
    const layout l = *lay;
    uint32_t *fwd = (uint32_t *)packed, *dx = fwd + up((size_t)l.o, ROWS) * l.taps * l.cp;
    const uint16_t *wb = pack_weights(&l, packed);
    const int O = l.o, C = l.c, T = l.taps;
    uint32_t *order_tmp = stamp_at(&l, packed) - order_words(&l);
    stamp_make(&l, stamp_at(&l, packed));
    /* forward: [row block][tap][input pair][8 output channels], a row's taps read in order
     * (once per forward pass: a loop without branches per word) */
    for (int o = 0; o < (int)up((size_t)O, ROWS); o++) {
        uint32_t *blk = fwd + (size_t)(o / ROWS) * T * l.cp * ROWS + o % ROWS;
        const uint16_t *row = wb + (size_t)(o < O ? o : 0) * C * T;
        for (int p = 0; p < l.cp; p++) {
            const uint16_t *lo = row + (size_t)2 * p * T, *hi = lo + T;
            const uint32_t keep = o < O ? 0xffffffffu : 0, keep_hi = 2 * p + 1 < C ? keep : 0;
            for (int t = 0; t < T; t++)
                blk[((size_t)t * l.cp + p) * ROWS] =
                    ((uint32_t)lo[t] | (uint32_t)(keep_hi ? hi[t] : 0) << 16) & keep;
        }
    }
    if (l.cols) cols_fill(fwd, T, l.cp, O, pack_cols(&l, packed));
    level_order(fwd, T, l.cp, O, order_tmp);
    dx_words(&l, wb, dx);
    if (l.stride == 2) { /* each phase's block, ordered on its own */
        uint32_t *dc = pack_dcols(&l, packed);
        for (int ph = 0; ph < 4; ph++) {
            if (l.d2cols) cols_fill(dx, l.ntap[ph], l.op, C, dc);
            dc += (size_t)l.ntap[ph] * l.op * up((size_t)C, 16);
            level_order(dx, l.ntap[ph], l.op, C, order_tmp);
            dx += up((size_t)C, ROWS) * l.ntap[ph] * l.op; /* the next phase's */
        }
        return;
    }
    if (l.dcols || l.d2cols) cols_fill(dx, T, l.op, C, pack_dcols(&l, packed));
    level_order(dx, T, l.op, C, order_tmp);
}

/* dx2_cols' scratch: cnb + 1 slots of dy's pair planes and of a paired shortcut's (up to the
 * layer's largest side of pairs; the last tile of a call reads on into the slot after its last
 * image), the four phases' dense planes and the shortcut's product (cnb images of c x oh x ow
 * each), conv_cols' tiles. */
static size_t d2_words(const layout *l) {
    const size_t pairs = (size_t)(l->cp > l->op ? l->cp : l->op), slots = (size_t)l->cnb + 1,
                 planes = (size_t)l->cnb * l->c * l->ohw;
    return slots * ((size_t)l->op + pairs) * l->planed + 5 * planes +
           up((size_t)l->cnb * l->ohw, COLS_TILE) * 64;
}

/* Words of the forward's and dx's scratch: the pair planes, then the output rows (fp32). */
static size_t run_words(const layout *l) {
    const size_t pairs = (size_t)(l->cp > l->op ? l->cp : l->op),
                 rows = up((size_t)(l->c > l->o ? l->c : l->o), ROWS);
    const size_t run = (size_t)l->phases * pairs * l->plane + rows * l->nq;
    /* stride 2's dx, and a paired shortcut's (at most as many pairs as this layer's largest
     * side): its dy's pair planes and its 1x1 product */
    const size_t dx2 =
        l->stride == 1 ? 0
                       : (size_t)l->op * l->planed + 4 * up((size_t)l->c, ROWS) * (size_t)l->nqd +
                             pairs * l->planed + up((size_t)l->c, ROWS) * (size_t)l->nqd;
    size_t most = run > dx2 ? run : dx2;
    /* conv_cols' last tile of a call reads up to np - 1 <= ow - 1 positions past the call's
     * last image, in the next image's slot: its first row, at every tap and pair, so below
     * (slot words - plane) + largest shift + np - 1 < slot words from the slot's start (a
     * plane holds at least oh x wq + reach >= np + reach words). With a whole call that slot is
     * the tiles' buffer after the cnb slots; it is at least a slot long, so the read stays in
     * this part of the scratch for every shape (before, the tiles alone: wide inputs such as
     * 64 -> 32 channels at stride 2 on 28 x 28 read on into the weight gradient's part). */
    if (l->cols) { /* forward_cols: the pair planes, conv_cols' tiles of any m up to 64 */
        const size_t image = (size_t)l->phases * l->cp * l->cplane,
                     tiles = up((size_t)l->cnb * l->ohw, COLS_TILE) * 64,
                     c = (size_t)l->cnb * image + (tiles > image ? tiles : image);
        if (c > most) most = c;
    }
    if (l->dcols) { /* dx_cols: dy's pair planes, then the tiles, at least an image's planes
                     * long (a last tile that runs past the call's last image reads there) */
        const size_t image = (size_t)l->op * l->cplane,
                     tiles = up((size_t)l->cnb * l->ohw, COLS_TILE) * 64,
                     c = (size_t)l->cnb * image + (tiles > image ? tiles : image);
        if (c > most) most = c;
    }
    if (l->d2cols && l->stride == 2) { /* dx2_cols: d2_words */
        const size_t c = d2_words(l);
        if (c > most) most = c;
    }
    if (l->compact) { /* an image's padded pair planes, the gathered taps, the output rows */
        size_t c =
            (size_t)pairs * l->hp * l->wp + (size_t)l->taps * pairs * l->qf + rows * (size_t)l->qf;
        if (l->stride == 2) /* and dx_compact2's: four phases' rows, a shortcut's pairs and rows */
            c += (size_t)pairs * (l->hq + l->pad) * l->wd + 4 * rows * (size_t)l->qf +
                 (size_t)pairs * l->qf + rows * (size_t)l->qf;
        if (c > most) most = c;
    }
    return most;
}

/* Words of the weight gradient's scratch: x's padded rows (uint16), X0 and X1, dy's rows
 * (uint16, whole blocks of 8). */
static size_t wgrad_words(const layout *l) {
    if (l->compact) /* an image's padded bf16 planes, the gathered rows, X0 and X1, dy's rows */
        return ((size_t)l->c * l->hp * l->wp + 1) / 2 + (size_t)l->c * l->lxc / 2 +
               2 * (size_t)l->xrows * l->ldb + up((size_t)l->o, ROWS) * l->qw / 2;
    return (size_t)l->c * l->lx / 2 + 2 * (size_t)l->rows * l->ldb +
           up((size_t)l->o, ROWS) * l->dl / 2;
}

/* ... and at stride 2, a paired shortcut's dy rows (up to max(c, o) output channels). */
static size_t wgrad_words_paired(const layout *l) {
    const size_t most = (size_t)(l->c > l->o ? l->c : l->o);
    return wgrad_words(l) +
           (l->stride == 2 ? up(most, ROWS) * (l->compact ? (size_t)l->qw : l->dl) / 2 : 0);
}

/* Where wgrad (not compact) keeps dy's bf16 rows in its scratch: after x's rows, X0 and X1. */
static const uint16_t *wgrad_dy_rows(const layout *l, const float *wscratch) {
    const uint16_t *xb = (const uint16_t *)wscratch;
    const uint32_t *x0 = (const uint32_t *)(xb + (size_t)l->c * l->lx);
    return (const uint16_t *)(x0 + 2 * (size_t)l->rows * l->ldb);
}

/* Floats at the scratch's start that the forward and dx use (the rest is the weight
 * gradient's): test_bf16_cols gives a forward no more, to check conv_cols' reads. */
size_t cf__conv_bf16_run_scratch(const cf_conv_geom *g, int out_channels);
size_t cf__conv_bf16_run_scratch(const cf_conv_geom *g, int out_channels) {
    layout l;
    layout_make(&l, g, out_channels);
    return run_words(&l);
}

size_t cf_conv_bf16_scratch(const cf_conv_geom *g, int out_channels) {
    layout l;
    layout_make(&l, g, out_channels);
    /* both at once: cf_conv_bf16_backward keeps each part's zeros from block to block */
    return up(run_words(&l), 16) + wgrad_words_paired(&l);
}

/* Where a row's first and second values go in a stride-2 layer's phase rows: the value at padded
 * column pad + j lands in phase (pad + j) % 2 at (pad + j) / 2, so the even values of the row
 * (dealt to e) start in phase pad % 2 at pad / 2 and the odd ones in phase (pad + 1) % 2 at
 * (pad + 1) / 2; phase1 is phase0 + step. */
#define DEAL_DEST(pad, phase0, step, e, o)                                                         \
    do {                                                                                           \
        (e) = (phase0) + (size_t)((pad) % 2) * (step) + (pad) / 2;                                 \
        (o) = (phase0) + (size_t)(((pad) + 1) % 2) * (step) + ((pad) + 1) / 2;                     \
    } while (0)

/* out[i * ldo + j] = lo[i * ldi + j] | hi[i * ldi + j] << 16 for i < h, j < w: two bf16 rows
 * paired (already rounded: a copy). */
static void pair_halves(const uint16_t *lo, const uint16_t *hi, size_t ldi, int h, int w,
                        uint32_t *out, size_t ldo) {
    cf_active_kernels->bf16->halves_rows(lo, hi, ldi, h, w, out, ldo);
}

/* Stride 2's dx pairs of two channels of dy from the weight gradient's bf16 rows of them (lo,
 * and the next channel's l->dl on; an image's row i at i * wq): dst[i * wd + j] for i < oh, j <
 * ow. */
static void rows_pairs(const uint16_t *lo, const layout *l, const cf_conv_geom *g, uint32_t *dst) {
    pair_halves(lo, lo + l->dl, (size_t)l->wq, g->oh, g->ow, dst, (size_t)l->wd);
}

/* One image's products from its pair planes xp (phase_words a phase): `rows` output channels
 * through conv_run into out (l->nq a row), copied to y without the dropped columns, and with a
 * paired shortcut its 1x1 product of the phase plane that holds x[2i][2j] into image n of sc->y. */
static void image_products(const cf_bf16_kernels *k, const layout *l, const cf_conv_geom *g,
                           const int *off, int pairs, int rows, const uint32_t *packed,
                           const uint32_t *xp, size_t phase_words, float *out, float *y,
                           const cf_conv_shortcut *sc, int n) {
    k->conv_run(l->taps, off, pairs, rows, packed, xp, l->plane, l->nq, out, (size_t)l->nq);
    for (int r = 0; r < rows; r++)
        k->copy_rows(out + (size_t)r * l->nq, (size_t)l->wq, g->oh, g->ow,
                     y + (size_t)r * g->oh * g->ow);
    if (!sc) return;
    const int so = sc->out_channels,
              soff = (int)(sub_phase(l->pad) * phase_words) + sub_shift(l->pad, l->wq);
    k->conv_run(1, &soff, pairs, so, (const uint32_t *)sc->w, xp, l->plane, l->nq, out,
                (size_t)l->nq);
    float *ys = sc->y + (size_t)n * so * g->oh * g->ow;
    for (int r = 0; r < so; r++)
        k->copy_rows(out + (size_t)r * l->nq, (size_t)l->wq, g->oh, g->ow,
                     ys + (size_t)r * g->oh * g->ow);
}

/* The forward pass (or stride 1's dx) of n images: src has `ch` channels of h x w, dst rows
 * channels of oh x ow; packed as the kernel reads it. Stride 1's dx may take its pairs from the
 * weight gradient's bf16 rows of the same images' dy (dyrows: channel o's row at o * l->dl, image
 * n at n * l->s, row i at i * wp, zero in the dropped columns and in the rows past the channels):
 * an image's oh * wp positions from there are its padded plane's from (pad, pad) on, the dropped
 * columns landing on the pad columns, so one run of pairs per plane replaces the conversion of dy
 * (bitwise: both are the same bf16 roundings of dy). */
static void run_images(const layout *l, const cf_conv_geom *g, int ch, int rows,
                       const uint32_t *packed, const float *src, int n_images, float *dst,
                       float *scratch, const cf_conv_shortcut *sc, bool zeroed,
                       const uint16_t *dyrows) {
    const cf_bf16_kernels *k = cf_active_kernels->bf16;
    const int pairs = (ch + 1) / 2;
    uint32_t *xp = (uint32_t *)scratch;
    const size_t phase_words = (size_t)pairs * l->plane;
    float *out = (float *)(xp + l->phases * phase_words);
    const size_t in_n = (size_t)ch * g->h * g->w, out_n = (size_t)rows * g->oh * g->ow;
    int off[MAX_TAPS];
    for (int t = 0; t < l->taps; t++) off[t] = (int)(l->phase[t] * phase_words) + l->shift[t];
    if (!zeroed) /* the border stays zero */
        memset(xp, 0, l->phases * phase_words * sizeof(uint32_t));
    for (int n = 0; n < n_images; n++) {
        const float *x = src + (size_t)n * in_n;
        for (int p = 0; p < pairs && dyrows; p++) {
            const uint16_t *lo = dyrows + (size_t)2 * p * l->dl + (size_t)n * l->s;
            pair_halves(lo, lo + l->dl, 0, 1, g->oh * l->wp,
                        xp + (size_t)p * l->plane + (size_t)l->pad * l->wp + l->pad, 0);
        }
        for (int p = 0; p < pairs && !dyrows; p++) {
            const float *lo = x + (size_t)2 * p * g->h * g->w;
            const float *hi = 2 * p + 1 < ch ? lo + (size_t)g->h * g->w : NULL;
            uint32_t *plane = xp + (size_t)p * l->plane;
            if (l->sub) { /* the even columns of the even rows */
                deal_pairs_of(k)(lo, hi, (size_t)2 * g->w, g->oh, 2 * g->ow - 1, plane, NULL,
                                 (size_t)l->wq);
                continue;
            }
            if (l->stride == 1) {
                pairs_rows_of(k)(lo, hi, g->h, g->w, plane + (size_t)l->pad * l->wp + l->pad,
                                 (size_t)l->wp);
                continue;
            }
            /* stride 2: the rows' even and odd padded columns to their phase planes, the
             * image's even rows and its odd ones each to consecutive rows of a phase */
            for (int i0 = 0; i0 < 2 && i0 < g->h; i0++) {
                const int r = i0 + l->pad;
                uint32_t *row = plane + (size_t)(r % 2 * 2) * phase_words + (size_t)(r / 2) * l->wq,
                         *e, *o;
                DEAL_DEST(l->pad, row, phase_words, e, o);
                deal_pairs_of(k)(lo + (size_t)i0 * g->w, hi ? hi + (size_t)i0 * g->w : NULL,
                                 (size_t)2 * g->w, (g->h - i0 + 1) / 2, g->w, e, o, (size_t)l->wq);
            }
        }
        image_products(k, l, g, off, pairs, rows, packed, xp, phase_words, out,
                       dst + (size_t)n * out_n, sc, n);
    }
}

/* An image's pair planes from x's bf16 words (xw: its ch = 2 * pairs channels of h x w, an
 * even count), where run_images puts the pairs it rounds from fp32: stride 1's padded planes
 * (halves_rows), stride 2's phase planes (deal_pairs_h, as run_images' deal; never the
 * subsampled layer, which keeps no words). planes: pair p's at p * plane, a phase's phase_words
 * apart. Bitwise run_images' words for the fp32 values the words were rounded from. */
static void words_planes(const layout *l, const cf_conv_geom *g, const uint16_t *xw, int pairs,
                         uint32_t *planes, size_t plane, size_t phase_words) {
    const cf_bf16_kernels *k = cf_active_kernels->bf16;
    const size_t hw = (size_t)g->h * g->w;
    for (int p = 0; p < pairs; p++) {
        const uint16_t *lo = xw + (size_t)2 * p * hw, *hi = lo + hw;
        uint32_t *pl = planes + (size_t)p * plane;
        if (l->stride == 1) {
            k->halves_rows(lo, hi, (size_t)g->w, g->h, g->w, pl + (size_t)l->pad * l->wp + l->pad,
                           (size_t)l->wp);
            continue;
        }
        for (int i0 = 0; i0 < 2 && i0 < g->h; i0++) {
            const int r = i0 + l->pad;
            uint32_t *row = pl + (size_t)(r % 2 * 2) * phase_words + (size_t)(r / 2) * l->wq, *e,
                     *o;
            DEAL_DEST(l->pad, row, phase_words, e, o);
            k->deal_pairs_h(lo + (size_t)i0 * g->w, hi + (size_t)i0 * g->w, (size_t)2 * g->w,
                            (g->h - i0 + 1) / 2, g->w, e, o, (size_t)l->wq);
        }
    }
}

/* ---- small planes: every tap's inputs gathered to the output positions (layout.compact) -----
 *
 * Output position q = i * ow + j of image b of a call is column b * ohw + q (the forward) or
 * b * ppi + q (the weight gradient) of a row per tap and channel (pair), with no padding between
 * them: tap (ki, kj) holds the padded image's (s i + ki, s j + kj). The same kernels then run
 * over the gathered rows (tap t's rows start t rows of pairs apart), so the sums are the
 * padded-stride layout's, term for term. */

/* to[i * ow + j] = from[s * i * ld + s * j] for i < oh, j < ow, for words and for halves. */
/* (rows of 4 to 8 values: plain loops, not a call of memcpy per row) */
#define GATHER(name, type)                                                                         \
    static void name(const type *restrict from, size_t ld, int s, int oh, int ow,                  \
                     type *restrict to) {                                                          \
        for (int i = 0; i < oh; i++, to += ow, from += (size_t)s * ld)                             \
            for (int j = 0; j < ow; j++) to[j] = from[s * j];                                      \
    }
GATHER(gather_words, uint32_t)
GATHER(gather_halves, uint16_t)
#undef GATHER

/* The forward pass (or stride 1's dx) of n images through the gathered taps, bf images per call
 * of conv_run: src has ch channels of h x w, dst `rows` channels of oh x ow; with a paired
 * shortcut (stride 2), its 1x1 product of the tap that reads x[2i][2j]. */
static void run_compact(const layout *l, const cf_conv_geom *g, int ch, int rows,
                        const uint32_t *packed, const float *src, int n_images, float *dst,
                        float *scratch, const cf_conv_shortcut *sc) {
    const cf_bf16_kernels *k = cf_active_kernels->bf16;
    const int pairs = (ch + 1) / 2, s = l->stride, Q = l->qf, ohw = l->ohw;
    const size_t hw = (size_t)l->hp * l->wp, in_plane = (size_t)g->h * g->w,
                 in_n = (size_t)ch * in_plane, out_n = (size_t)rows * ohw,
                 tap_words = (size_t)pairs * Q;
    uint32_t *xp = (uint32_t *)scratch, *xg = xp + (size_t)pairs * hw;
    float *out = (float *)(xg + (size_t)l->taps * tap_words);
    int off[MAX_TAPS];
    for (int t = 0; t < l->taps; t++) off[t] = (int)(t * tap_words);
    memset(xp, 0, (size_t)pairs * hw * sizeof(uint32_t)); /* the border stays zero */
    /* positions past a call's images (their outputs are dropped) */
    memset(xg, 0, (size_t)l->taps * tap_words * sizeof(uint32_t));
    for (int n0 = 0; n0 < n_images; n0 += l->bf) {
        const int nb = n_images - n0 < l->bf ? n_images - n0 : l->bf;
        for (int b = 0; b < nb; b++) {
            const float *x = src + (size_t)(n0 + b) * in_n;
            for (int p = 0; p < pairs; p++) {
                const float *lo = x + (size_t)2 * p * in_plane,
                            *hi = 2 * p + 1 < ch ? lo + in_plane : NULL;
                pairs_rows_of(k)(lo, hi, g->h, g->w,
                                 xp + (size_t)p * hw + (size_t)l->pad * l->wp + l->pad,
                                 (size_t)l->wp);
            }
            for (int t = 0; t < l->taps; t++) {
                const int ki = t / l->k, kj = t % l->k;
                for (int p = 0; p < pairs; p++)
                    gather_words(xp + (size_t)p * hw + (size_t)ki * l->wp + kj, (size_t)l->wp, s,
                                 g->oh, g->ow,
                                 xg + t * tap_words + (size_t)p * Q + (size_t)b * ohw);
            }
        }
        k->conv_run(l->taps, off, pairs, rows, packed, xg, (size_t)Q, Q, out, (size_t)Q);
        for (int b = 0; b < nb; b++)
            k->copy_rows(out + (size_t)b * ohw, (size_t)Q, rows, ohw,
                         dst + (size_t)(n0 + b) * out_n);
        if (sc) {
            const int so = sc->out_channels, tc = l->pad * l->k + l->pad;
            k->conv_run(1, &off[tc], pairs, so, (const uint32_t *)sc->w, xg, (size_t)Q, Q, out,
                        (size_t)Q);
            for (int b = 0; b < nb; b++)
                k->copy_rows(out + (size_t)b * ohw, (size_t)Q, so, ohw,
                             sc->y + (size_t)(n0 + b) * so * ohw);
        }
    }
}

/* The weight gradient through the gathered taps, bw images per block (into dw, or added with
 * accumulate); with a paired shortcut, its own from the tap that reads x[2i][2j]. */
static void wgrad_compact(const layout *l, const cf_conv_geom *g, const float *dy, const float *x,
                          int n_images, float *dw, float *scratch, const cf_conv_shortcut *sc,
                          bool accumulate) {
    const cf_bf16_kernels *k = cf_active_kernels->bf16;
    const int C = l->c, O = l->o, Q = l->qw, s = l->stride, ohw = l->ohw;
    const size_t hw = (size_t)l->hp * l->wp, plane = (size_t)g->h * g->w, in_n = (size_t)C * plane,
                 out_n = (size_t)O * ohw;
    uint16_t *xpad = (uint16_t *)scratch;                 /* one image's padded bf16 planes */
    uint16_t *xc = xpad + 2 * (((size_t)C * hw + 1) / 2); /* C rows of lxc: the taps' positions */
    uint32_t *x0 = (uint32_t *)(xc + (size_t)C * l->lxc), *x1 = x0 + (size_t)l->xrows * l->ldb;
    uint16_t *dyb = (uint16_t *)(x1 + (size_t)l->xrows * l->ldb); /* O rows of Q */
    uint16_t *dys = dyb + up((size_t)O, ROWS) * Q;                /* the shortcut's */
    int half[MAX_TAPS];
    unsigned char odd[MAX_TAPS];
    for (int t = 0; t < l->taps; t++) {
        half[t] = t * Q / 2;
        odd[t] = 0;
    }
    /* borders, a position pair's second half past an odd plane, rows past O: zero */
    memset(scratch, 0, (sc ? wgrad_words_paired(l) : wgrad_words(l)) * sizeof(uint32_t));
    for (int n0 = 0; n0 < n_images; n0 += l->bw) {
        const int nb = n_images - n0 < l->bw ? n_images - n0 : l->bw;
        for (int b = 0; b < nb; b++) {
            const float *xn = x + (size_t)(n0 + b) * in_n;
            for (int c = 0; c < C; c++) {
                uint16_t *pc = xpad + (size_t)c * hw;
                rows_of(k)(xn + (size_t)c * plane, g->h, g->w, pc + (size_t)l->pad * l->wp + l->pad,
                           (size_t)l->wp);
                for (int t = 0; t < l->taps; t++)
                    gather_halves(pc + (size_t)(t / l->k) * l->wp + t % l->k, (size_t)l->wp, s,
                                  g->oh, g->ow,
                                  xc + (size_t)c * l->lxc + (size_t)t * Q + (size_t)b * l->ppi);
            }
            rows_of(k)(dy + (size_t)(n0 + b) * out_n, O, ohw, dyb + (size_t)b * l->ppi, (size_t)Q);
            if (sc)
                rows_of(k)(sc->dy + (size_t)(n0 + b) * sc->out_channels * ohw, sc->out_channels,
                           ohw, dys + (size_t)b * l->ppi, (size_t)Q);
        }
        /* X0: the gathered rows' position pairs transposed (X1 is not read: every tap starts
         * on an even position) */
        k->position_pairs(xc, l->lxc, C, l->xrows, x0, x1, l->ldb);
        const int nq2 = nb * l->ppi / 2; /* a partial block sums its own images alone */
        k->conv_wgrad(l->taps, half, odd, O, C, nq2, (const uint32_t *)dyb, (size_t)Q / 2, x0, x1,
                      l->ldb, dw, (size_t)C, (size_t)O * C, accumulate || n0 > 0);
        if (sc) {
            const int tc = l->pad * l->k + l->pad;
            k->conv_wgrad(1, &half[tc], &odd[tc], sc->out_channels, C, nq2, (const uint32_t *)dys,
                          (size_t)Q / 2, x0, x1, l->ldb, sc->dw, (size_t)C,
                          (size_t)sc->out_channels * C, accumulate || n0 > 0);
        }
    }
}

/* Stride 2's dx through the gathered taps: per phase (a, b) of the padded input, the phase's
 * taps of dy (padded by pad, as dx_stride2 reads it) gathered to the phase's positions inside the
 * image, (h / 2) x (w / 2) of them, the same kernel with the phase's pack, and the four phases'
 * rows interleaved into dx; a paired shortcut's 1x1 product added to the phase that holds
 * dx[2i][2j]. */
static void dx_compact2(const layout *l, const cf_conv_geom *g, const uint32_t *packed,
                        const float *dy, int n_images, float *dx, float *scratch,
                        const cf_conv_shortcut *sc) {
    const cf_bf16_kernels *k = cf_active_kernels->bf16;
    const int pairs = l->op, C = l->c, P = l->pad, Q = l->qf, ohw = l->ohw, wd = l->wd;
    const size_t hd = (size_t)g->oh + 2 * P, dplane = hd * wd, tap_words = (size_t)pairs * Q,
                 outw = up((size_t)C, ROWS) * Q, in_n = (size_t)C * g->h * g->w,
                 out_n = (size_t)l->o * ohw;
    uint32_t *dp = (uint32_t *)scratch, *xg = dp + (size_t)pairs * dplane;
    float *out = (float *)(xg + (size_t)l->taps * tap_words);
    const size_t swords = (size_t)(l->cp > l->op ? l->cp : l->op) * Q; /* a shortcut's pairs */
    uint32_t *sdp = (uint32_t *)(out + 4 * outw);
    float *sout = (float *)(sdp + swords);
    const int spairs = sc ? (sc->out_channels + 1) / 2 : 0;
    /* phase ph's taps are rows first[ph] on of the gathered taps */
    int off[MAX_TAPS], first[4];
    for (int t = 0; t < l->taps; t++) off[t] = (int)(t * tap_words);
    for (int ph = 0, sum = 0; ph < 4; sum += l->ntap[ph++]) first[ph] = sum;
    memset(dp, 0, (size_t)pairs * dplane * sizeof(uint32_t)); /* the border */
    memset(xg, 0, (size_t)l->taps * tap_words * sizeof(uint32_t));
    if (sc) memset(sdp, 0, swords * sizeof(uint32_t));
    /* phase (a, b) holds the padded rows 2u + a, u from u0[a]: image rows 2i + (2 u0 + a - P) */
    int u0[2], par[2];
    for (int a = 0; a < 2; a++) {
        u0[a] = (P - a + 1) / 2;
        par[a] = 2 * u0[a] + a - P;
    }
    for (int n0 = 0; n0 < n_images; n0 += l->bf) {
        const int nb = n_images - n0 < l->bf ? n_images - n0 : l->bf;
        for (int i = 0; i < nb; i++) {
            const float *dyn = dy + (size_t)(n0 + i) * out_n;
            for (int p = 0; p < pairs; p++) {
                const float *lo = dyn + (size_t)2 * p * ohw,
                            *hi = 2 * p + 1 < l->o ? lo + ohw : NULL;
                pairs_rows_of(k)(lo, hi, g->oh, g->ow, dp + (size_t)p * dplane + (size_t)P * wd + P,
                                 (size_t)wd);
            }
            for (int ph = 0; ph < 4; ph++)
                for (int j = 0; j < l->ntap[ph]; j++) {
                    const int t = l->dtap[ph][j], ki = t / l->k, kj = t % l->k;
                    const size_t from =
                        (size_t)(u0[ph / 2] + P - ki / 2) * wd + (u0[ph % 2] + P - kj / 2);
                    for (int p = 0; p < pairs; p++)
                        gather_words(dp + (size_t)p * dplane + from, (size_t)wd, 1, g->oh, g->ow,
                                     xg + (first[ph] + j) * tap_words + (size_t)p * Q +
                                         (size_t)i * ohw);
                }
        }
        const uint32_t *pk = packed;
        for (int ph = 0; ph < 4; ph++) {
            k->conv_run(l->ntap[ph], off + first[ph], pairs, C, pk, xg, (size_t)Q, Q,
                        out + ph * outw, (size_t)Q);
            pk += up((size_t)C, ROWS) * l->ntap[ph] * pairs;
        }
        if (sc) {
            const int so = sc->out_channels, zero = 0;
            for (int i = 0; i < nb; i++) {
                const float *dys = sc->dy + (size_t)(n0 + i) * so * ohw;
                for (int p = 0; p < spairs; p++) {
                    const float *lo = dys + (size_t)2 * p * ohw,
                                *hi = 2 * p + 1 < so ? lo + ohw : NULL;
                    pairs_rows_of(k)(lo, hi, 1, ohw, sdp + (size_t)p * Q + (size_t)i * ohw, 0);
                }
            }
            k->conv_run(1, &zero, spairs, C, shortcut_dx_pack(sc, C), sdp, (size_t)Q, Q, sout,
                        (size_t)Q);
            /* dx[2i][2j]: the phase whose rows and columns have parity 0 */
            const int ph0 = (par[0] == 0 ? 0 : 2) + (par[0] == 0 ? 0 : 1);
            float *dst = out + ph0 * outw;
            for (size_t q = 0; q < (size_t)C * Q; q++) dst[q] += sout[q];
        }
        for (int i = 0; i < nb; i++) {
            float *dxn = dx + (size_t)(n0 + i) * in_n;
            for (int c = 0; c < C; c++)
                for (int a = 0; a < 2; a++) {
                    /* rows 2r + par[a] from phases (a, 0) and (a, 1), columns by their parity */
                    const float *s0 = out + (2 * a) * outw + (size_t)c * Q + (size_t)i * ohw,
                                *s1 = out + (2 * a + 1) * outw + (size_t)c * Q + (size_t)i * ohw;
                    const float *even = par[0] == 0 ? s0 : s1, *odd = par[0] == 0 ? s1 : s0;
                    for (int r = 0; r < g->oh; r++)
                        k->interleave(even + (size_t)r * g->ow, odd + (size_t)r * g->ow, g->w,
                                      dxn + ((size_t)c * g->h + 2 * r + par[a]) * g->w);
                }
        }
    }
}

/* The pack of a paired shortcut (a 1x1 stride-2 layer on g's input) checked as its own. */
static cf_status shortcut_check(const cf_conv_geom *g, const cf_conv_shortcut *sc,
                                const char *call) {
    cf_conv_geom sg;
    layout sl;
    if (!cf_conv_geom_init(&sg, g->c, g->h, g->w, 1, 1, 2, 2, 0, 0))
        return cf_fail(CF_ERR_INVALID, "%s: no 1x1 stride-2 shortcut fits a %d x %d input", call,
                       g->h, g->w);
    layout_make(&sl, &sg, sc->out_channels);
    return pack_check(&sl, sc->w, call);
}

/* The forward pass of n images through conv_cols (l->cols), cnb images per call: x's pair
 * planes as run_images makes them (cplane words each; image b's from b * image_words), then the
 * images' positions alone straight into y's planes; with a paired shortcut (its layout sl, cols
 * too), its 1x1 product of the phase plane that holds x[2i][2j], the same way. Bitwise
 * run_images' outputs: the same pairs in the planes, the same sums. xw (NULL: none; an even
 * number of channels): x's bf16 words in place of src, paired into the same planes
 * (words_planes) rather than rounded from fp32 (cf_conv_bf16_forward_from_kept). */
static void forward_cols(const layout *l, const cf_conv_geom *g, const float *packed,
                         const float *src, int n_images, float *dst, float *scratch,
                         const cf_conv_shortcut *sc, const layout *sl, uint16_t *xh,
                         const uint16_t *xw, const cf_conv_epilogue *ep) {
    const cf_bf16_kernels *k = cf_active_kernels->bf16;
    /* the input's pairs: the level's faster conversions where it has them (the same words) */
    const pairs_rows_fn pairs_rows = pairs_rows_of(k);
    const deal_pairs_fn deal_pairs = deal_pairs_of(k);
    const int pairs = l->cp, ohw = g->oh * g->ow;
    const size_t phase_words = (size_t)pairs * l->cplane, image_words = l->phases * phase_words,
                 in_n = (size_t)l->c * g->h * g->w, out_n = (size_t)l->o * ohw;
    uint32_t *xp = (uint32_t *)scratch;
    float *tmp = (float *)(xp + (size_t)l->cnb * image_words);
    const uint32_t *wcols = pack_cols(l, packed);
    int off[MAX_TAPS];
    for (int t = 0; t < l->taps; t++) off[t] = (int)(l->phase[t] * phase_words) + l->shift[t];
    /* the borders stay zero */
    memset(xp, 0, (size_t)(n_images < l->cnb ? n_images : l->cnb) * image_words * sizeof(uint32_t));
    for (int n0 = 0; n0 < n_images; n0 += l->cnb) {
        const int nb = n_images - n0 < l->cnb ? n_images - n0 : l->cnb;
        for (int b = 0; b < nb && xw; b++) /* the words, two channels' rows to a plane */
            words_planes(l, g, xw + (size_t)(n0 + b) * in_n, pairs, xp + (size_t)b * image_words,
                         l->cplane, phase_words);
        for (int b = 0; b < nb && !xw; b++) {
            const float *x = src + (size_t)(n0 + b) * in_n;
            for (int p = 0; p < pairs; p++) {
                const float *lo = x + (size_t)2 * p * g->h * g->w;
                const float *hi = 2 * p + 1 < l->c ? lo + (size_t)g->h * g->w : NULL;
                uint32_t *plane = xp + (size_t)b * image_words + (size_t)p * l->cplane;
                if (l->sub) { /* the even columns of the even rows */
                    deal_pairs(lo, hi, (size_t)2 * g->w, g->oh, 2 * g->ow - 1, plane, NULL,
                               (size_t)l->wq);
                    continue;
                }
                if (l->stride == 1) {
                    pairs_rows(lo, hi, g->h, g->w, plane + (size_t)l->pad * l->wp + l->pad,
                               (size_t)l->wp);
                    continue;
                }
                for (int i0 = 0; i0 < 2 && i0 < g->h; i0++) { /* stride 2: as run_images */
                    const int r = i0 + l->pad;
                    uint32_t *row = plane + (size_t)(r % 2 * 2) * phase_words +
                                    (size_t)(r / 2) * l->wq,
                             *e, *o;
                    DEAL_DEST(l->pad, row, phase_words, e, o);
                    deal_pairs(lo + (size_t)i0 * g->w, hi ? hi + (size_t)i0 * g->w : NULL,
                               (size_t)2 * g->w, (g->h - i0 + 1) / 2, g->w, e, o, (size_t)l->wq);
                }
            }
        }
        /* x's words kept for the backward (xh): the call's images, while they are in cache */
        if (xh)
            (k->keep_words ? k->keep_words : k->from_fp32)(
                src + (size_t)n0 * in_n, xh + (size_t)n0 * in_n, (size_t)nb * in_n);
        /* the next call's images, prefetched while this one computes (x comes at memory speed:
         * 3.2 MB a batch at W1's first stride-2 layer) */
        const int next = n_images - n0 - nb < l->cnb ? n_images - n0 - nb : l->cnb;
        const void *xnext = !next ? NULL
                            : xw  ? (const void *)(xw + (size_t)(n0 + nb) * in_n)
                                  : (const void *)(src + (size_t)(n0 + nb) * in_n);
        k->conv_cols(l->taps, off, pairs, l->o, wcols, xp, l->cplane, (size_t)l->wq, image_words,
                     g->oh, g->ow, nb, dst + (size_t)n0 * out_n, (size_t)ohw, out_n, tmp, xnext,
                     (size_t)next * in_n * (xw ? sizeof(uint16_t) : sizeof(float)));
        if (ep) ep->fn(ep->ctx, false, n0, nb);
        if (sc) {
            const int so = sc->out_channels,
                      soff = (int)(sub_phase(l->pad) * phase_words) + sub_shift(l->pad, l->wq);
            k->conv_cols(1, &soff, pairs, so, pack_cols(sl, sc->w), xp, l->cplane, (size_t)l->wq,
                         image_words, g->oh, g->ow, nb, sc->y + (size_t)n0 * so * ohw, (size_t)ohw,
                         (size_t)so * ohw, tmp, NULL, 0);
            if (ep) ep->fn(ep->ctx, true, n0, nb);
        }
    }
}

/* Whether the forward takes forward_cols at the active level. */
static bool cols_active(const layout *l) {
    const cf_bf16_kernels *k = cf_active_kernels->bf16;
    return l->cols && k && k->conv_cols;
}

/* Stride 1's dx of n images through conv_cols (l->dcols), cnb images per call: dy's pair planes
 * as run_images makes them for dx (op pairs, the image's oh x ow values from (pad, pad) of a
 * padded plane, rows wp apart; cplane words each, image b's from b * image_words), then the
 * images' positions alone straight into dx's planes, with the dx order's columns (its taps
 * reversed and weights transposed: the same offsets as the forward's). Bitwise run_images' dx:
 * the same words in the planes (from dyrows, run_images' layout of them, or rounded from dy), the
 * same sums in conv_run's order; no dropped columns computed and no copy_rows. zeroed: the
 * planes' borders are zero from an earlier call on the same scratch (its first min(n, cnb)
 * images' planes). */
static void dx_cols(const layout *l, const cf_conv_geom *g, const float *packed, const float *dy,
                    int n_images, float *dx, float *scratch, bool zeroed, const uint16_t *dyrows) {
    const cf_bf16_kernels *k = cf_active_kernels->bf16;
    const pairs_rows_fn pairs_rows = pairs_rows_of(k);
    const int pairs = l->op, ohw = g->oh * g->ow;
    const size_t image_words = (size_t)pairs * l->cplane, in_n = (size_t)l->c * g->h * g->w,
                 out_n = (size_t)l->o * ohw, at = (size_t)l->pad * l->wp + l->pad;
    uint32_t *dp = (uint32_t *)scratch;
    float *tmp = (float *)(dp + (size_t)l->cnb * image_words);
    const uint32_t *wcols = pack_dcols(l, packed);
    int off[MAX_TAPS];
    for (int t = 0; t < l->taps; t++) off[t] = l->shift[t];
    if (!zeroed) /* the borders stay zero */
        memset(dp, 0,
               (size_t)(n_images < l->cnb ? n_images : l->cnb) * image_words * sizeof(uint32_t));
    for (int n0 = 0; n0 < n_images; n0 += l->cnb) {
        const int nb = n_images - n0 < l->cnb ? n_images - n0 : l->cnb;
        for (int b = 0; b < nb; b++) {
            uint32_t *planes = dp + (size_t)b * image_words + at;
            /* the weight gradient's rows: oh rows of wp from there, zero in the dropped columns
             * (which land on the pad columns) and in the row past an odd o */
            for (int p = 0; p < pairs && dyrows; p++) {
                const uint16_t *lo = dyrows + (size_t)2 * p * l->dl + (size_t)(n0 + b) * l->s;
                k->halves_rows(lo, lo + l->dl, 0, 1, g->oh * l->wp, planes + (size_t)p * l->cplane,
                               0);
            }
            for (int p = 0; p < pairs && !dyrows; p++) {
                const float *lo = dy + (size_t)(n0 + b) * out_n + (size_t)2 * p * ohw;
                pairs_rows(lo, 2 * p + 1 < l->o ? lo + ohw : NULL, g->oh, g->ow,
                           planes + (size_t)p * l->cplane, (size_t)l->wp);
            }
        }
        /* the next call's dy (when it is read from fp32), prefetched as the tiles compute */
        const int left = n_images - n0 - nb, next = dyrows ? 0 : left < l->cnb ? left : l->cnb;
        const float *dnext = next ? dy + (size_t)(n0 + nb) * out_n : NULL;
        k->conv_cols(l->taps, off, pairs, l->c, wcols, dp, l->cplane, (size_t)l->wp, image_words,
                     g->oh, g->ow, nb, dx + (size_t)n0 * in_n, (size_t)ohw, in_n, tmp, dnext,
                     dnext ? (size_t)next * out_n * sizeof(float) : 0);
    }
}

/* Whether stride 1's dx takes dx_cols at the active level. */
static bool dcols_active(const layout *l) {
    const cf_bf16_kernels *k = cf_active_kernels->bf16;
    return l->dcols && k && k->conv_cols;
}

cf_status cf_conv_bf16_forward(const cf_conv_geom *g, int out_channels, const float *packed,
                               const float *x, int n_images, float *y, float *scratch) {
    layout l;
    layout_make(&l, g, out_channels);
    const cf_status st = pack_check(&l, packed, "cf_conv_bf16_forward");
    if (st != CF_OK) return st;
    if (cols_active(&l)) {
        forward_cols(&l, g, packed, x, n_images, y, scratch, NULL, NULL, NULL, NULL, NULL);
        return CF_OK;
    }
    if (l.compact) {
        run_compact(&l, g, l.c, l.o, (const uint32_t *)packed, x, n_images, y, scratch, NULL);
        return CF_OK;
    }
    run_images(&l, g, l.c, l.o, (const uint32_t *)packed, x, n_images, y, scratch, NULL, false,
               NULL);
    return CF_OK;
}

bool cf_conv_bf16_pair_fits(const cf_conv_geom *g, int out_channels, const cf_conv_geom *sg,
                            int shortcut_out) {
    return cf_conv_bf16_supported(g, out_channels) && !subsampled(g) && g->sh == 2 &&
           subsampled(sg) && sg->c == g->c && sg->h == g->h && sg->w == g->w && sg->oh == g->oh &&
           sg->ow == g->ow && shortcut_out >= 1 &&
           shortcut_out <= (g->c > out_channels ? g->c : out_channels);
}

/* The forward entries' common start: l for the layer, the pack checked, and where a shortcut is
 * given, it checked and sl its layout (shortcut_check made the same geometry); who names the
 * entry in an error. */
static cf_status forward_layouts(const cf_conv_geom *g, int out_channels, const float *packed,
                                 const cf_conv_shortcut *shortcut, const char *who,
                                 const char *who_shortcut, layout *l, layout *sl) {
    layout_make(l, g, out_channels);
    cf_status st = pack_check(l, packed, who);
    if (st == CF_OK && shortcut) st = shortcut_check(g, shortcut, who_shortcut);
    if (st != CF_OK || !shortcut) return st;
    cf_conv_geom sg;
    cf_conv_geom_init(&sg, g->c, g->h, g->w, 1, 1, 2, 2, 0, 0);
    layout_make(sl, &sg, shortcut->out_channels);
    return CF_OK;
}

cf_status cf_conv_bf16_forward_with(const cf_conv_geom *g, int out_channels, const float *packed,
                                    const float *x, int n_images, float *y, float *scratch,
                                    const cf_conv_shortcut *shortcut) {
    if (!shortcut)
        return cf_fail(CF_ERR_INVALID, "cf_conv_bf16_forward_with (shortcut): none given");
    layout l, sl;
    const cf_status st =
        forward_layouts(g, out_channels, packed, shortcut, "cf_conv_bf16_forward_with",
                        "cf_conv_bf16_forward_with (shortcut)", &l, &sl);
    if (st != CF_OK) return st;
    if (cols_active(&l) && sl.cols)
        forward_cols(&l, g, packed, x, n_images, y, scratch, shortcut, &sl, NULL, NULL, NULL);
    else if (l.compact)
        run_compact(&l, g, l.c, l.o, (const uint32_t *)packed, x, n_images, y, scratch, shortcut);
    else
        run_images(&l, g, l.c, l.o, (const uint32_t *)packed, x, n_images, y, scratch, shortcut,
                   false, NULL);
    return CF_OK;
}

bool cf_conv_bf16_keeps_input(const cf_conv_geom *g, int out_channels) {
    layout l;
    layout_make(&l, g, out_channels);
    return !l.compact && !l.sub;
}

cf_status cf_conv_bf16_forward_keep(const cf_conv_geom *g, int out_channels, const float *packed,
                                    const float *x, int n_images, float *y, float *scratch,
                                    const cf_conv_shortcut *shortcut, uint16_t *x_kept) {
    layout l, sl;
    const cf_status st =
        forward_layouts(g, out_channels, packed, shortcut, "cf_conv_bf16_forward_keep",
                        "cf_conv_bf16_forward_keep (shortcut)", &l, &sl);
    if (st != CF_OK) return st;
    const size_t in_n = (size_t)l.c * g->h * g->w;
    if (cols_active(&l) && (!shortcut || sl.cols)) { /* each call's images while in cache */
        forward_cols(&l, g, packed, x, n_images, y, scratch, shortcut, shortcut ? &sl : NULL,
                     x_kept, NULL, NULL);
        return CF_OK;
    }
    if (l.compact)
        run_compact(&l, g, l.c, l.o, (const uint32_t *)packed, x, n_images, y, scratch, shortcut);
    else
        run_images(&l, g, l.c, l.o, (const uint32_t *)packed, x, n_images, y, scratch, shortcut,
                   false, NULL);
    /* the other paths (amx's tiles, compact layers) round x again afterwards */
    if (x_kept) cf_fp32_to_bf16(x, x_kept, (size_t)n_images * in_n);
    return CF_OK;
}

/* run_images' forward (and a paired shortcut's) from x's bf16 words (xw, an even number of
 * channels): each image's pair planes from the words (words_planes), then the same conv_run and
 * copy_rows; bitwise run_images on the fp32 values the words were rounded from. */
static void run_images_words(const layout *l, const cf_conv_geom *g, const uint32_t *packed,
                             const uint16_t *xw, int n_images, float *dst, float *scratch,
                             const cf_conv_shortcut *sc) {
    const cf_bf16_kernels *k = cf_active_kernels->bf16;
    const int pairs = l->cp;
    uint32_t *xp = (uint32_t *)scratch;
    const size_t phase_words = (size_t)pairs * l->plane, in_n = (size_t)l->c * g->h * g->w,
                 out_n = (size_t)l->o * g->oh * g->ow;
    float *out = (float *)(xp + l->phases * phase_words);
    int off[MAX_TAPS];
    for (int t = 0; t < l->taps; t++) off[t] = (int)(l->phase[t] * phase_words) + l->shift[t];
    memset(xp, 0, l->phases * phase_words * sizeof(uint32_t)); /* the border stays zero */
    for (int n = 0; n < n_images; n++) {
        words_planes(l, g, xw + (size_t)n * in_n, pairs, xp, l->plane, phase_words);
        image_products(k, l, g, off, pairs, l->o, packed, xp, phase_words, out,
                       dst + (size_t)n * out_n, sc, n);
    }
}

bool cf_conv_bf16_forward_from_kept_fits(const cf_conv_geom *g, int out_channels) {
    if (!cf_conv_bf16_supported(g, out_channels)) return false;
    layout l;
    layout_make(&l, g, out_channels);
    const cf_bf16_kernels *k = cf_active_kernels->bf16;
    /* the backward's weight gradient must copy the words too (kept_active), never read x */
    return !l.compact && !l.sub && l.c % 2 == 0 && k->rows_h && k->deal_h &&
           (l.stride == 1 || k->deal_pairs_h);
}

cf_status cf_conv_bf16_forward_from_kept(const cf_conv_geom *g, int out_channels,
                                         const float *packed, const uint16_t *x_kept, int n_images,
                                         float *y, float *scratch) {
    return cf_conv_bf16_forward_from_kept_with(g, out_channels, packed, x_kept, n_images, y,
                                               scratch, NULL);
}

/* The refusal of a layer that does not run from bf16 words at this level. */
static cf_status words_unfit(const cf_conv_geom *g, int out_channels, const char *fn) {
    return cf_fail(CF_ERR_INVALID,
                   "%s: a %d -> %d channel %dx%d layer of stride %d on %d x %d images does not run "
                   "from bf16 words at this level",
                   fn, g->c, out_channels, g->kh, g->kw, g->sh, g->h, g->w);
}

cf_status cf_conv_bf16_forward_from_kept_with(const cf_conv_geom *g, int out_channels,
                                              const float *packed, const uint16_t *x_kept,
                                              int n_images, float *y, float *scratch,
                                              const cf_conv_shortcut *shortcut) {
    if (!cf_conv_bf16_forward_from_kept_fits(g, out_channels))
        return words_unfit(g, out_channels, "cf_conv_bf16_forward_from_kept");
    layout l, sl;
    const cf_status st =
        forward_layouts(g, out_channels, packed, shortcut, "cf_conv_bf16_forward_from_kept",
                        "cf_conv_bf16_forward_from_kept (shortcut)", &l, &sl);
    if (st != CF_OK) return st;
    if (cols_active(&l) && (!shortcut || sl.cols))
        forward_cols(&l, g, packed, NULL, n_images, y, scratch, shortcut, shortcut ? &sl : NULL,
                     NULL, x_kept, NULL);
    else
        run_images_words(&l, g, (const uint32_t *)packed, x_kept, n_images, y, scratch, shortcut);
    return CF_OK;
}

cf_status cf_conv_bf16_forward_each(const cf_conv_geom *g, int out_channels, const float *packed,
                                    const float *x, const uint16_t *x_words, int n_images, float *y,
                                    float *scratch, const cf_conv_shortcut *shortcut,
                                    uint16_t *x_kept, const cf_conv_epilogue *ep) {
    if (!ep || !ep->fn) ep = NULL;
    if ((x == NULL) == (x_words == NULL) || (x_words && x_kept))
        return cf_fail(CF_ERR_INVALID, "cf_conv_bf16_forward_each: give x or x_words (one of "
                                       "them), and x_kept only with x");
    if (!x_words && !ep)
        return cf_conv_bf16_forward_keep(g, out_channels, packed, x, n_images, y, scratch, shortcut,
                                         x_kept);
    if (x_words && !ep)
        return cf_conv_bf16_forward_from_kept_with(g, out_channels, packed, x_words, n_images, y,
                                                   scratch, shortcut);
    if (x_words && !cf_conv_bf16_forward_from_kept_fits(g, out_channels))
        return words_unfit(g, out_channels, "cf_conv_bf16_forward_each");
    layout l, sl;
    const cf_status st =
        forward_layouts(g, out_channels, packed, shortcut, "cf_conv_bf16_forward_each",
                        "cf_conv_bf16_forward_each (shortcut)", &l, &sl);
    if (st != CF_OK) return st;
    if (cols_active(&l) && (!shortcut || sl.cols)) { /* the epilogue after each conv_cols call */
        forward_cols(&l, g, packed, x, n_images, y, scratch, shortcut, shortcut ? &sl : NULL,
                     x_kept, x_words, ep);
        return CF_OK;
    }
    /* the other paths a few images a call (the calls' own groups of images: the same sums),
     * the epilogue after each */
    const size_t in_n = (size_t)l.c * g->h * g->w, out_n = (size_t)l.o * g->oh * g->ow;
    const size_t so_n = shortcut ? (size_t)shortcut->out_channels * g->oh * g->ow : 0;
    const int step = !x_words && l.compact ? l.bf : 1;
    for (int n0 = 0; n0 < n_images; n0 += step) {
        const int nb = n_images - n0 < step ? n_images - n0 : step;
        cf_conv_shortcut sc;
        if (shortcut) {
            sc = *shortcut;
            sc.y += (size_t)n0 * so_n;
        }
        float *yn = y + (size_t)n0 * out_n;
        if (x_words)
            run_images_words(&l, g, (const uint32_t *)packed, x_words + (size_t)n0 * in_n, nb, yn,
                             scratch, shortcut ? &sc : NULL);
        else if (l.compact)
            run_compact(&l, g, l.c, l.o, (const uint32_t *)packed, x + (size_t)n0 * in_n, nb, yn,
                        scratch, shortcut ? &sc : NULL);
        else
            run_images(&l, g, l.c, l.o, (const uint32_t *)packed, x + (size_t)n0 * in_n, nb, yn,
                       scratch, shortcut ? &sc : NULL, n0 > 0, NULL);
        if (x_kept)
            cf_fp32_to_bf16(x + (size_t)n0 * in_n, x_kept + (size_t)n0 * in_n, (size_t)nb * in_n);
        ep->fn(ep->ctx, false, n0, nb);
        if (shortcut) ep->fn(ep->ctx, true, n0, nb);
    }
    return CF_OK;
}

static atomic_bool dx_spread_on = true; /* cf__conv_bf16_set_dx_spread */
static atomic_ulong spread_calls;       /* cf__conv_bf16_spread_calls */

unsigned long cf__conv_bf16_spread_calls(void) {
    return atomic_load(&spread_calls);
}

void cf__conv_bf16_set_dx_spread(bool on) {
    atomic_store(&dx_spread_on, on);
}

/* Phase ph's values in dx (stride 2): rows r0, r0 + 2, ... (nr of them) at columns c0, c0 + 2,
 * ... (nc), where (r0 + pad) % 2 is the phase's row parity and (c0 + pad) % 2 its column's. */
static void phase_place(const layout *l, const cf_conv_geom *g, int ph, int *r0, int *c0, int *nr,
                        int *nc) {
    *r0 = ((ph / 2 - l->pad) % 2 + 2) % 2;
    *c0 = ((ph % 2 - l->pad) % 2 + 2) % 2;
    *nr = (g->h - *r0 + 1) / 2;
    *nc = (g->w - *c0 + 1) / 2;
}

/* Whether dx_stride2 stores through conv_spread: the level has it, and its reads (whole vectors
 * of 16 from each phase row's first position, up((w + 1) / 2, 16) of them, at each tap) stay
 * inside a pair plane. */
static bool spread_fits(const layout *l, const cf_conv_geom *g) {
    const cf_bf16_kernels *k = cf_active_kernels->bf16;
    if (!k || !k->conv_spread || !atomic_load(&dx_spread_on)) return false;
    for (int ph = 0; ph < 4; ph++) {
        int r0, c0, nr, nc, reach = 0;
        phase_place(l, g, ph, &r0, &c0, &nr, &nc);
        for (int j = 0; j < l->ntap[ph]; j++)
            if (l->doff[ph][j] > reach) reach = l->doff[ph][j];
        if (nr > g->oh || (g->w + 1) / 2 > g->ow ||
            (size_t)l->dbase[ph] + reach + (size_t)(nr - 1) * l->wd +
                    up((size_t)(g->w + 1) / 2, 16) >
                l->planed)
            return false;
    }
    return true;
}

/* Stride 2's dx of n images: per phase (a, b) of the padded input, dxpad[c][2u + a][2v + b] =
 * sum over the taps (ki, kj) of that phase and the output channels o of w[o][c][ki][kj] *
 * dy[o][u - ki / 2][v - kj / 2], a stride-1 correlation of dy (padded by pad on every side)
 * with the phase's taps; the four phases' rows are then interleaved into dx, or each row
 * parity's two phases computed together and stored interleaved straight into dx's rows
 * (conv_spread; a paired shortcut's product added as its phase is stored: the same add). */
static void dx_stride2(const layout *l, const cf_conv_geom *g, const uint32_t *packed,
                       const float *dy, int n_images, float *dx, float *scratch,
                       const cf_conv_shortcut *sc, bool zeroed, const uint16_t *dyrows,
                       const uint16_t *sdyrows) {
    const cf_bf16_kernels *k = cf_active_kernels->bf16;
    const int pairs = l->op, C = l->c, P = l->pad;
    uint32_t *dp = (uint32_t *)scratch;
    float *out = (float *)(dp + (size_t)pairs * l->planed);
    const size_t outw = up((size_t)C, ROWS) * l->nqd, plane = (size_t)g->oh * g->ow,
                 in_n = (size_t)C * g->h * g->w;
    /* a paired shortcut: its dy's pair planes (rows wd apart, from position 0) and its 1x1
     * product, added into the phase rows that hold dx[2i][2j] before they are interleaved */
    const int spairs = sc ? (sc->out_channels + 1) / 2 : 0, szero = 0, sph = sub_phase(P);
    uint32_t *sdp = (uint32_t *)(out + 4 * outw);
    float *sout = (float *)(sdp + (size_t)spairs * l->planed);
    if (!zeroed) { /* the border stays zero */
        memset(dp, 0, (size_t)pairs * l->planed * sizeof(uint32_t));
        if (sc) memset(sdp, 0, (size_t)spairs * l->planed * sizeof(uint32_t));
    }
    const bool spread = spread_fits(l, g);
    if (spread) atomic_fetch_add_explicit(&spread_calls, 1, memory_order_relaxed);
    for (int n = 0; n < n_images; n++) {
        const float *dyn = dyrows ? NULL : dy + (size_t)n * l->o * plane; /* dy NULL: dyrows */
        for (int p = 0; p < pairs && dyrows; p++)
            rows_pairs(dyrows + (size_t)2 * p * l->dl + (size_t)n * l->s, l, g,
                       dp + (size_t)p * l->planed + (size_t)P * l->wd + P);
        for (int p = 0; p < pairs && !dyrows; p++) {
            const float *lo = dyn + (size_t)2 * p * plane,
                        *hi = 2 * p + 1 < l->o ? lo + plane : NULL;
            pairs_rows_of(k)(lo, hi, g->oh, g->ow,
                             dp + (size_t)p * l->planed + (size_t)P * l->wd + P, (size_t)l->wd);
        }
        if (sc) {
            const int so = sc->out_channels;
            const float *dys = sdyrows ? NULL : sc->dy + (size_t)n * so * plane;
            for (int p = 0; p < spairs && sdyrows; p++)
                rows_pairs(sdyrows + (size_t)2 * p * l->dl + (size_t)n * l->s, l, g,
                           sdp + (size_t)p * l->planed);
            for (int p = 0; p < spairs && !sdyrows; p++) {
                const float *lo = dys + (size_t)2 * p * plane,
                            *hi = 2 * p + 1 < so ? lo + plane : NULL;
                pairs_rows_of(k)(lo, hi, g->oh, g->ow, sdp + (size_t)p * l->planed, (size_t)l->wd);
            }
            k->conv_run(1, &szero, spairs, C, shortcut_dx_pack(sc, C), sdp, l->planed, l->nqd, sout,
                        (size_t)l->nqd);
        }
        float *dxn = dx + (size_t)n * in_n;
        if (spread) { /* a row parity's two phases at once, interleaved in registers */
            for (int a = 0; a < 2; a++) {
                int taps[2], offs[2][MAX_TAPS], r0, c0, nr, nc;
                const int *off[2] = {offs[0], offs[1]};
                const uint32_t *pks[2];
                const float *add[2];
                for (int f = 0; f < 2; f++) {
                    const int ph = a * 2 + (P + f) % 2; /* f: dx's even or odd columns */
                    taps[f] = l->ntap[ph];
                    for (int j = 0; j < taps[f]; j++) offs[f][j] = l->dbase[ph] + l->doff[ph][j];
                    pks[f] = packed;
                    for (int q = 0; q < ph; q++) pks[f] += up((size_t)C, ROWS) * l->ntap[q] * pairs;
                    /* dx[2i][2j] is at i * wd + j of its phase, as the product's (i, j) */
                    add[f] = sc && ph == sph ? sout : NULL;
                }
                phase_place(l, g, a * 2, &r0, &c0, &nr, &nc);
                k->conv_spread(taps, off, pks, pairs, C, dp, l->planed, (size_t)l->wd, nr, g->w,
                               add, (size_t)l->nqd, dxn + (size_t)r0 * g->w, (size_t)g->h * g->w,
                               (size_t)2 * g->w);
            }
            continue;
        }
        const uint32_t *pk = packed;
        for (int ph = 0; ph < 4; ph++) {
            k->conv_run(l->ntap[ph], l->doff[ph], pairs, C, pk, dp + l->dbase[ph], l->planed,
                        l->nqd, out + ph * outw, (size_t)l->nqd);
            pk += up((size_t)C, ROWS) * l->ntap[ph] * pairs;
        }
        if (sc) { /* dx[2i][2j] is at i * wd + j of its phase, as the product's (i, j) */
            for (int c = 0; c < C; c++) {
                float *dst = out + sph * outw + (size_t)c * l->nqd;
                const float *src = sout + (size_t)c * l->nqd;
                for (int q = 0; q < l->nqd; q++) dst[q] += src[q];
            }
        }
        for (int c = 0; c < C; c++) {
            if (k->interleave2_rows) { /* as below, both row parities in one pass */
                const float *s0 = out + (P % 2) * 2 * outw + (size_t)c * l->nqd,
                            *s1 = out + ((P + 1) % 2) * 2 * outw + (size_t)c * l->nqd;
                k->interleave2_rows(s0 + (P % 2) * outw, s0 + ((P + 1) % 2) * outw,
                                    s1 + (P % 2) * outw, s1 + ((P + 1) % 2) * outw, (size_t)l->wd,
                                    g->h, g->w, dxn + (size_t)c * g->h * g->w);
                continue;
            }
            /* dx's rows r0, r0 + 2, ... with (r + pad) % 2 = a are the consecutive rows of
             * phases (a, *) from their first positions: the even columns from (a, pad % 2), the
             * odd ones from (a, (pad + 1) % 2) */
            for (int a = 0; a < 2; a++) {
                const int r0 = ((a - P) % 2 + 2) % 2;
                const float *src = out + a * 2 * outw + (size_t)c * l->nqd;
                k->interleave_rows(src + (P % 2) * outw, src + ((P + 1) % 2) * outw, (size_t)l->wd,
                                   (g->h - r0 + 1) / 2, g->w, dxn + ((size_t)c * g->h + r0) * g->w,
                                   (size_t)2 * g->w);
            }
        }
    }
}

static atomic_bool dx2_spread_on = true; /* cf__conv_bf16_set_dx2_spread */

void cf__conv_bf16_set_dx2_spread(bool on) {
    atomic_store(&dx2_spread_on, on);
}

/* Stride 2's dx through conv_cols (l->d2cols), cnb images per call: dy's pair planes as
 * dx_stride2 makes them (planed words each, image b's from b * image_words), then each phase's
 * oh x ow values of dx alone (conv_cols over the phase's taps from its first position dbase[ph],
 * rows wd apart, with the phase's columns of the pack) into dense planes, which interleave2_rows
 * puts into dx's rows; with a paired shortcut (its layout sl, d2cols too), its 1x1 product over
 * its dy's planes (rows wd apart from position 0) the same way, added into the phase that holds
 * dx[2i][2j]. Bitwise dx_stride2's dx: the same words in the planes, each sum conv_run's, the
 * same add; but no dropped positions computed (dx_stride2: 224 for W1's 14 x 14 phases' 196,
 * 64 for the 7 x 7 ones' 49). Where the level has cols_spread, each row parity's two phases
 * (and the shortcut's product) are left in conv_cols' tmp instead and stored interleaved into dx's
 * rows from there (the same sums and add: no dense planes, no interleave pass). zeroed: as
 * dx_stride2's (the slots' borders are zero from an earlier call on the same scratch). */
static void dx2_cols(const layout *l, const cf_conv_geom *g, const float *packed, const float *dy,
                     int n_images, float *dx, float *scratch, const cf_conv_shortcut *sc,
                     const layout *sl, bool zeroed, const uint16_t *dyrows,
                     const uint16_t *sdyrows) {
    const cf_bf16_kernels *k = cf_active_kernels->bf16;
    const int pairs = l->op, C = l->c, P = l->pad, ohw = g->oh * g->ow;
    const int spairs = sc ? (sc->out_channels + 1) / 2 : 0, sph = sub_phase(P), szero = 0;
    const size_t most = (size_t)(l->cp > l->op ? l->cp : l->op), slots = (size_t)l->cnb + 1,
                 image_words = (size_t)pairs * l->planed, simage_words = (size_t)spairs * l->planed,
                 plane = (size_t)ohw, in_n = (size_t)C * g->h * g->w, cplane = (size_t)C * plane,
                 pst = (size_t)l->cnb * cplane; /* a phase's planes */
    uint32_t *dp = (uint32_t *)scratch, *sdp = dp + slots * image_words;
    float *outs = (float *)(sdp + slots * most * l->planed), *sout = outs + 4 * pst,
          *tmp = sout + pst;
    if (!zeroed) { /* the borders stay zero */
        memset(dp, 0, slots * image_words * sizeof(uint32_t));
        if (sc) memset(sdp, 0, slots * simage_words * sizeof(uint32_t));
    }
    /* cols_spread: conv_cols' sums of two phases (and the shortcut's) left in tq, each
     * up(positions, tile) x up(C, 16) floats, in place of the dense planes and conv_cols' tiles */
    const int nv = (C + 15) / 16, np = g->ow < 24 / nv ? g->ow : 24 / nv;
    const size_t tqf = up((size_t)l->cnb * ohw, (size_t)np) * up((size_t)C, 16);
    float *tq[3] = {outs, outs + tqf, outs + 2 * tqf};
    const bool spread = k->cols_spread && atomic_load(&dx2_spread_on) &&
                        (size_t)(tq[2] + tqf - scratch) <= d2_words(l);
    if (spread) atomic_fetch_add_explicit(&spread_calls, 1, memory_order_relaxed);
    for (int n0 = 0; n0 < n_images; n0 += l->cnb) {
        const int nb = n_images - n0 < l->cnb ? n_images - n0 : l->cnb;
        for (int b = 0; b < nb; b++) {
            const int n = n0 + b;
            uint32_t *planes = dp + (size_t)b * image_words + (size_t)P * l->wd + P;
            for (int p = 0; p < pairs && dyrows; p++)
                rows_pairs(dyrows + (size_t)2 * p * l->dl + (size_t)n * l->s, l, g,
                           planes + (size_t)p * l->planed);
            for (int p = 0; p < pairs && !dyrows; p++) {
                const float *lo = dy + (size_t)n * l->o * plane + (size_t)2 * p * plane,
                            *hi = 2 * p + 1 < l->o ? lo + plane : NULL;
                pairs_rows_of(k)(lo, hi, g->oh, g->ow, planes + (size_t)p * l->planed,
                                 (size_t)l->wd);
            }
            uint32_t *splanes = sdp + (size_t)b * simage_words;
            for (int p = 0; p < spairs && sdyrows; p++)
                rows_pairs(sdyrows + (size_t)2 * p * l->dl + (size_t)n * l->s, l, g,
                           splanes + (size_t)p * l->planed);
            for (int p = 0; p < spairs && !sdyrows; p++) {
                const int so = sc->out_channels;
                const float *lo = sc->dy + (size_t)n * so * plane + (size_t)2 * p * plane,
                            *hi = 2 * p + 1 < so ? lo + plane : NULL;
                pairs_rows_of(k)(lo, hi, g->oh, g->ow, splanes + (size_t)p * l->planed,
                                 (size_t)l->wd);
            }
        }
        if (spread) { /* a row parity's two phases left in tq, then into dx's rows */
            if (sc)   /* dx[2i][2j] is at (i, j) of its phase, as the product's (i, j) */
                k->conv_cols(1, &szero, spairs, C, pack_dcols(sl, sc->w), sdp, l->planed,
                             (size_t)l->wd, simage_words, g->oh, g->ow, nb, NULL, 0, 0, tq[2], NULL,
                             0);
            for (int a = 0; a < 2; a++) {
                const float *t[2], *add[2];
                for (int f = 0; f < 2; f++) {
                    const int ph = a * 2 + (P + f) % 2; /* f: dx's even or odd columns */
                    const uint32_t *wc = pack_dcols(l, packed);
                    for (int q = 0; q < ph; q++)
                        wc += (size_t)l->ntap[q] * pairs * up((size_t)C, 16);
                    int off[MAX_TAPS];
                    for (int j = 0; j < l->ntap[ph]; j++) off[j] = l->dbase[ph] + l->doff[ph][j];
                    k->conv_cols(l->ntap[ph], off, pairs, C, wc, dp, l->planed, (size_t)l->wd,
                                 image_words, g->oh, g->ow, nb, NULL, 0, 0, tq[f], NULL, 0);
                    t[f] = tq[f];
                    add[f] = sc && ph == sph ? tq[2] : NULL;
                }
                const int r0 = ((a - P) % 2 + 2) % 2; /* dx's first row of parity a */
                k->cols_spread(t, add, up((size_t)C, 16), C, g->oh, g->w, nb,
                               dx + (size_t)n0 * in_n + (size_t)r0 * g->w, (size_t)g->h * g->w,
                               (size_t)2 * g->w, in_n);
            }
            continue;
        }
        const uint32_t *wc = pack_dcols(l, packed);
        for (int ph = 0; ph < 4; ph++) {
            int off[MAX_TAPS];
            for (int j = 0; j < l->ntap[ph]; j++) off[j] = l->dbase[ph] + l->doff[ph][j];
            k->conv_cols(l->ntap[ph], off, pairs, C, wc, dp, l->planed, (size_t)l->wd, image_words,
                         g->oh, g->ow, nb, outs + ph * pst, plane, cplane, tmp, NULL, 0);
            wc += (size_t)l->ntap[ph] * pairs * up((size_t)C, 16);
        }
        if (sc) { /* dx[2i][2j] is at (i, j) of its phase, as the product's (i, j) */
            k->conv_cols(1, &szero, spairs, C, pack_dcols(sl, sc->w), sdp, l->planed, (size_t)l->wd,
                         simage_words, g->oh, g->ow, nb, sout, plane, cplane, tmp, NULL, 0);
            float *dst = outs + sph * pst;
            for (size_t q = 0; q < (size_t)nb * cplane; q++) dst[q] += sout[q];
        }
        for (int b = 0; b < nb; b++) {
            float *dxn = dx + (size_t)(n0 + b) * in_n;
            for (int c = 0; c < C; c++) {
                const float *s0 = outs + (P % 2) * 2 * pst + (size_t)b * cplane + (size_t)c * plane,
                            *s1 = outs + ((P + 1) % 2) * 2 * pst + (size_t)b * cplane +
                                  (size_t)c * plane;
                k->interleave2_rows(s0 + (P % 2) * pst, s0 + ((P + 1) % 2) * pst,
                                    s1 + (P % 2) * pst, s1 + ((P + 1) % 2) * pst, (size_t)g->ow,
                                    g->h, g->w, dxn + (size_t)c * g->h * g->w);
            }
        }
    }
}

static atomic_bool dx2_cols_on = true; /* cf__conv_bf16_set_dx2_cols */

void cf__conv_bf16_set_dx2_cols(bool on) {
    atomic_store(&dx2_cols_on, on);
}

/* Whether stride 2's dx takes dx2_cols at the active level (and with a paired shortcut of layout
 * sl, NULL: none, whether the shortcut's pack holds its columns too). */
static bool d2cols_active(const layout *l, const layout *sl) {
    const cf_bf16_kernels *k = cf_active_kernels->bf16;
    return atomic_load(&dx2_cols_on) && l->d2cols && l->stride == 2 && (!sl || sl->d2cols) && k &&
           k->conv_cols && k->interleave2_rows;
}

/* The 1x1 stride-2 shortcut's layout beside a stride-2 layer's input. */
static void shortcut_layout(const cf_conv_geom *g, int out_channels, layout *sl) {
    cf_conv_geom sg;
    cf_conv_geom_init(&sg, g->c, g->h, g->w, 1, 1, 2, 2, 0, 0);
    layout_make(sl, &sg, out_channels);
}

/* A subsampled layer's dx (or dx += it, add): the 1x1 product of dy into out, then dx[c][2i][2j]
 * = out[c][i][j] and zero (or unchanged) elsewhere. dy's pairs from the weight gradient's bf16
 * rows of the same images (dyrows, wgrad's layout: each plane's oh * ow values in one run), when
 * given, rather than rounding dy again (the same roundings). */
static void dx_subsampled(const layout *l, const cf_conv_geom *g, const uint32_t *packed,
                          const float *dy, int n_images, float *dx, float *scratch, bool add,
                          bool zeroed, const uint16_t *dyrows) {
    const cf_bf16_kernels *k = cf_active_kernels->bf16;
    const int pairs = l->op, C = l->c, off0 = 0;
    uint32_t *dp = (uint32_t *)scratch;
    float *out = (float *)(dp + (size_t)pairs * l->plane);
    const size_t plane = (size_t)g->oh * g->ow, in_n = (size_t)C * g->h * g->w;
    if (!zeroed) /* positions past oh x ow */
        memset(dp, 0, (size_t)pairs * l->plane * sizeof(uint32_t));
    for (int n = 0; n < n_images; n++) {
        const float *dyn = dyrows ? NULL : dy + (size_t)n * l->o * plane; /* dy NULL: dyrows */
        for (int p = 0; p < pairs && dyrows; p++) { /* the rows past the channels are zero */
            const uint16_t *lo = dyrows + (size_t)2 * p * l->dl + (size_t)n * l->s;
            k->halves_rows(lo, lo + l->dl, 0, 1, (int)plane, dp + (size_t)p * l->plane, 0);
        }
        for (int p = 0; p < pairs && !dyrows; p++) {
            const float *lo = dyn + (size_t)2 * p * plane,
                        *hi = 2 * p + 1 < l->o ? lo + plane : NULL;
            pairs_rows_of(k)(lo, hi, g->oh, g->ow, dp + (size_t)p * l->plane, (size_t)g->ow);
        }
        k->conv_run(1, &off0, pairs, C, packed, dp, l->plane, l->nq, out, (size_t)l->nq);
        float *dxn = dx + (size_t)n * in_n;
        for (int c = 0; c < C; c++)
            for (int r = 0; r < g->h; r++) {
                float *row = dxn + ((size_t)c * g->h + r) * g->w;
                const float *src = out + (size_t)c * l->nq + (size_t)(r / 2) * g->ow;
                if (add) {
                    if (r % 2 == 0) k->add_even(src, g->ow, row);
                } else if (r % 2)
                    memset(row, 0, (size_t)g->w * sizeof(float));
                else
                    k->interleave(src, NULL, g->w, row);
            }
    }
}

bool cf_conv_bf16_dx_add(const cf_conv_geom *g, int out_channels, const float *packed,
                         const float *dy, int n_images, float *dx, float *scratch) {
    if (!subsampled(g)) return false;
    layout l;
    layout_make(&l, g, out_channels);
    if (pack_check(&l, packed, "cf_conv_bf16_dx_add") != CF_OK) return false;
    const uint32_t *pdx = (const uint32_t *)packed + up((size_t)l.o, ROWS) * l.taps * l.cp;
    dx_subsampled(&l, g, pdx, dy, n_images, dx, scratch, true, false, NULL);
    return true;
}

cf_status cf_conv_bf16_dx(const cf_conv_geom *g, int out_channels, const float *packed,
                          const float *dy, int n_images, float *dx, float *scratch) {
    layout l;
    layout_make(&l, g, out_channels);
    const cf_status st = pack_check(&l, packed, "cf_conv_bf16_dx");
    if (st != CF_OK) return st;
    const uint32_t *pdx = (const uint32_t *)packed + up((size_t)l.o, ROWS) * l.taps * l.cp;
    if (l.sub)
        dx_subsampled(&l, g, pdx, dy, n_images, dx, scratch, false, false, NULL);
    else if (l.stride == 2 && l.compact)
        dx_compact2(&l, g, pdx, dy, n_images, dx, scratch, NULL);
    else if (l.stride == 2 && d2cols_active(&l, NULL))
        dx2_cols(&l, g, packed, dy, n_images, dx, scratch, NULL, NULL, false, NULL, NULL);
    else if (l.stride == 2)
        dx_stride2(&l, g, pdx, dy, n_images, dx, scratch, NULL, false, NULL, NULL);
    else if (l.compact)
        run_compact(&l, g, l.o, l.c, pdx, dy, n_images, dx, scratch, NULL);
    else if (dcols_active(&l))
        dx_cols(&l, g, packed, dy, n_images, dx, scratch, false, NULL);
    else
        run_images(&l, g, l.o, l.c, pdx, dy, n_images, dx, scratch, NULL, false, NULL);
    return CF_OK;
}

cf_status cf_conv_bf16_dx_with(const cf_conv_geom *g, int out_channels, const float *packed,
                               const float *dy, int n_images, float *dx, float *scratch,
                               const cf_conv_shortcut *shortcut) {
    layout l;
    layout_make(&l, g, out_channels);
    cf_status st = pack_check(&l, packed, "cf_conv_bf16_dx_with");
    if (st == CF_OK) st = shortcut_check(g, shortcut, "cf_conv_bf16_dx_with (shortcut)");
    if (st != CF_OK) return st;
    const uint32_t *pdx = (const uint32_t *)packed + up((size_t)l.o, ROWS) * l.taps * l.cp;
    layout sl;
    shortcut_layout(g, shortcut->out_channels, &sl);
    if (l.compact)
        dx_compact2(&l, g, pdx, dy, n_images, dx, scratch, shortcut);
    else if (d2cols_active(&l, &sl))
        dx2_cols(&l, g, packed, dy, n_images, dx, scratch, shortcut, &sl, false, NULL, NULL);
    else
        dx_stride2(&l, g, pdx, dy, n_images, dx, scratch, shortcut, false, NULL, NULL);
    return CF_OK;
}

static void wgrad(const layout *l, const cf_conv_geom *g, const float *dy, const float *x,
                  const uint16_t *xh, int n_images, float *dw, float *scratch,
                  const cf_conv_shortcut *sc, bool accumulate, bool zeroed, const uint16_t *dyh,
                  const uint16_t *sdyh, bool next_follows);

void cf_conv_bf16_wgrad(const cf_conv_geom *g, int out_channels, const float *dy, const float *x,
                        int n_images, float *dw, float *scratch) {
    layout l;
    layout_make(&l, g, out_channels);
    if (l.compact)
        wgrad_compact(&l, g, dy, x, n_images, dw, scratch, NULL, false);
    else
        wgrad(&l, g, dy, x, NULL, n_images, dw, scratch, NULL, false, false, NULL, NULL, false);
}

void cf_conv_bf16_wgrad_with(const cf_conv_geom *g, int out_channels, const float *dy,
                             const float *x, int n_images, float *dw, float *scratch,
                             const cf_conv_shortcut *shortcut) {
    layout l;
    layout_make(&l, g, out_channels);
    if (l.compact)
        wgrad_compact(&l, g, dy, x, n_images, dw, scratch, shortcut, false);
    else
        wgrad(&l, g, dy, x, NULL, n_images, dw, scratch, shortcut, false, false, NULL, NULL, false);
}

#define MAX_RUNS 64

/* The runs of dW's position pairs (q, the pair of positions 2q and 2q + 1 of an image's s) that
 * hold a value of dy: dy's rows are wq apart, oh rows of ow values, the rest zero (pad rows,
 * dropped columns). Their count; past MAX_RUNS, one run from the first such pair to the last
 * (the pairs between hold zeros too). Stride 1's 14 x 14 planes: 14 runs of 7 of 120 pairs
 * (rows of 16, the dropped columns a whole pair), 7 x 7: one of 32 of 36 (the pad row). */
static int dy_runs(const layout *l, const cf_conv_geom *g, int *run_at, int *run_len) {
    int runs = 0, first = -1, last = -1;
    bool over = false;
    /* row i's values are positions [i wq, i wq + ow): pairs i wq / 2 to (i wq + ow - 1) / 2 */
    for (int i = 0; i < g->oh && g->ow > 0; i++) {
        const int q0 = i * l->wq / 2, q1 = (i * l->wq + g->ow - 1) / 2;
        if (first < 0) first = q0;
        if (runs > 0 && q0 <= last + 1) {
            run_len[runs - 1] = q1 - run_at[runs - 1] + 1;
        } else if (runs < MAX_RUNS) {
            run_at[runs] = q0;
            run_len[runs++] = q1 - q0 + 1;
        } else {
            over = true;
        }
        last = q1;
    }
    if (over || runs == 0) {
        run_at[0] = first < 0 ? 0 : first;
        run_len[0] = first < 0 ? 0 : last - first + 1;
        runs = 1;
    }
    return runs;
}

/* dW's products over a block of nb images: conv_wgrad_runs where the level has it (only the
 * pairs that hold dy), else conv_wgrad over every pair; bitwise the same. */
static void wgrad_block(const layout *l, int taps, const int *half, const unsigned char *odd, int m,
                        int nb, int runs, const int *run_at, const int *run_len,
                        const uint16_t *dyrows, const uint32_t *x0, const uint32_t *x1, float *dw,
                        bool accumulate) {
    const cf_bf16_kernels *k = cf_active_kernels->bf16;
    if (k->conv_wgrad_runs)
        k->conv_wgrad_runs(taps, half, odd, m, l->c, nb, l->s / 2, runs, run_at, run_len,
                           (const uint32_t *)dyrows, l->dl / 2, x0, x1, l->ldb, dw, (size_t)l->c,
                           (size_t)m * l->c, accumulate);
    else
        k->conv_wgrad(taps, half, odd, m, l->c, nb * l->s / 2, (const uint32_t *)dyrows, l->dl / 2,
                      x0, x1, l->ldb, dw, (size_t)l->c, (size_t)m * l->c, accumulate);
}

/* Whether the weight gradient reads the forward's kept bf16 words of x (xh, not NULL) at the
 * active level: it has their row copies, and the layer takes wgrad's rows (not the gathered taps
 * of a compact one, nor the subsampled one's even values). */
static bool kept_active(const layout *l, const uint16_t *xh) {
    const cf_bf16_kernels *k = cf_active_kernels->bf16;
    return xh && !l->compact && !l->sub && k && k->rows_h && k->deal_h;
}

static atomic_bool wgrad_fetch_on = true; /* cf__conv_bf16_set_wgrad_prefetch */
static atomic_bool wgrad_next_on = true;  /* cf__conv_bf16_set_wgrad_fetch_next */
static atomic_ulong wgrad_next_fetches;   /* cf__conv_bf16_wgrad_next_fetches */

void cf__conv_bf16_set_wgrad_prefetch(bool on) {
    atomic_store(&wgrad_fetch_on, on);
}

void cf__conv_bf16_set_wgrad_fetch_next(bool on) {
    atomic_store(&wgrad_next_on, on);
}

unsigned long cf__conv_bf16_wgrad_next_fetches(void) {
    return atomic_load(&wgrad_next_fetches);
}

/* The lines of bytes at p fetched towards the core (to L2: an image's words overflow L1). */
static inline void fetch_lines(const void *p, size_t bytes) {
    const uintptr_t end = (uintptr_t)p + bytes;
    for (uintptr_t a = (uintptr_t)p & ~(uintptr_t)63; a < end; a += 64)
        __builtin_prefetch((const void *)a, 0, 2);
}

/* The weight gradient; with a paired shortcut (stride 2), also the shortcut's, one more tap
 * that reads the phase rows holding x[2i][2j], its dy laid out as this layer's. xh (NULL: none):
 * x's bf16 words (image n's at n * in_n, as cf_fp32_to_bf16 of x), copied into the rows instead
 * of rounding x again: the same words, half the bytes read (x has left the caches since the
 * forward; the fp32 reads waited on memory). dyh (NULL: none; then dy is not read and may be
 * NULL): dy's bf16 words (n x o x oh x ow, as cf_fp32_to_bf16 of dy), copied into dy's rows
 * (rows_h, which the caller checked the level has) instead of rounding dy; sdyh (NULL: none)
 * the same of the paired shortcut's dy (sc->dy is then not read). next_follows: the words of a
 * next image follow the call's last in xh, dyh and sdyh (the backward's next block), so that the
 * last image's copy may fetch them. */
static void wgrad(const layout *lay, const cf_conv_geom *g, const float *dy, const float *x,
                  const uint16_t *xh, int n_images, float *dw, float *scratch,
                  const cf_conv_shortcut *sc, bool accumulate, bool zeroed, const uint16_t *dyh,
                  const uint16_t *sdyh, bool next_follows) {
    const layout l = *lay;
    const cf_bf16_kernels *k = cf_active_kernels->bf16;
    if (!kept_active(&l, xh)) xh = NULL;
    uint16_t *xb = (uint16_t *)scratch; /* C rows of lx: the padded images end to end */
    uint32_t *x0 = (uint32_t *)(xb + (size_t)l.c * l.lx), *x1 = x0 + (size_t)l.rows * l.ldb;
    uint16_t *dyb = (uint16_t *)(x1 + (size_t)l.rows * l.ldb);
    uint16_t *dys = dyb + up((size_t)l.o, ROWS) * l.dl; /* the shortcut's dy rows */
    const size_t plane = (size_t)g->h * g->w, in_n = (size_t)l.c * plane,
                 out_n = (size_t)l.o * g->oh * g->ow,
                 sout_n = sc ? (size_t)sc->out_channels * g->oh * g->ow : 0;
    const int soff = sc ? (int)(sub_phase(l.pad) * l.lp) + sub_shift(l.pad, l.wq) : 0,
              shalf = soff / 2;
    const unsigned char sodd = (unsigned char)(soff & 1);
    int run_at[MAX_RUNS], run_len[MAX_RUNS];
    const int runs = dy_runs(&l, g, run_at, run_len);
    /* rows and deal, or their short-row forms where the level has them (bitwise the same) */
    const rows_fn rows = rows_of(k);
    void (*const deal)(const float *, size_t, int, int, uint16_t *, uint16_t *, size_t) =
        k->deal_short ? k->deal_short : k->deal;
    /* zero once: borders, dropped columns, channels past C and rows past O stay zero */
    if (!zeroed)
        memset(scratch, 0, (sc ? wgrad_words_paired(&l) : wgrad_words(&l)) * sizeof(uint32_t));
    /* the words were written long before (the forward's, a BatchNorm's) and are read from L3 or
     * memory: each plane's next image is fetched while this image's is copied */
    const bool fetch = atomic_load(&wgrad_fetch_on);
    for (int n0 = 0; n0 < n_images; n0 += l.block) {
        const int nb = n_images - n0 < l.block ? n_images - n0 : l.block;
        if (nb < l.block) /* images past the batch: no x for the taps to read (no dy is read) */
            memset(xb, 0, (size_t)l.c * l.lx * sizeof(uint16_t));
        for (int b = 0; b < nb; b++) {
            const float *xn = x + (size_t)(n0 + b) * in_n,
                        *dyn = dyh ? NULL : dy + (size_t)(n0 + b) * out_n;
            const uint16_t *dhn = dyh ? dyh + (size_t)(n0 + b) * out_n : NULL;
            /* the last image's copy fetches the next call's first image (next_follows): the
             * caller's dx of these images runs before that one is copied */
            const bool ahead =
                fetch && (n0 + b + 1 < n_images || (next_follows && atomic_load(&wgrad_next_on)));
            if (ahead && n0 + b + 1 == n_images && (xh || dhn || sdyh))
                atomic_fetch_add_explicit(&wgrad_next_fetches, 1, memory_order_relaxed);
            for (int c = 0; c < l.c && xh; c++) { /* the kept words (not sub: kept_active) */
                uint16_t *row = xb + (size_t)c * l.lx + (size_t)b * l.s;
                const uint16_t *src = xh + (size_t)(n0 + b) * in_n + c * plane;
                if (ahead) fetch_lines(src + in_n, plane * sizeof(uint16_t));
                if (l.stride == 1) {
                    k->rows_h(src, g->h, g->w, row + (size_t)l.pad * l.wp + l.pad, (size_t)l.wp);
                    continue;
                }
                if (k->deal2_h) { /* both row parities in one pass over the plane */
                    uint16_t *d[2][2];
                    for (int i0 = 0; i0 < 2; i0++) {
                        const int r = i0 + l.pad;
                        uint16_t *prow = row + (size_t)(r % 2 * 2) * l.lp + (size_t)(r / 2) * l.wq;
                        DEAL_DEST(l.pad, prow, l.lp, d[i0][0], d[i0][1]);
                    }
                    k->deal2_h(src, g->h, g->w, d[0][0], d[0][1], d[1][0], d[1][1], (size_t)l.wq);
                    continue;
                }
                for (int i0 = 0; i0 < 2 && i0 < g->h; i0++) { /* as below */
                    const int r = i0 + l.pad;
                    uint16_t *prow = row + (size_t)(r % 2 * 2) * l.lp + (size_t)(r / 2) * l.wq, *e,
                             *od;
                    DEAL_DEST(l.pad, prow, l.lp, e, od);
                    k->deal_h(src + (size_t)i0 * g->w, (size_t)2 * g->w, (g->h - i0 + 1) / 2, g->w,
                              e, od, (size_t)l.wq);
                }
            }
            for (int c = 0; c < l.c && !xh; c++) {
                uint16_t *row = xb + (size_t)c * l.lx + (size_t)b * l.s;
                const float *src = xn + c * plane;
                if (l.sub && k->even_rows) { /* the even columns of the even rows */
                    k->even_rows(src, (size_t)2 * g->w, g->oh, g->ow, row, (size_t)l.wq);
                    continue;
                }
                if (l.sub) {
                    k->deal(src, (size_t)2 * g->w, g->oh, 2 * g->ow - 1, row, NULL, (size_t)l.wq);
                    continue;
                }
                if (l.stride == 1) {
                    rows(src, g->h, g->w, row + (size_t)l.pad * l.wp + l.pad, (size_t)l.wp);
                    continue;
                }
                for (int i0 = 0; i0 < 2 && i0 < g->h; i0++) { /* stride 2: to the phase rows */
                    const int r = i0 + l.pad;
                    uint16_t *prow = row + (size_t)(r % 2 * 2) * l.lp + (size_t)(r / 2) * l.wq, *e,
                             *od;
                    DEAL_DEST(l.pad, prow, l.lp, e, od);
                    deal(src + (size_t)i0 * g->w, (size_t)2 * g->w, (g->h - i0 + 1) / 2, g->w, e,
                         od, (size_t)l.wq);
                }
            }
            for (int o = 0; o < l.o && dhn && ahead; o++)
                fetch_lines(dhn + out_n + (size_t)o * g->oh * g->ow,
                            (size_t)g->oh * g->ow * sizeof(uint16_t));
            for (int o = 0; o < l.o && dhn && l.sub; o++) /* dy's words: the same places */
                memcpy(dyb + (size_t)o * l.dl + (size_t)b * l.s, dhn + (size_t)o * g->oh * g->ow,
                       (size_t)g->oh * g->ow * sizeof(uint16_t));
            for (int o = 0; o < l.o && dhn && !l.sub; o++)
                k->rows_h(dhn + (size_t)o * g->oh * g->ow, g->oh, g->ow,
                          dyb + (size_t)o * l.dl + (size_t)b * l.s, (size_t)l.wq);
            /* rows of ow = wq: the plane in one run */
            for (int o = 0; o < l.o && !dhn && l.sub; o++)
                k->from_fp32(dyn + (size_t)o * g->oh * g->ow,
                             dyb + (size_t)o * l.dl + (size_t)b * l.s, (size_t)g->oh * g->ow);
            for (int o = 0; o < l.o && !dhn && !l.sub; o++)
                rows(dyn + (size_t)o * g->oh * g->ow, g->oh, g->ow,
                     dyb + (size_t)o * l.dl + (size_t)b * l.s, (size_t)l.wq);
            for (int o = 0; sc && o < sc->out_channels && sdyh && ahead; o++)
                fetch_lines(sdyh + (size_t)(n0 + b + 1) * sout_n + (size_t)o * g->oh * g->ow,
                            (size_t)g->oh * g->ow * sizeof(uint16_t));
            for (int o = 0; sc && o < sc->out_channels && sdyh; o++)
                k->rows_h(sdyh + (size_t)(n0 + b) * sout_n + (size_t)o * g->oh * g->ow, g->oh,
                          g->ow, dys + (size_t)o * l.dl + (size_t)b * l.s, (size_t)l.wq);
            for (int o = 0; sc && o < sc->out_channels && !sdyh; o++)
                rows(sc->dy + (size_t)(n0 + b) * sout_n + (size_t)o * g->oh * g->ow, g->oh, g->ow,
                     dys + (size_t)o * l.dl + (size_t)b * l.s, (size_t)l.wq);
        }
        /* X0: the rows' position pairs transposed; X1: the same one position on */
        k->position_pairs(xb, l.lx, l.c, l.rows, x0, x1, l.ldb);
        wgrad_block(&l, l.taps, l.half, l.odd, l.o, nb, runs, run_at, run_len, dyb, x0, x1, dw,
                    accumulate || n0 > 0);
        if (sc)
            wgrad_block(&l, 1, &shalf, &sodd, sc->out_channels, nb, runs, run_at, run_len, dys, x0,
                        x1, sc->dw, accumulate || n0 > 0);
    }
}

/* dyh (NULL: none): dy as bf16 words (cf_conv_bf16_backward_words; then dy is NULL and never
 * read: dw is given and the layer takes dy words, dy_words_fit); sdyh (NULL: none) the paired
 * shortcut's, with dw_shortcut and, with dx, dx_shortcut of the same dy (dx's shortcut pairs
 * then come from the weight gradient's rows). */
static cf_status backward(const cf_conv_geom *g, int out_channels, const float *packed,
                          const float *dy, const float *x, const uint16_t *xh, int n_images,
                          float *dw, float *dx, float *scratch, const cf_conv_shortcut *dw_shortcut,
                          const cf_conv_shortcut *dx_shortcut, const char *call,
                          const uint16_t *dyh, const uint16_t *sdyh) {
    layout l;
    layout_make(&l, g, out_channels);
    if (dx) { /* the weight gradient does not read the pack */
        cf_status st = pack_check(&l, packed, call);
        if (st == CF_OK && dx_shortcut)
            st = shortcut_check(g, dx_shortcut, "cf_conv_bf16_backward (shortcut)");
        if (st != CF_OK) return st;
    }
    const uint32_t *pdx = (const uint32_t *)packed + up((size_t)l.o, ROWS) * l.taps * l.cp;
    float *wscratch = scratch + up(run_words(&l), 16);
    layout sl; /* a paired shortcut's, for its dx */
    if (dx && dx_shortcut) shortcut_layout(g, dx_shortcut->out_channels, &sl);
    const size_t in_n = (size_t)l.c * g->h * g->w, out_n = (size_t)l.o * g->oh * g->ow,
                 plane = (size_t)g->oh * g->ow;
    if (l.compact) { /* small planes: the weight gradient, then dx (a batch's dy fits in cache) */
        if (dw) wgrad_compact(&l, g, dy, x, n_images, dw, wscratch, dw_shortcut, false);
        if (dx && l.stride == 2)
            dx_compact2(&l, g, pdx, dy, n_images, dx, scratch, dx_shortcut);
        else if (dx)
            run_compact(&l, g, l.o, l.c, pdx, dy, n_images, dx, scratch, NULL);
        return CF_OK;
    }
    /* a block of the weight gradient at a time, then the same images' dx, while their dy is
     * still in cache; every part's zero borders written once */
    for (int n0 = 0; n0 < n_images; n0 += l.block) {
        const int nb = n_images - n0 < l.block ? n_images - n0 : l.block;
        const float *dyn = dyh ? NULL : dy + (size_t)n0 * out_n;
        if (dw) {
            cf_conv_shortcut sc = dw_shortcut ? *dw_shortcut : (cf_conv_shortcut){0};
            if (sc.dy) sc.dy += (size_t)n0 * sc.out_channels * plane; /* NULL: sdyh */
            wgrad(&l, g, dyn, x + (size_t)n0 * in_n, xh ? xh + (size_t)n0 * in_n : NULL, nb, dw,
                  wscratch, dw_shortcut ? &sc : NULL, n0 > 0, n0 > 0,
                  dyh ? dyh + (size_t)n0 * out_n : NULL,
                  sdyh ? sdyh + (size_t)n0 * sc.out_channels * plane : NULL, n0 + nb < n_images);
        }
        if (!dx) continue;
        float *dxn = dx + (size_t)n0 * in_n;
        if (l.sub)
            dx_subsampled(&l, g, pdx, dyn, nb, dxn, scratch, false, n0 > 0,
                          dw ? wgrad_dy_rows(&l, wscratch) : NULL);
        else if (l.stride == 2) {
            cf_conv_shortcut sc = dx_shortcut ? *dx_shortcut : (cf_conv_shortcut){0};
            if (sc.dy) sc.dy += (size_t)n0 * sc.out_channels * plane;
            /* dy's pairs (and the shortcut's, when the weight gradient took the same dy) from
             * the weight gradient's bf16 rows of them, when it ran */
            const uint16_t *rows = dw ? wgrad_dy_rows(&l, wscratch) : NULL;
            const bool srows = rows && dx_shortcut && dw_shortcut &&
                               dw_shortcut->dy == dx_shortcut->dy &&
                               dw_shortcut->out_channels == dx_shortcut->out_channels;
            const uint16_t *sdrows = srows ? rows + up((size_t)l.o, ROWS) * l.dl : NULL;
            if (d2cols_active(&l, dx_shortcut ? &sl : NULL))
                dx2_cols(&l, g, packed, dyn, nb, dxn, scratch, dx_shortcut ? &sc : NULL, &sl,
                         n0 > 0, rows, sdrows);
            else
                dx_stride2(&l, g, pdx, dyn, nb, dxn, scratch, dx_shortcut ? &sc : NULL, n0 > 0,
                           rows, sdrows);
        } else if (dcols_active(&l)) /* stride 1, the same rows of dy, over dx's positions */
            dx_cols(&l, g, packed, dyn, nb, dxn, scratch, n0 > 0,
                    dw ? wgrad_dy_rows(&l, wscratch) : NULL);
        else /* stride 1: dy's pairs from the weight gradient's rows of it, when it ran */
            run_images(&l, g, l.o, l.c, pdx, dyn, nb, dxn, scratch, NULL, n0 > 0,
                       dw ? wgrad_dy_rows(&l, wscratch) : NULL);
    }
    return CF_OK;
}

cf_status cf_conv_bf16_backward(const cf_conv_geom *g, int out_channels, const float *packed,
                                const float *dy, const float *x, int n_images, float *dw, float *dx,
                                float *scratch, const cf_conv_shortcut *dw_shortcut,
                                const cf_conv_shortcut *dx_shortcut) {
    return backward(g, out_channels, packed, dy, x, NULL, n_images, dw, dx, scratch, dw_shortcut,
                    dx_shortcut, "cf_conv_bf16_backward", NULL, NULL);
}

cf_status cf_conv_bf16_backward_kept(const cf_conv_geom *g, int out_channels, const float *packed,
                                     const float *dy, const float *x, const uint16_t *x_kept,
                                     int n_images, float *dw, float *dx, float *scratch,
                                     const cf_conv_shortcut *dw_shortcut,
                                     const cf_conv_shortcut *dx_shortcut) {
    return backward(g, out_channels, packed, dy, x, x_kept, n_images, dw, dx, scratch, dw_shortcut,
                    dx_shortcut, "cf_conv_bf16_backward_kept", NULL, NULL);
}

/* Whether the backward takes dy as words at the active level: the rows' copy (rows_h), and the
 * layouts whose dx reads dy only through the weight gradient's rows of it, with no fp32 fallback
 * left (not the compact small planes, which gather dy from fp32; stride 1's dx over conv_cols or
 * stride 2's or the subsampled one's, not run_images, which also makes the forward's pairs). */
static bool dy_words_fit(const layout *l) {
    const cf_bf16_kernels *k = cf_active_kernels->bf16;
    return k && k->rows_h && !l->compact && (l->sub || l->stride == 2 || dcols_active(l));
}

bool cf_conv_bf16_takes_dy_words(const cf_conv_geom *g, int out_channels) {
    if (!cf_conv_bf16_supported(g, out_channels)) return false;
    layout l;
    layout_make(&l, g, out_channels);
    return dy_words_fit(&l);
}

cf_status cf_conv_bf16_backward_words(const cf_conv_geom *g, int out_channels, const float *packed,
                                      const float *dy, const uint16_t *dy_words, const float *x,
                                      const uint16_t *x_kept, int n_images, float *dw, float *dx,
                                      float *scratch, const cf_conv_shortcut *dw_shortcut,
                                      const cf_conv_shortcut *dx_shortcut,
                                      const uint16_t *shortcut_dy_words) {
    const char *bad =
        !dy && !dy_words ? "no dy given (fp32 or words)"
        : !dw            ? "the weight gradient is required (dx is made from its rows of dy)"
        : !cf_conv_bf16_takes_dy_words(g, out_channels)
            ? "this layer does not take dy as words here (cf_conv_bf16_takes_dy_words)"
        : shortcut_dy_words && !dw_shortcut
            ? "the shortcut's dy words need its weight gradient (dw_shortcut)"
        : shortcut_dy_words && dx && dx_shortcut &&
                (dx_shortcut->dy != dw_shortcut->dy ||
                 dx_shortcut->out_channels != dw_shortcut->out_channels)
            ? "the shortcut's dy words need dx_shortcut to be dw_shortcut's output gradient"
            : NULL;
    if (bad)
        return cf_fail(CF_ERR_INVALID,
                       "cf_conv_bf16_backward_words: %s (a %dx%d stride-%d layer of %d -> %d "
                       "channels on %dx%d at level %s)",
                       bad, g->kh, g->kw, g->sh, g->c, out_channels, g->h, g->w,
                       cf_isa_name(cf_active_kernels->isa));
    return backward(g, out_channels, packed, dy_words ? NULL : dy, x, x_kept, n_images, dw, dx,
                    scratch, dw_shortcut, dx_shortcut, "cf_conv_bf16_backward_words", dy_words,
                    shortcut_dy_words);
}
