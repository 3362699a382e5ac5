/* Fusion, decided once when a model is planned (nn_internal.h): which BatchNorm runs its ReLU,
 * and which fused calls each residual block makes. Only layers whose ops are their own (not a
 * wrapper's: timers, hooks) are fused; a container whose ops are wrapped is left as it is. */
#include "corefit/nn.h"
#include "nn_internal.h"

/* The module a path starts with, and the one it ends with: its first (last) child when it is a
 * Sequential, else the path itself. */
static cf_module *path_first(cf_module *path) {
    return cf_nn_is_sequential(path) && path->n_children ? path->children[0] : path;
}

static cf_module *path_last(cf_module *path) {
    return cf_nn_is_sequential(path) && path->n_children ? path->children[path->n_children - 1]
                                                         : path;
}

/* The forward link (nn_internal.h): each BatchNorm child whose output goes straight to a Conv2d
 * child, either right after it or through the ReLU it was just fused with (which passes it
 * through), writes that convolution's bf16 input words where the call allows. Only within one
 * Sequential, whose forward runs the three in order (a residual block's ranges of its paths
 * never start or end between them: the pair's range starts after the first convolution, the
 * fold's ends before the last BatchNorm), and only a stride-1 convolution (the words path's
 * only stride): no size changes after it, where a U-Net takes the output before as a skip. */
static void link_words(cf_module *m, bool through_blocks) {
    for (int i = 0; i + 1 < m->n_children; i++) {
        cf_module *bn = m->children[i], *next = m->children[i + 1];
        if (!cf_nn_is_batchnorm(bn)) continue;
        if (cf_nn_is_relu(next) && cf_nn_bn_fused_with(bn, next))
            next = i + 2 < m->n_children ? m->children[i + 2] : NULL;
        if (cf_nn_is_conv(next)) cf_nn_bn_feed_conv(bn, next);
        /* a residual block whose convpath's first conv computes its idpath's first (the pair,
         * as fuse_residual makes it): that conv, which takes the words only where the block pairs
         * the two at that call (a stride-2 layer: the block is the size change). Only where
         * the Sequential's own forward (or a block's) runs the children: a U-Net runs its
         * encoder's children itself and keeps the output before each size change as a skip */
        if (through_blocks && cf_nn_is_residual(next) && next->n_children == 2) {
            cf_module *first_a = path_first(next->children[0]),
                      *first_b = path_first(next->children[1]);
            if (cf_nn_is_conv(first_a) && cf_nn_is_conv(first_b)) {
                cf_nn_bn_feed_conv(bn, first_a);
                cf_nn_conv_words_pair(first_a, first_b, next);
            }
        }
    }
}

/* Links each BatchNorm child to a ReLU child right after it. Every link from an earlier plan is
 * dropped first (a child that is no longer its layer's own keeps what it had: a BatchNorm that
 * still writes max(y, 0) before a ReLU of its own is exact). */
static void fuse_sequential(cf_module *m, bool enabled, bool through_blocks) {
    for (int i = 0; i < m->n_children; i++) {
        cf_module *c = m->children[i];
        if (cf_nn_is_batchnorm(c)) {
            cf_nn_bn_fuse_relu(c, NULL);
            cf_nn_bn_feed_conv(c, NULL);
        } else if (cf_nn_is_relu(c))
            cf_nn_relu_follow_bn(c, NULL);
    }
    if (!enabled) return;
    for (int i = 0; i + 1 < m->n_children; i++) {
        cf_module *bn = m->children[i], *relu = m->children[i + 1];
        if (cf_nn_is_batchnorm(bn) && cf_nn_is_relu(relu)) {
            cf_nn_bn_fuse_relu(bn, relu);
            cf_nn_relu_follow_bn(relu, bn);
        }
    }
    link_words(m, through_blocks);
    /* a Conv2d's output gradient written as bf16 words by the BatchNorm after it (unlinked by
     * unlink_dy_words first; an idpath's first conv added into the convpath's alone vetoed by
     * its block, fused before) */
    for (int i = 0; i + 1 < m->n_children; i++) {
        cf_module *conv = m->children[i], *bn = m->children[i + 1];
        /* the statistics link: bn's per-image sums from conv's epilogue */
        if (cf_nn_is_conv(conv) && cf_nn_is_batchnorm(bn)) {
            cf_nn_conv_stats_bn(conv, bn);
            cf_nn_bn_stats_from(bn, conv);
        }
        if (cf_nn_is_conv(conv) && cf_nn_is_batchnorm(bn) && !cf_nn_conv_dy_words_vetoed(conv)) {
            cf_nn_bn_link_conv(bn, conv);
            cf_nn_conv_link_dy_words(conv, true);
        }
    }
}

