/* Segmentation on the command line (--masks): images in a folder, each mask found from its
 * image's name by fastai's label_func rule (masks folder + suffix), the class names from codes;
 * fastai's unet_learner with CrossEntropyLossFlat over pixels and the segmentation metrics;
 * predict's decoded masks written as PNG files. train.c, build.c, data.c and eval_predict.c call
 * in here through the cli_seg_* hooks. */
#include "corefit.h"

#include <cJSON.h>
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#ifdef CF_HAVE_STB
#include <stb_image_write.h>
#endif

static const char *const seg_metric_names[] = {"foreground_acc", "dice", "dice_multi", "jaccard"};
enum { N_SEG_METRICS = sizeof seg_metric_names / sizeof *seg_metric_names };

/* The bodies the command line builds a U-Net on. */
static bool seg_arch_known(const char *arch) {
    static const char *const known[] = {"resnet18",  "resnet34",  "resnet50",
                                        "xresnet18", "xresnet34", "xresnet50"};
    for (size_t i = 0; i < sizeof known / sizeof *known; i++)
        if (strcmp(arch, known[i]) == 0) return true;
    return false;
}

int cli_seg_check(const char *cmd, const cli_data *d, const char *arch, const char *metrics) {
    const cli_seg_data *s = &d->seg;
    if (!s->masks) {
        if (s->mask_dir || s->mask_suffix || s->codes)
            return cli_error(CLI_USAGE, cmd, "--mask-dir, --mask-suffix and --codes need --masks");
        if (s->self_attention || s->blur)
            return cli_error(CLI_USAGE, cmd,
                             "--self-attention and --blur are the U-Net's: they need --masks");
        return CLI_OK;
    }
    if (!d->images || d->idx || d->csv || d->images_csv)
        return cli_error(CLI_USAGE, cmd,
                         "--masks reads a folder of images: give --images DIR (not --idx, --csv "
                         "or --images-csv)");
    if (d->aug)
        return cli_error(CLI_USAGE, cmd,
                         "--aug is not available with --masks (the affine batch transforms do not "
                         "move masks yet)");
    if (d->load && strcmp(d->load, "memory") != 0)
        return cli_error(CLI_USAGE, cmd,
                         "--masks decodes the images and masks up front: --load %s is not "
                         "available",
                         d->load);
    if (d->skip_bad || d->label_re || d->resize || d->rrc_min_scale > 0)
        return cli_error(CLI_USAGE, cmd,
                         "--skip-bad, --label-re, --resize and --random-resized-crop are not "
                         "available with --masks (images and masks are squished to --size)");
    if (d->regression || d->task.multi_label || d->task.points)
        return cli_error(CLI_USAGE, cmd,
                         "--masks is a task of its own: not with --regression, --multi-label or "
                         "--points");
    if (arch && !seg_arch_known(arch))
        return cli_error(CLI_USAGE, cmd,
                         "--masks builds a U-Net on resnet18, resnet34, resnet50, xresnet18, "
                         "xresnet34 or xresnet50, not --arch %s",
                         arch);
    if (s->mask_suffix && strchr(s->mask_suffix, '/'))
        return cli_error(CLI_USAGE, cmd, "--mask-suffix '%s' holds a '/' (use --mask-dir)",
                         s->mask_suffix);
    if (metrics) {
        strlist names = {0};
        if (strlist_split(metrics, &names)) return cli_error(CLI_FAIL, cmd, "out of memory");
        int rc = CLI_OK;
        for (int i = 0; i < names.n && rc == CLI_OK; i++) {
            bool ok = false;
            for (int k = 0; k < N_SEG_METRICS; k++)
                ok |= strcmp(names.v[i], seg_metric_names[k]) == 0;
            if (!ok)
                rc = cli_error(CLI_USAGE, cmd,
                               "unknown --metrics name '%s' for --masks (foreground_acc, dice, "
                               "dice_multi, jaccard)",
                               names.v[i]);
        }
        strlist_free(&names);
        return rc;
    }
    return CLI_OK;
}

