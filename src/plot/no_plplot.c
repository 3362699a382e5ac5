/* The figure functions of a build without PLplot (CMakeLists.txt compiles this file instead of
 * the figure files then): each reports what is missing. */
#include "corefit/plot.h"

#include "plot_internal.h"

static cf_status no_plplot(const char *what) {
    return cf_fail(CF_ERR_UNSUPPORTED,
                   "%s: corefit was built without PLplot (install libplplot-dev and "
                   "plplot-driver-cairo, then reconfigure); no PNG figures can be written",
                   what);
}

bool cf_plot_available(void) {
    return false;
}
cf_status cf_plot_set_size(int width, int height) {
    (void)width, (void)height;
    return no_plplot("plot_set_size");
}
cf_status cf_plot_loss(const cf_recorder *rec, const char *png_path,
                       const cf_plot_loss_opts *opts) {
    (void)rec, (void)png_path, (void)opts;
    return no_plplot("plot_loss");
}
cf_status cf_plot_sched(const cf_recorder *rec, const char *png_path) {
    (void)rec, (void)png_path;
    return no_plplot("plot_sched");
}
cf_status cf_plot_lr_find(const cf_lr_find_result *r, const char *png_path) {
    (void)r, (void)png_path;
    return no_plplot("plot_lr_find");
}
cf_status cf_plot_metrics(const cf_recorder *rec, const char *png_path) {
    (void)rec, (void)png_path;
    return no_plplot("plot_metrics");
}
cf_status cf_plot_confusion_matrix(const int64_t *counts, int n_classes, char *const *vocab,
                                   const char *png_path, bool normalize) {
    (void)counts, (void)n_classes, (void)vocab, (void)png_path, (void)normalize;
    return no_plplot("plot_confusion_matrix");
}
cf_status cf_plot_top_losses(const cf_preds *p, int k, char *const *vocab, const char *png_path) {
    (void)p, (void)k, (void)vocab, (void)png_path;
    return no_plplot("plot_top_losses");
}
cf_status cf_show_batch(const cf_batch *batch, int n, char *const *vocab, const char *png_path) {
    (void)batch, (void)n, (void)vocab, (void)png_path;
    return no_plplot("show_batch");
}
cf_status cf_plot_show_batch_text(const cf_dataloader *dl, const cf_batch *b,
                                  const cf_text_numericalizer *nz, const char *png_path,
                                  const cf_show_text_opts *opts) {
    (void)dl, (void)b, (void)nz, (void)png_path, (void)opts;
    return no_plplot("show_batch (text)");
}
cf_status cf_show_results(const cf_preds *p, int n, char *const *vocab, const char *png_path) {
    (void)p, (void)n, (void)vocab, (void)png_path;
    return no_plplot("show_results");
}
cf_status cf_show_batch_masks(const cf_batch *batch, int n, int n_codes, const char *png_path) {
    (void)batch, (void)n, (void)n_codes, (void)png_path;
    return no_plplot("show_batch (masks)");
}
cf_status cf_show_results_masks(const cf_preds *p, int n, int n_codes, const char *png_path) {
    (void)p, (void)n, (void)n_codes, (void)png_path;
    return no_plplot("show_results (masks)");
}
cf_status cf_plot__raw_figure(const char *path) {
    (void)path;
    return no_plplot("plot");
}