/* A block with ReLU after the sum whose idpath ends in a BatchNorm has that BatchNorm write the
 * block's output; so does the convpath's last BatchNorm in a block with ReLU after the sum and no
 * idpath (torchvision's BasicBlock without downsample), with the block's input as the other
 * term; a convpath and an idpath that both start with a convolution pair them (the
 * convolution decides at each call whether the pair qualifies); an idpath that starts with a
 * convolution adds its input gradient into the convpath's. */
static void fuse_residual(cf_module *m, bool relu_after, bool enabled) {
    cf_nn_res_fusion f = {0};
    if (enabled && m->n_children == 1) {
        cf_module *cp = m->children[0], *last_a = path_last(cp);
        f.convpath_seq = cf_nn_is_sequential(cp);
        if (relu_after && cf_nn_is_batchnorm(last_a)) f.fold_a = last_a;
    }
    if (enabled && m->n_children == 2) {
        cf_module *cp = m->children[0], *ip = m->children[1];
        cf_module *first_a = path_first(cp), *first_b = path_first(ip), *last_b = path_last(ip);
        f.convpath_seq = cf_nn_is_sequential(cp);
        f.idpath_seq = cf_nn_is_sequential(ip);
        if (relu_after && cf_nn_is_batchnorm(last_b)) f.fold = last_b;
        if (f.fold) cf_nn_bn_fold_addend(f.fold, path_last(cp)); /* a BatchNorm, or none */
        if (cf_nn_is_conv(first_b)) {
            f.add_into = first_b;
            if (cf_nn_is_conv(first_a)) {
                f.pair_a = first_a;
                f.pair_b = first_b;
                cf_nn_conv_dy_words_sibling(first_b, first_a); /* its dy words to the pair */
            } else {
                cf_nn_conv_veto_dy_words(first_b, true); /* dx_add reads its dy in fp32 */
            }
        }
    }
    cf_nn_residual_set_fusion(m, &f);
}

/* The forward link from one residual block's fold to the next block's pair (nn_internal.h,
 * cf_nn_bn_fold_feed_conv): after the blocks' own plans (the idpath's Sequential drops every
 * link of its BatchNorms first), and only where this Sequential runs the two blocks in order. */
static void link_folds(cf_module *m, bool through_blocks) {
    for (int i = 0; through_blocks && i + 1 < m->n_children; i++) {
        cf_module *block = m->children[i], *next = m->children[i + 1];
        cf_module *fold = cf_nn_residual_fold(block);
        if (!fold || !cf_nn_is_residual(next) || next->n_children != 2) continue;
        cf_module *first_a = path_first(next->children[0]),
                  *first_b = path_first(next->children[1]);
        /* only where the block's backward can take the mask bits in place of the output */
        if (cf_nn_is_conv(first_a) && cf_nn_is_conv(first_b) &&
            cf_nn_residual_masks_itself(block)) {
            cf_nn_bn_fold_feed_conv(fold, first_a, block, path_last(block->children[0]));
            cf_nn_conv_words_pair(first_a, first_b, next);
        }
    }
}

/* through_blocks: m's parent (if any) is a Sequential or a residual block, which run m's
 * forward as a whole. */
static void fuse_tree(cf_module *m, bool enabled, bool through_blocks) {
    if (cf_nn_is_sequential(m)) fuse_sequential(m, enabled, through_blocks);
    if (cf_nn_is_residual(m)) fuse_residual(m, cf_nn_residual_relu_after(m), enabled);
    const bool runs_whole = cf_nn_is_sequential(m) || cf_nn_is_residual(m);
    for (int i = 0; i < m->n_children; i++) fuse_tree(m->children[i], enabled, runs_whole);
    if (enabled && cf_nn_is_sequential(m)) link_folds(m, through_blocks);
}

/* Drops every Conv2d -> BatchNorm dy-words link and veto, and every fold's addend, of an
 * earlier plan. */
static void unlink_dy_words(cf_module *m) {
    if (cf_nn_is_batchnorm(m)) {
        cf_nn_bn_feed_conv(m, NULL);
        cf_nn_bn_link_conv(m, NULL);
        cf_nn_bn_fold_addend(m, NULL);
        cf_nn_bn_stats_from(m, NULL);
    }
    if (cf_nn_is_conv(m)) {
        cf_nn_conv_link_dy_words(m, false);
        cf_nn_conv_veto_dy_words(m, false);
        cf_nn_conv_dy_words_sibling(m, NULL);
        cf_nn_conv_words_pair(m, NULL, NULL);
        cf_nn_conv_stats_bn(m, NULL);
    }
    for (int i = 0; i < m->n_children; i++) unlink_dy_words(m->children[i]);
}

void cf_nn_fuse(cf_module *root, bool enabled) {
    if (!root) return;
    unlink_dy_words(root);
    fuse_tree(root, enabled, true);
}