/* The parent folder of dir ("data/images" -> "data", "images" -> "."). */
static void parent_of(const char *dir, char *buf, size_t n) {
    char tmp[PATH_MAX];
    const char *name = cli_folder_name(dir, tmp, sizeof tmp);
    const char *slash = strrchr(name, '/');
    if (!slash)
        snprintf(buf, n, ".");
    else if (slash == name)
        snprintf(buf, n, "/");
    else
        snprintf(buf, n, "%.*s", (int)(slash - name), name);
}

/* A path given relative to the images folder's parent (absolute paths stay). */
static void beside_images(const char *images, const char *rel, char *buf, size_t n) {
    if (rel[0] == '/') {
        snprintf(buf, n, "%s", rel);
        return;
    }
    char parent[PATH_MAX];
    parent_of(images, parent, sizeof parent);
    int k = snprintf(buf, n, "%s/%s", parent, rel);
    if (k < 0 || (size_t)k >= n) snprintf(buf, n, "%s", rel); /* too long: taken as given */
}

cf_status cli_seg_load(const cli_data *d, const char **input, cf_dataset **train,
                       cf_dataset **valid) {
    const cli_seg_data *s = &d->seg;
    *input = "masks";
    *train = *valid = NULL;
    char codes_path[PATH_MAX], mask_dir[PATH_MAX], suffix[256], ext[64];
    if (s->codes) /* a named file is taken as given */
        snprintf(codes_path, sizeof codes_path, "%s", s->codes);
    else
        beside_images(d->images, "codes.txt", codes_path, sizeof codes_path);
    beside_images(d->images, s->mask_dir ? s->mask_dir : "labels", mask_dir, sizeof mask_dir);
    /* "_P.png": suffix "_P" and extension ".png"; "_P": the image's own extension */
    const char *sfx = s->mask_suffix ? s->mask_suffix : "_P";
    const char *dot = strrchr(sfx, '.');
    snprintf(suffix, sizeof suffix, "%.*s", dot ? (int)(dot - sfx) : (int)strlen(sfx), sfx);
    snprintf(ext, sizeof ext, "%s", dot ? dot : "");
    char **codes = NULL;
    int n_codes = 0;
    cf_status st = cf_codes_read(codes_path, &codes, &n_codes);
    if (st) {
        if (!s->codes && st == CF_ERR_IO)
            cf_fail_context(st, "--codes not given and no codes.txt beside %s", d->images);
        return st;
    }
    if (!d->quiet)
        fprintf(stderr, "masks: %s/<image stem>%s%s, %d codes from %s (%s", mask_dir, suffix,
                dot ? ext : "<image extension>", n_codes, codes_path, codes[0]);
    for (int i = 1; !d->quiet && i < n_codes && i < 12; i++) fprintf(stderr, ", %s", codes[i]);
    if (!d->quiet) fprintf(stderr, "%s)\n", n_codes > 12 ? ", ..." : "");
    cf_mask_rule rule = {mask_dir, suffix, dot ? ext : NULL};
    cf_image_folder_options o = {.size = d->size,
                                 .channels = d->channels,
                                 .valid_pct = d->valid_pct,
                                 .seed = d->seed,
                                 .load = CF_IMAGE_LOAD_MEMORY};
    if (d->eval) o.valid_pct = 0; /* eval: every image of the folder */
    st = cf_datasets_from_masks(d->images, &rule, (const char *const *)codes, n_codes, &o, train,
                                valid);
    cf_codes_free(codes, n_codes);
    if (st == CF_OK && d->limit > 0) /* the first N of the training split and N/5 of the valid */
        st = cf_dataset_keep_first(train, d->limit);
    if (st == CF_OK && d->limit > 0)
        st = cf_dataset_keep_first(valid, d->limit / 5 ? d->limit / 5 : 1);
    if (st) {
        cf_dataset_free(*train);
        cf_dataset_free(*valid);
        *train = *valid = NULL;
    }
    return st;
}

