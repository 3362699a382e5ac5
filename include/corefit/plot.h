/* corefit/plot.h — PNG figures of a fit: fastai's Recorder plots (plot_loss, plot_sched,
 * plot_lr_find, plot_metrics) and ClassificationInterpretation's confusion matrix and top losses,
 * drawn with PLplot (800x600 by default) and written atomically. They take plain result structs,
 * so data from parallel workers draws too. Without PLplot every plotting call returns
 * CF_ERR_UNSUPPORTED (cf_confusion_from_preds and cf_top_losses always work). See docs/api.md. */
#ifndef COREFIT_PLOT_H
#define COREFIT_PLOT_H

#include "corefit/core.h"
#include "corefit/learn.h"

#ifdef __cplusplus
extern "C" {
#endif

/* True when PNG figures can be written here (PLplot built in and its pngcairo device present). */
bool cf_plot_available(void);

/* The size in pixels of figures drawn from now on (all threads); 0, 0 restores 800x600.
 * Each side must be in [64, 8192]. */
cf_status cf_plot_set_size(int width, int height);

/* fastai's Recorder.plot_loss. A field left at zero takes fastai's default. */
typedef struct cf_plot_loss_opts {
    int skip_start;    /* 5; negative: 0 (plot from the first batch) */
    bool no_valid;     /* fastai's with_valid=False */
    bool log;          /* log-log axes */
    bool show_epochs;  /* dotted vertical lines at the end of each epoch */
    int width, height; /* pixels; 0: the size set by cf_plot_set_size (800x600) */
} cf_plot_loss_opts;

/* fastai's plot_loss: smoothed training loss per batch from skip_start ("train") and the
 * per-epoch valid_loss ("valid"). opts may be NULL. CF_ERR_STATE when nothing is left to plot. */
cf_status cf_plot_loss(const cf_recorder *rec, const char *png_path, const cf_plot_loss_opts *opts);

/* fastai's Recorder.plot_sched: lr and mom per training batch side by side. CF_ERR_STATE when no
 * batch was recorded. */
cf_status cf_plot_sched(const cf_recorder *rec, const char *png_path);

/* fastai's plot_lr_find(skip_end=5): loss against lr (log x) with each computed suggestion
 * marked and named in the legend. CF_ERR_STATE when fewer than 2 points remain. */
cf_status cf_plot_lr_find(const cf_lr_find_result *r, const char *png_path);

/* fastai's plot_metrics: losses, then one subplot per metric, against epoch; NaN (cancelled)
 * leaves gaps. CF_ERR_STATE when no epoch was recorded. */
cf_status cf_plot_metrics(const cf_recorder *rec, const char *png_path);

/* Confusion counts into counts[actual * n_classes + predicted] (overwritten), predicted from
 * p->decoded or the argmax of p->preds. CF_ERR_INVALID for mismatched shapes or targets. */
cf_status cf_confusion_from_preds(const cf_preds *p, int n_classes, int64_t *counts);

/* ClassificationInterpretation.plot_confusion_matrix: a labelled heat map of counts (row shares
 * when normalize); vocab may be NULL. Up to 100 classes. */
cf_status cf_plot_confusion_matrix(const int64_t *counts, int n_classes, char *const *vocab,
                                   const char *png_path, bool normalize);

/* Indices of the k items with the largest per-item loss (p->losses), largest first (ties: lower
 * index first), as ClassificationInterpretation.top_losses. 1 <= k <= p->n. */
cf_status cf_top_losses(const cf_preds *p, int k, int64_t *idx_out);

/* plot_top_losses: the k top-loss input images titled "pred/actual / loss / prob". Needs
 * p->inputs, p->losses and p->preds; vocab may be NULL. 1 <= k <= min(p->n, 64). */
cf_status cf_plot_top_losses(const cf_preds *p, int k, char *const *vocab, const char *png_path);

/* ClassificationInterpretation.most_confused(min_val): off-diagonal cells with count >= min_val,
 * largest first (ties row-major). Writes at most max_out to out (may be NULL with 0); returns how
 * many there are in all, or -1 (error set) for bad arguments. */
typedef struct cf_confused_pair {
    int actual, predicted;
    int64_t count;
} cf_confused_pair;
int64_t cf_most_confused(const int64_t *counts, int n_classes, int64_t min_val,
                         cf_confused_pair *out, int64_t max_out);

/* fastai's show_batch: the first n images of a batch (C 1 or 3, each rescaled to its own range)
 * titled with their class, label set or point. 1 <= n <= min(B, 64). */
cf_status cf_show_batch(const cf_batch *batch, int n, char *const *vocab, const char *png_path);

/* Options of cf_plot_show_batch_text; a field left at zero takes the default. */
typedef struct cf_show_text_opts {
    int max_rows;      /* rows of the batch shown: 9 (fastai's max_n) */
    int max_tokens;    /* tokens of each text: 150 (fastai's trunc_at), then an ellipsis */
    int width, height; /* pixels, each in [64, 8192]; width 0: cf_plot_set_size's width;
                          height 0: as tall as the table */
} cf_show_text_opts;

/* fastai's show_batch for text as a figure: the first max_rows texts (max_tokens tokens) of a
 * batch with their "category" or "text_" column, as fastai's table. dl is the text loader the
 * batch came from, nz dls->text_nz; opts may be NULL. CF_ERR_INVALID for a non-text loader or
 * batch. The terminal twin is cf_text_show_batch. Layout details: docs/api.md. */
cf_status cf_plot_show_batch_text(const cf_dataloader *dl, const cf_batch *b,
                                  const cf_text_numericalizer *nz, const char *png_path,
                                  const cf_show_text_opts *opts);

/* fastai's show_results: the first n items of get_preds(with_input) titled "actual/predicted",
 * green when right and red when wrong (label sets and points too). Needs p->inputs and p->preds;
 * 1 <= n <= min(p->n, 64). */
cf_status cf_show_results(const cf_preds *p, int n, char *const *vocab, const char *png_path);

/* Segmentation (fastai's show for a TensorMask: every pixel's class coloured with matplotlib's
 * tab20 over vmin 0, vmax n_codes, blended at alpha 0.5 over the image). show_batch: the first n
 * images of a batch whose targets are (B, H * W) class ids, in fastai's int(sqrt(n)) rows;
 * 1 <= n <= min(B, 64). show_results: n rows of Target | Prediction from get_preds(with_input)
 * of a U-Net (preds (n, n_codes, H, W) probabilities, decoded by argmax; targs the masks);
 * 1 <= n <= min(p->n, 32). */
cf_status cf_show_batch_masks(const cf_batch *batch, int n, int n_codes, const char *png_path);
cf_status cf_show_results_masks(const cf_preds *p, int n, int n_codes, const char *png_path);

/* The same figures from a learner's recorder (e.g. after a fit, or a parallel fit whose
 * recorder came home). opts may be NULL. */
cf_status cf_learner_plot_loss(const cf_learner *learn, const char *png_path,
                               const cf_plot_loss_opts *opts);
cf_status cf_learner_plot_sched(const cf_learner *learn, const char *png_path);
cf_status cf_learner_plot_metrics(const cf_learner *learn, const char *png_path);

/* ---- figures drawn during a fit, and showing them ------------------------------------------- */

typedef struct cf_show_graph_opts {
    const char *dir;    /* folder of the figures (created if missing); NULL: learn->path */
    const char *prefix; /* file names PREFIX_loss.png and PREFIX_metrics.png; NULL: "show_graph" */
    bool no_metrics;    /* the loss figure only */
} cf_show_graph_opts;

/* fastai's ShowGraphCallback to files (order 65, training fits only, master only): after every
 * epoch redraws the learning curve and, unless no_metrics, the metrics, noting each path on the
 * learner. NULL when out of memory or options are too long; the fit fails at before_fit when
 * figures cannot be written (cf_plot_available). */
cf_callback *cf_show_graph_cb_(const cf_show_graph_opts *opts);
#define cf_show_graph_cb(...) cf_show_graph_cb_(&(cf_show_graph_opts){__VA_ARGS__})

/* lr_find's option to draw its plot where it runs (rank 0 of a parallel call):
 *     cf_lr_find(learn, &r, CF_LR_FIND_PLOT("lr_find.png"));  */
#define CF_LR_FIND_PLOT(png_path) .plot = cf_plot_lr_find, .plot_path = (png_path)

/* Prints each figure's path on `out` (NULL: stdout) and draws it as sixel when the terminal
 * supports it and libsixel is installed (COREFIT_SIXEL=0/1 overrides detection). Returns the
 * number drawn as sixel. */
int cf_show_figures(const char *const *paths, int n, FILE *out);

/* Why cf_show_figures would print only paths on `out` (NULL: stdout): a sentence such as "the
 * output is not a terminal", or NULL when it would draw the figures. */
const char *cf_show_figures_unavailable(FILE *out);
/* The same for the figures noted on a learner (learn->figures), e.g. after a parallel fit. */
int cf_learner_show_figures(const cf_learner *learn, FILE *out);

#ifdef __cplusplus
}
#endif
#endif
