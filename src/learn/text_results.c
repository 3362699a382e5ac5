/* fastai's show_results and plot_top_losses for a text classifier, as the tables fastai shows
 * for text: each validation text's tokens with its target and prediction (show_results), and
 * the texts the model got most wrong with target, prediction, its probability and the loss
 * (ClassificationInterpretation.plot_top_losses). */
#include "internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Document d's first max_tokens tokens, space separated, padding left out, then "..." when cut;
 * line breaks, tabs and carriage returns as \n, \t and \r. */
static void put_doc(FILE *out, const cf_text_corpus *c, const cf_text_numericalizer *nz, int64_t d,
                    int max_tokens) {
    const int64_t len = c->offsets[d + 1] - c->offsets[d];
    int shown = 0;
    for (int64_t t = 0; t < len && shown < max_tokens; t++) {
        const int32_t id = c->ids[c->offsets[d] + t];
        if (id == CF_TEXT_PAD) continue;
        const char *w = nz->token(nz->ctx, id);
        if (shown++) fputc(' ', out);
        cf_text_put_token(out, w ? w : "?");
    }
    if (len > max_tokens) fprintf(out, " ...");
}

static const char *class_name(const cf_text_corpus *c, int64_t k) {
    return k >= 0 && k < c->n_classes ? c->classes[k] : "?";
}

/* The validation predictions of a single-label text classifier, in document order. */
static cf_status clas_preds(cf_learner *learn, const char *what, cf_preds *p,
                            const cf_text_corpus **c) {
    *c = learn && learn->dls && learn->dls->valid ? cf_text_loader_corpus(learn->dls->valid) : NULL;
    if (!*c || cf_text_loader_is_lm(learn->dls->valid) || !learn->dls->text_nz)
        return cf_fail(CF_ERR_STATE,
                       "%s: a text classifier with validation texts and its numericalizer is "
                       "needed",
                       what);
    if ((*c)->target_dim != 1)
        return cf_fail(CF_ERR_STATE, "%s: single-label classifiers only (%d label columns)", what,
                       (*c)->target_dim);
    return cf_get_preds(learn, p, .with_decoded = true, .with_loss = true);
}

cf_status cf_text_show_results(cf_learner *learn, int max_n, int max_tokens, FILE *out) {
    const char *what = "show_results (text)";
    if (!out) return cf_fail(CF_ERR_INVALID, "%s: no stream", what);
    if (max_n <= 0) max_n = 9;
    if (max_tokens <= 0) max_tokens = 150;
    cf_preds p = {0};
    const cf_text_corpus *c = NULL;
    cf_status st = clas_preds(learn, what, &p, &c);
    if (st) return st;
    const cf_text_numericalizer *nz = learn->dls->text_nz;
    fprintf(out, "%-4s %s\t%s\t%s\n", "", "text", "category", "category_");
    for (int64_t i = 0; i < p.n && i < max_n; i++) {
        fprintf(out, "%-4lld ", (long long)i);
        put_doc(out, c, nz, i, max_tokens);
        fprintf(out, "\t%s\t%s\n", class_name(c, (int64_t)p.targs.data[i]),
                class_name(c, p.decoded[i]));
    }
    cf_preds_free(&p);
    return ferror(out) ? cf_fail(CF_ERR_IO, "%s: write error", what) : CF_OK;
}

static const float *g_losses; /* for the sort below (one sort at a time per process) */
static int by_loss_desc(const void *a, const void *b) {
    const int64_t i = *(const int64_t *)a, j = *(const int64_t *)b;
    if (g_losses[i] != g_losses[j]) return g_losses[i] < g_losses[j] ? 1 : -1;
    return i < j ? -1 : i > j; /* ties: the earlier text first */
}

cf_status cf_text_top_losses(cf_learner *learn, int k, int max_tokens, FILE *out) {
    const char *what = "top_losses (text)";
    if (!out) return cf_fail(CF_ERR_INVALID, "%s: no stream", what);
    if (k <= 0) k = 9;
    if (max_tokens <= 0) max_tokens = 150;
    cf_preds p = {0};
    const cf_text_corpus *c = NULL;
    cf_status st = clas_preds(learn, what, &p, &c);
    if (st) return st;
    int64_t *order = cf_malloc((size_t)(p.n ? p.n : 1) * sizeof *order);
    if (!order) {
        cf_preds_free(&p);
        return cf_fail(CF_ERR_NOMEM, "%s", what);
    }
    for (int64_t i = 0; i < p.n; i++) order[i] = i;
    g_losses = p.losses;
    qsort(order, (size_t)p.n, sizeof *order, by_loss_desc);
    const int n_out = p.preds.shape.dim[1];
    fprintf(out, "%-4s %s\t%s\t%s\t%s\t%s\n", "", "input", "target", "predicted", "probability",
            "loss");
    for (int64_t r = 0; r < p.n && r < k; r++) {
        const int64_t i = order[r];
        fprintf(out, "%-4lld ", (long long)r);
        put_doc(out, c, learn->dls->text_nz, i, max_tokens);
        fprintf(out, "\t%s\t%s\t%.4f\t%.4f\n", class_name(c, (int64_t)p.targs.data[i]),
                class_name(c, p.decoded[i]), p.preds.data[i * n_out + p.decoded[i]], p.losses[i]);
    }
    cf_free(order);
    cf_preds_free(&p);
    return ferror(out) ? cf_fail(CF_ERR_IO, "%s: write error", what) : CF_OK;
}