bool cli_seg_metrics(const char *cmd, const cli_data *d, const char *list, int n_classes,
                     cf_metric ***out, int *n, int *rc) {
    if (!d->seg.masks) return false;
    *out = NULL;
    *n = 0;
    *rc = CLI_OK;
    strlist names = {0};
    if (strlist_split(list ? list : "foreground_acc,dice_multi", &names)) {
        *rc = cli_error(CLI_FAIL, cmd, "out of memory");
        return true;
    }
    cf_metric **m = cf_calloc((size_t)names.n + 1, sizeof *m);
    int k = 0;
    for (int i = 0; m && i < names.n && *rc == CLI_OK; i++) {
        const char *s = names.v[i];
        cf_metric *x = !strcmp(s, "foreground_acc") ? cf_foreground_acc(0)
                       : !strcmp(s, "dice")         ? cf_dice()
                       : !strcmp(s, "dice_multi")   ? cf_dice_multi(n_classes)
                       : !strcmp(s, "jaccard")      ? cf_jaccard_coeff()
                                                    : NULL;
        if (!x)
            *rc = cli_error(CLI_USAGE, cmd, "unknown --metrics name '%s' for --masks", s);
        else
            m[k++] = x;
    }
    if (!m) *rc = cli_error(CLI_FAIL, cmd, "out of memory");
    strlist_free(&names);
    if (*rc != CLI_OK) {
        for (int i = 0; i < k; i++) cf_metric_free(m[i]);
        cf_free(m);
        return true;
    }
    *out = m;
    *n = k;
    return true;
}

cf_status cli_seg_learner(cf_learner **out, cf_dls *dls, const char *arch, cf_metric **metrics,
                          int n_metrics, uint64_t seed, bool quiet, const char *pretrained,
                          const cli_seg_data *seg) {
    cf_unet_opts uo = cf_unet_defaults(); /* fastai's, but for the options given */
    uo.self_attention = seg->self_attention;
    uo.blur = seg->blur;
    return cf_unet_learner(out, dls, arch, .metrics = metrics, .n_metrics = n_metrics, .seed = seed,
                           .quiet = quiet, .pretrained = pretrained, .unet = &uo);
}

/* ---- figures ------------------------------------------------------------------------------ */

void cli_seg_figures(const char *cmd, const char *dir, const cf_preds *p, int n_codes,
                     struct cli_figures *figs) {
    char path[4096];
    snprintf(path, sizeof path, "%s/show_results.png", dir);
    const int shown = p->n < 9 ? (int)p->n : 9; /* fastai's max_n */
    cf_status st = shown > 0 ? cf_show_results_masks(p, shown, n_codes, path)
                             : cf_fail(CF_ERR_STATE, "no validation images");
    cli_figure_done(cmd, figs, st, path, "show_results");
}

int cli_seg_eval_figures(const char *cmd, cf_learner *learn, const char *dir) {
    if (!cf_plot_available()) {
        fprintf(stderr,
                "corefit %s: figures need PLplot with its pngcairo driver (plot-driver-cairo); "
                "none written\n",
                cmd);
        return CLI_OK;
    }
    cf_preds p = {0};
    if (cf_get_preds(learn, &p, .with_input = true))
        return cli_lib_error(cmd, "predictions for the figures");
    cli_figures figs = {0};
    cli_seg_figures(cmd, dir, &p, learn->dls->valid_ds->n_classes, &figs);
    cli_figures_free(&figs);
    cf_preds_free(&p);
    return CLI_OK;
}

