/* corefit/plot.h — PNG figures of a fit: fastai's Recorder plots (plot_loss, plot_sched,
 * plot_lr_find, plot_metrics) and ClassificationInterpretation's confusion matrix and top losses.
 *
 * Figures are drawn with PLplot's pngcairo driver on a white background (800x600 pixels unless
 * set otherwise) and written atomically: to a temporary file in the target's folder, renamed
 * into place once complete, so a reader never sees half a PNG. The functions take the plain
 * result structs (cf_recorder, cf_lr_find_result, cf_preds) so that they also draw data that came
 * home from parallel workers; the cf_learner_plot_* wrappers read the learner's recorder.
 *
 * PLplot is not thread-safe: calls are serialised inside the library. Every figure is its own
 * PLplot stream, ended before the call returns. PLplot's fatal errors are caught (the process
 * is never exited) and reported as CF_ERR_IO / CF_ERR_UNSUPPORTED with PLplot's message.
 * Without PLplot (built without CF_HAVE_PLPLOT) or without its pngcairo device, every plotting
 * call returns CF_ERR_UNSUPPORTED; cf_confusion_from_preds and cf_top_losses always work. */
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

/* The smoothed training loss per batch (losses[skip_start:] at x = skip_start..n-1) labelled
 * "train", and the per-epoch valid_loss at x = iters (epochs ending at or after skip_start)
 * labelled "valid"; xlabel "steps", ylabel "loss", title "learning curve". opts may be NULL.
 * CF_ERR_STATE when there is nothing to plot (no batch after skip_start). */
cf_status cf_plot_loss(const cf_recorder *rec, const char *png_path, const cf_plot_loss_opts *opts);

/* fastai's Recorder.plot_sched: lr and mom per training batch side by side (ylabels "lr" and
 * "mom", xlabel "iterations"), from the scheduler's record (hp_lr, hp_mom) or, when that is
 * empty, the recorder's lrs and moms. CF_ERR_STATE when no batch was recorded. */
cf_status cf_plot_sched(const cf_recorder *rec, const char *png_path);

/* fastai's plot_lr_find(skip_end=5): loss against learning rate on a log x axis (all points but
 * the last five), with each computed suggestion (r->suggest) as an 'o' marker, named in the
 * legend with its value ("valley = 1.2e-03"). CF_ERR_STATE when fewer than 2 points remain. */
cf_status cf_plot_lr_find(const cf_lr_find_result *r, const char *png_path);

/* fastai's plot_metrics: per-epoch values against epoch in a grid of subplots — the first
 * holds train_loss ("train") and valid_loss ("valid") under the title "losses", then one
 * subplot per metric, titled with its name. NaN values (cancelled phases) leave gaps.
 * CF_ERR_STATE when no epoch was recorded. */
cf_status cf_plot_metrics(const cf_recorder *rec, const char *png_path);

/* Confusion counts of a classifier's predictions: counts[actual * n_classes + predicted]
 * (n_classes^2 entries, overwritten). Predicted classes come from p->decoded when present,
 * else the argmax of p->preds (n, n_classes); actual classes from p->targs (n) as class ids.
 * CF_ERR_INVALID for shapes that do not match or a target outside [0, n_classes). */
cf_status cf_confusion_from_preds(const cf_preds *p, int n_classes, int64_t *counts);

/* ClassificationInterpretation.plot_confusion_matrix: a heat map (white to blue) of
 * counts[actual * n_classes + predicted], each cell labelled with its count (or, when
 * normalize, its share of the row to two decimals), "Actual" on y, "Predicted" on x and the
 * class names (vocab, or "0", "1", ... when NULL) as tick labels. Up to 100 classes. */
cf_status cf_plot_confusion_matrix(const int64_t *counts, int n_classes, char *const *vocab,
                                   const char *png_path, bool normalize);

/* Indices of the k items with the largest per-item loss (p->losses), largest first (ties: lower
 * index first), as ClassificationInterpretation.top_losses. 1 <= k <= p->n. */
cf_status cf_top_losses(const cf_preds *p, int k, int64_t *idx_out);

/* plot_top_losses: the k top-loss input images (p->inputs (n, C, H, W), C 1 or 3; each image is
 * rescaled to its own min..max) in a grid, each titled "pred/actual / loss / prob" (prob: the
 * predicted class's probability) under the figure title "Prediction/Actual/Loss/Probability".
 * Needs p->inputs, p->losses and p->preds; vocab may be NULL. 1 <= k <= min(p->n, 64). */
cf_status cf_plot_top_losses(const cf_preds *p, int k, char *const *vocab, const char *png_path);

/* ClassificationInterpretation.most_confused(min_val): the off-diagonal cells of
 * counts[actual * n_classes + predicted] with a count >= min_val (min_val < 1 counts as 1),
 * largest count first (ties in row-major order, as fastai's stable sort of np.where). Writes
 * at most max_out of them to out (which may be NULL with max_out 0) and returns how many
 * there are in all, or -1 (with the error set) for bad arguments. */