cf_status cli_seg_adopt_model(cf_dataset *ds, const cf_model_info *m) {
    if (ds->n_classes != m->recipe.n_out)
        return cf_fail(CF_ERR_FORMAT, "%s: %d codes, the model has %d classes",
                       ds->source ? ds->source : "masks", ds->n_classes, m->recipe.n_out);
    for (int i = 0; ds->vocab && m->n_vocab == m->recipe.n_out && i < m->n_vocab; i++)
        if (strcmp(ds->vocab[i], m->vocab[i]) != 0)
            return cf_fail(CF_ERR_FORMAT,
                           "code %d is '%s' in the codes given, '%s' in the model (the same "
                           "codes, in the same order, are needed)",
                           i, ds->vocab[i], m->vocab[i]);
    return CF_OK;
}

/* ---- predict ------------------------------------------------------------------------------ */

/* The per-pixel argmax of (C, H, W) probabilities. */
static void decode_mask(const float *probs, int c, int hw, uint8_t *mask) {
    for (int p = 0; p < hw; p++) {
        int best = 0;
        for (int k = 1; k < c; k++)
            if (probs[(size_t)k * hw + p] > probs[(size_t)best * hw + p]) best = k;
        mask[p] = (uint8_t)best;
    }
}

bool cli_seg_predict(const char *cmd, const cf_model_info *m, const char *input, const float *probs,
                     const char *out_png, void *json_array, int *rc) {
    if (strncmp(m->recipe.arch, "unet-", 5) != 0) return false;
    *rc = CLI_OK;
    const int c = m->recipe.n_out, h = m->height, w = m->width, hw = h * w;
    uint8_t *mask = cf_malloc((size_t)hw);
    int64_t *count = cf_calloc((size_t)c, sizeof *count);
    if (!mask || !count) {
        cf_free(mask);
        cf_free(count);
        *rc = cli_error(CLI_FAIL, cmd, "out of memory");
        return true;
    }
    decode_mask(probs, c, hw, mask);
    for (int p = 0; p < hw; p++) count[mask[p]]++;
    if (out_png) {
#ifdef CF_HAVE_STB
        if (!stbi_write_png(out_png, w, h, 1, mask, w))
            *rc = cli_error(CLI_FAIL, cmd, "cannot write the mask %s: %s", out_png,
                            errno ? strerror(errno) : "stb_image_write failed");
#else
        *rc = cli_error(CLI_FAIL, cmd,
                        "--out: this corefit was built without stb_image_write (libstb-dev)");
#endif
    }
    const char *name = NULL;
    char fallback[32];
    if (json_array) {
        cJSON *o = cJSON_CreateObject();
        cJSON_AddStringToObject(o, "input", input);
        if (out_png && *rc == CLI_OK) cJSON_AddStringToObject(o, "mask", out_png);
        cJSON_AddNumberToObject(o, "height", h);
        cJSON_AddNumberToObject(o, "width", w);
        cJSON *shares = cJSON_AddObjectToObject(o, "pixels");
        for (int k = 0; k < c; k++) {
            snprintf(fallback, sizeof fallback, "%d", k);
            name = m->n_vocab == c ? m->vocab[k] : fallback;
            cJSON_AddNumberToObject(shares, name, (double)count[k] / hw);
        }
        cJSON_AddItemToArray((cJSON *)json_array, o);
    } else {
        /* input, the mask file (or -), then class:share for the classes present, largest first */
        cli_print_tsv_field(input);
        putchar('\t');
        cli_print_tsv_field(out_png && *rc == CLI_OK ? out_png : "-");
        for (;;) {
            int best = -1;
            for (int k = 0; k < c; k++)
                if (count[k] > 0 && (best < 0 || count[k] > count[best])) best = k;
            if (best < 0) break;
            snprintf(fallback, sizeof fallback, "%d", best);
            name = m->n_vocab == c ? m->vocab[best] : fallback;
            putchar('\t');
            cli_print_tsv_field(name);
            printf(":%.4f", (double)count[best] / hw);
            count[best] = 0;
        }
        putchar('\n');
    }
    cf_free(mask);
    cf_free(count);
    return true;
}