typedef struct cf_confused_pair {
    int actual, predicted;
    int64_t count;
} cf_confused_pair;
int64_t cf_most_confused(const int64_t *counts, int n_classes, int64_t min_val,
                         cf_confused_pair *out, int64_t max_out);

/* fastai's show_batch: the first n images of a batch (x (B, C, H, W), C 1 or 3; each image
 * rescaled to its own min..max, so normalised inputs show as they look) in a grid, each titled
 * with its class name (vocab, or the class id); multi-hot targets (B, C) of a vocab titled with
 * their label set joined by ';', a point (B, 2) without vocab (-1..1) marked with a green '+'.
 * 1 <= n <= min(B, 64). */
cf_status cf_show_batch(const cf_batch *batch, int n, char *const *vocab, const char *png_path);

/* Options of cf_plot_show_batch_text; a field left at zero takes the default. */
typedef struct cf_show_text_opts {
    int max_rows;      /* rows of the batch shown: 9 (fastai's max_n) */
    int max_tokens;    /* tokens of each text: 150 (fastai's trunc_at), then an ellipsis */
    int width, height; /* pixels, each in [64, 8192]; width 0: cf_plot_set_size's width;
                          height 0: as tall as the table */
} cf_show_text_opts;

/* fastai's show_batch for text as a figure: the table fastai shows, one row per text of the
 * batch (the first max_rows), with the row number, the text (its first max_tokens token ids named
 * by nz->token and joined with spaces; padding left out as fastai's decoding does, the other
 * special tokens xxbos, xxmaj, xxunk ... visible; an ellipsis when cut) and its label column:
 * "category" (the class, or a multi-label text's classes joined with ';') for a classifier,
 * "text_" (the target, the text shifted by one) for a language model. Each cell is wrapped to
 * its column; rows are striped as pandas shows a table. UTF-8 text is drawn as is (East Asian
 * wide characters count two cells when wrapping). Characters scale with the width (11 pixels
 * high at 800); a given height shrinks them, down to 0.6, to hold the table and cuts what still
 * does not fit. dl is the text loader the batch came from (cf_text_loader_corpus: its classes),
 * nz the loader's numericalizer (dls->text_nz). opts may be NULL. CF_ERR_INVALID for a loader
 * that is not a text loader, a batch that is not (B, seq_len) ids or bad options. The terminal
 * twin is cf_text_show_batch. */
cf_status cf_plot_show_batch_text(const cf_dataloader *dl, const cf_batch *b,
                                  const cf_text_numericalizer *nz, const char *png_path,
                                  const cf_show_text_opts *opts);

/* fastai's show_results for a classifier: the first n items of get_preds(with_input) titled
 * "actual/predicted", in green when right and red when wrong; multi-label rows (targets (n, C),
 * sigmoid probabilities, vocab) as label sets joined by ';' (predicted: p > 0.5); points (targets
 * and predictions (n, 2) in -1..1, vocab NULL) as a green '+' (target) and a red 'x'
 * (prediction) on the image. Needs p->inputs and p->preds;
 * 1 <= n <= min(p->n, 64). */
cf_status cf_show_results(const cf_preds *p, int n, char *const *vocab, const char *png_path);

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

/* fastai's ShowGraphCallback, drawn to files (order 65, training fits only: not in lr_find,
 * validate or get_preds): after every epoch it redraws the learning curve (cf_plot_loss from the
 * first batch, with the validation losses so far) and, unless no_metrics and when the learner
 * has metrics, the per-epoch losses and metrics (cf_plot_metrics), each into one file, and notes
 * each path once on the learner (cf_learner_note_figure). It draws on the master only: in a
 * parallel fit rank 0 draws from the whole run's Recorder (losses and metrics are reduced over
 * the replicas) and the paths come home in the caller's learner. Add it to the learner
 * (cf_learner_add_cb) or to a call's cbs. NULL when out of memory or the options are too long;
 * a fit with it fails at before_fit when figures cannot be written here (cf_plot_available). */
cf_callback *cf_show_graph_cb_(const cf_show_graph_opts *opts);
#define cf_show_graph_cb(...) cf_show_graph_cb_(&(cf_show_graph_opts){__VA_ARGS__})

/* lr_find's option to draw its plot where it runs (rank 0 of a parallel call):
 *     cf_lr_find(learn, &r, CF_LR_FIND_PLOT("lr_find.png"));  */
#define CF_LR_FIND_PLOT(png_path) .plot = cf_plot_lr_find, .plot_path = (png_path)

/* Shows figures in the terminal: each path is printed on `out` (NULL: stdout) and, when `out` is
 * a terminal that draws sixel graphics (it answers the primary device attributes query with 4,
 * or COREFIT_SIXEL=1 says so) and libsixel is installed (loaded at run time), the figure is drawn
 * under it. COREFIT_SIXEL=0 prints the paths only. Returns the number of figures drawn as
 * sixel (0 when only paths were printed). */
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
