/* The learner of corefit train and lr-find from its options: the cores it runs on, the data,
 * --pretrained (a corefit model or torchvision's/timm's ResNet weights), the normalisation, the
 * metrics and the model (fastai's vision_learner or tabular_learner). */
#include "corefit.h"
#include "photo.h"
#include "train.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* Metrics by name for a classifier or a regression. */
static int make_metrics(const char *cmd, const char *list, int n_classes, cf_metric ***out,
                        int *n) {
    *out = NULL;
    *n = 0;
    strlist names = {0};
    const char *def = n_classes > 0 ? "accuracy" : "mae";
    if (strlist_split(list ? list : def, &names)) return cli_error(CLI_FAIL, cmd, "out of memory");
    cf_metric **m = cf_calloc((size_t)names.n + 1, sizeof *m);
    int k = 0, rc = CLI_OK;
    for (int i = 0; i < names.n && rc == CLI_OK; i++) {
        const char *s = names.v[i];
        bool cls = n_classes > 0;
        cf_metric *x = NULL;
        if (!strcmp(s, "accuracy") && cls)
            x = cf_accuracy();
        else if (!strcmp(s, "error_rate") && cls)
            x = cf_error_rate();
        else if (!strcmp(s, "top_5_accuracy") && cls)
            x = cf_top_k_accuracy(5);
        else if (!strcmp(s, "precision") && cls)
            x = cf_precision(n_classes, n_classes != 2);
        else if (!strcmp(s, "recall") && cls)
            x = cf_recall(n_classes, n_classes != 2);
        else if (!strcmp(s, "f1_score") && cls)
            x = cf_f1_score(n_classes, n_classes != 2);
        else if (!strcmp(s, "mse") && !cls)
            x = cf_mse_metric();
        else if (!strcmp(s, "mae") && !cls)
            x = cf_mae();
        else if (!strcmp(s, "rmse") && !cls)
            x = cf_rmse();
        else
            rc = cli_error(CLI_USAGE, cmd,
                           "unknown --metrics name '%s' for a %s (classifiers: accuracy, "
                           "error_rate, top_5_accuracy, precision, recall, f1_score; regression: "
                           "mse, mae, rmse)",
                           s, cls ? "classifier" : "regression");
        if (x) m[k++] = x;
    }
    strlist_free(&names);
    if (rc != CLI_OK) {
        for (int i = 0; i < k; i++) cf_metric_free(m[i]);
        cf_free(m);
        return rc;
    }
    *out = m;
    *n = k;
    return CLI_OK;
}

/* How many processes share the fit: MPI ranks, fork workers or this process alone. */
static int world_size(const session *s) {
    return s->par.start_method == CF_START_MPI ? cf_comm_size(s->mpi)
           : s->parallel                       ? s->par.num_cores
                                               : 1;
}

/* --start, --cores, --threads and the fit's par options; --resume's file checked (every MPI
 * rank stops alike). */
static int start_processes(const char *cmd, const train_args *a, session *s) {
    if (a->start && strcmp(a->start, "mpi") == 0) {
        if (cf_par_mpi_comm(&s->mpi)) return cli_lib_error(cmd, "--start mpi");
        s->master = cf_comm_rank(s->mpi) == 0;
        s->parallel = true;
        s->par.start_method = CF_START_MPI;
    } else {
        s->par.num_cores = a->cores > 0 ? a->cores : cf_available_cores();
        s->parallel = s->par.num_cores > 1;
    }
    /* before the data is read; under MPI only rank 0 reads the checkpoint (and sends it on),
     * so only its machine needs the file, and every rank stops alike when it is missing (a
     * rank that left alone would leave the others waiting for it until the deadline) */
    if (a->resume) {
        int missing = s->master && access(a->resume, R_OK) != 0 ? errno : 0;
        if (s->mpi && cf_comm_broadcast(s->mpi, &missing, sizeof missing, 0))
            return cli_lib_error(cmd, "--start mpi");
        if (missing)
            return s->master
                       ? cli_error(CLI_FAIL, cmd, "--resume %s: %s", a->resume, strerror(missing))
                       : CLI_FAIL;
    }
    s->par.split_batch = a->split_batch;
    s->par.deadline_s = a->deadline;
    s->par.max_restarts = a->max_restarts;
    s->par.commit_every = a->commit_every;
    if (a->threads > 0) cf_set_num_threads(a->threads);
    /* An in-process fit (and each MPI rank) runs BLAS on this process's threads: room for
     * OpenBLAS's work buffers first, or a clear error (fork workers see to their own). */
    if ((!s->parallel || s->par.start_method == CF_START_MPI) &&
        cf_blas_reserve(cf_get_num_threads()))
        return cli_lib_error(cmd, "BLAS");
    return CLI_OK;
}

/* --pretrained: the arch, channels, size and normalisation its body expects (into pre);
 * *tv_depth > 0 for torchvision's or timm's ResNet weights (photo.c). */
static int read_pretrained(const char *cmd, train_args *a, cf_model_info *pre, int *tv_depth) {
    cli_data *d = &a->data;
    /* a pretrained model says which arch, channels and size the body expects */
    if (a->pretrained) {
        int rc = cli_pretrained_kind(cmd, a->pretrained, a->arch, tv_depth);
        if (rc) return rc;
    }
    if (*tv_depth > 0) {
        /* fastai's vision_learner(resnetN, pretrained=True): RGB, ImageNet's statistics */
        static const float imagenet_mean[3] = {0.485f, 0.456f, 0.406f},
                           imagenet_std[3] = {0.229f, 0.224f, 0.225f};
        if (d->channels && d->channels != 3)
            return cli_error(CLI_USAGE, cmd, "--pretrained %s holds RGB weights: --channels 3",
                             a->pretrained);
        snprintf(pre->recipe.arch, sizeof pre->recipe.arch, "resnet%d", *tv_depth);
        pre->n_norm = 3;
        memcpy(pre->mean, imagenet_mean, sizeof imagenet_mean);
        memcpy(pre->std, imagenet_std, sizeof imagenet_std);
        d->channels = 3;
    } else if (a->pretrained) {
        if (cf_model_info_read(a->pretrained, pre)) return cli_lib_error(cmd, "--pretrained");
        if (strcmp(pre->recipe.arch, "tabular") == 0) {
            cf_model_info_free(pre);
            return cli_error(CLI_USAGE, cmd, "--pretrained %s is a tabular model", a->pretrained);
        }
        /* --masks: a U-Net's "unet-<body>" is compared by its body */
        const char *pre_arch = pre->recipe.arch;
        if (d->seg.masks && strncmp(pre_arch, "unet-", 5) == 0) pre_arch += 5;
        if (a->arch && strcmp(a->arch, pre_arch) != 0) {
            int rc = cli_error(CLI_USAGE, cmd, "--arch %s differs from the pretrained model's %s",
                               a->arch, pre_arch);
            cf_model_info_free(pre);
            return rc;
        }
        if (!d->channels) d->channels = pre->n_in;
        if (!d->size) d->size = pre->height;
    }
    return CLI_OK;
}

/* The training and validation sets, described on stderr; at least one full batch a process. */
static int load_data(const char *cmd, train_args *a, session *s, cf_model_info *pre,
                     cf_dataset **train, cf_dataset **valid) {
    cli_data *d = &a->data;
    double t0 = cf_now();
    d->quiet = !s->master; /* every MPI rank reads the data; rank 0 tells what it found */
    if (cli_load_data(d, &s->input, train, valid)) {
        cf_model_info_free(pre);
        return cli_lib_error(cmd, "loading the data");
    }
    if (!a->quiet && s->master) {
        char resize[128] = ""; /* how the images are sized (photo.c) */
        if (d->images || d->images_csv) cli_photo_describe(d, d->size, resize, sizeof resize);
        fprintf(stderr, "data: %lld training and %lld validation samples%s%s (%.1f s)\n",
                (long long)(*train)->n, (long long)(*valid)->n,
                !d->images && !d->images_csv     ? ""
                : cf_dataset_is_streamed(*train) ? ", streamed from their files"
                                                 : ", decoded into memory",
                resize, cf_now() - t0);
    }
    if (!a->quiet && s->master && d->limit > 0 && d->csv)
        fprintf(stderr,
                "limit: the first %lld rows of %s (the file is read no further), split at random "
                "(--seed %llu) into %lld training and %lld validation rows; categories, "
                "statistics and classes are fitted on those training rows\n",
                (long long)((*train)->n + (*valid)->n), d->csv, (unsigned long long)d->seed,
                (long long)(*train)->n, (long long)(*valid)->n);
    if (!a->quiet && s->master && d->limit > 0 && d->seg.masks)
        fprintf(stderr, "limit: the first %lld training and %lld validation images of the split\n",
                (long long)(*train)->n, (long long)(*valid)->n);
    else if (!a->quiet && s->master && d->limit > 0 && (d->images || d->images_csv)) {
        fprintf(stderr,
                "limit: a random sample of %lld training and %lld validation samples%s "
                "(--seed %llu)",
                (long long)(*train)->n, (long long)(*valid)->n,
                (*train)->n_classes > 0 ? ", stratified by class" : "",
                (unsigned long long)d->seed);
        /* the training samples of each class (up to 20 classes) */
        for (int c = 0; (*train)->vocab && c < (*train)->n_classes && c < 20; c++) {
            int64_t k = 0;
            for (int64_t i = 0; i < (*train)->n; i++) k += (int)(*train)->y[i] == c;
            fprintf(stderr, "%s%s %lld", c ? ", " : ": ", (*train)->vocab[c], (long long)k);
        }
        fprintf(stderr, "\n");
    }
    if ((*valid)->n_unseen > 0 && s->master) /* Categorify's #na#, as fastai, but said */
        fprintf(stderr,
                "corefit %s: warning: %lld categorical value%s of the validation set %s not seen "
                "in training (encoded as #na#)\n",
                cmd, (long long)(*valid)->n_unseen, (*valid)->n_unseen == 1 ? "" : "s",
                (*valid)->n_unseen == 1 ? "was" : "were");
    int world = world_size(s);
    int bs = d->bs ? d->bs : 64;
    int64_t per_rank = a->split_batch ? (*train)->n : (*train)->n / world;
    if (per_rank < bs) {
        int rc = cli_error(CLI_FAIL, cmd,
                           "the training set has %lld samples: no full batch of %d%s for %d "
                           "process%s (drop_last); lower --bs%s",
                           (long long)(*train)->n, bs, a->split_batch ? "" : " per process", world,
                           world == 1 ? "" : "es", world > 1 ? " or --cores" : "");
        cf_dataset_free(*train);
        cf_dataset_free(*valid);
        return rc;
    }
    return CLI_OK;
}

/* The normalisation, the metrics, the DataLoaders and the learner (train and valid taken over). */
static int build_learner(const char *cmd, train_args *a, session *s, cf_model_info *pre,
                         int tv_depth, cf_dataset *train, cf_dataset *valid) {
    cli_data *d = &a->data;
    int world = world_size(s);
    int bs = d->bs ? d->bs : 64;
    bool tabular = d->csv != NULL;
    char arch[32];
    if (pre->recipe.arch[0])
        snprintf(arch, sizeof arch, "%s",
                 d->seg.masks && strncmp(pre->recipe.arch, "unet-", 5) == 0 ? pre->recipe.arch + 5
                                                                            : pre->recipe.arch);
    else if (a->arch)
        snprintf(arch, sizeof arch, "%s", a->arch);
    else if (d->seg.masks) /* a U-Net on the smallest torchvision body */
        snprintf(arch, sizeof arch, "resnet18");
    else
        snprintf(arch, sizeof arch, "%s",
                 tabular                            ? "tabular"
                 : train->sample_shape.dim[1] <= 64 ? "mini-resnet"
                                                    : "xresnet18");
    int n_norm = 0;
    float mean[4] = {0}, std[4] = {0};
    if (!tabular && pre->n_norm > 0 && pre->n_norm == train->sample_shape.dim[0]) {
        /* fastai's vision_learner keeps the pretrained model's statistics (ImageNet's for
         * torchvision weights): the body was trained on inputs normalised that way */
        n_norm = pre->n_norm;
        memcpy(mean, pre->mean, (size_t)n_norm * sizeof *mean);
        memcpy(std, pre->std, (size_t)n_norm * sizeof *std);
        if (!a->quiet && s->master) {
            fprintf(stderr, "normalize: the pretrained %s statistics, mean",
                    tv_depth > 0 ? "weights' (ImageNet's)" : "model's");
            for (int i = 0; i < n_norm; i++) fprintf(stderr, " %.4g", mean[i]);
            fprintf(stderr, ", std");
            for (int i = 0; i < n_norm; i++) fprintf(stderr, " %.4g", std[i]);
            fprintf(stderr, "\n");
        }
    }
    cf_model_info_free(pre);
    if (!tabular && n_norm == 0) {
        n_norm = train->sample_shape.dim[0];
        if (n_norm > 4 || cf_dataset_channel_stats(train, mean, std)) {
            cf_dataset_free(train);
            cf_dataset_free(valid);
            return cli_lib_error(cmd, "normalisation statistics");
        }
    }
    cf_metric **metrics = NULL;
    int n_metrics = 0;
    int rc = CLI_OK;
    if (!cli_seg_metrics(cmd, d, a->metrics, train->n_classes, &metrics, &n_metrics, &rc) &&
        !cli_task_metrics(cmd, d, a->metrics, train->n_classes, &metrics, &n_metrics, &rc))
        rc = make_metrics(cmd, a->metrics, train->n_classes, &metrics, &n_metrics);
    if (rc != CLI_OK) {
        cf_dataset_free(train);
        cf_dataset_free(valid);
        return rc;
    }
    cf_aug_opts aug = cf_aug_transforms_defaults(1.0f);
    cf_dls_options o = {.bs = d->bs,
                        .seed = d->seed,
                        .n_norm = n_norm,
                        .aug = d->aug && !tabular ? &aug : NULL,
                        .flip = d->flip && !tabular};
    memcpy(o.mean, mean, sizeof o.mean);
    memcpy(o.std, std, sizeof o.std);
    if (cf_dls_new(train, valid, &o, &s->dls)) {
        for (int i = 0; i < n_metrics; i++) cf_metric_free(metrics[i]);
        cf_free(metrics);
        return cli_lib_error(cmd, "DataLoaders");
    }
    cf_status st;
    bool quiet = a->quiet || !s->master;
    if (tabular) {
        strlist layers = {0};
        cf_tabular_learner_opts to = {
            .metrics = metrics, .n_metrics = n_metrics, .seed = d->seed, .quiet = quiet};
        if (d->regression && (!a->y_range || strcmp(a->y_range, "none") != 0)) {
            /* fastai's y_range: a sigmoid squashes the output into [low, high], so the model
             * starts near the targets' scale instead of near 0 */
            double lo, hi;
            if (a->y_range && strcmp(a->y_range, "auto") != 0) {
                sscanf(a->y_range, "%lf,%lf", &lo, &hi);
            } else { /* auto: the training targets' range, widened by 5% of it each side */
                lo = INFINITY, hi = -INFINITY;
                for (int64_t i = 0; i < train->n; i++) {
                    lo = fmin(lo, train->y[i * train->target_dim]);
                    hi = fmax(hi, train->y[i * train->target_dim]);
                }
                double pad = hi > lo ? 0.05 * (hi - lo) : fabs(hi) * 0.05 + 1;
                lo -= pad;
                hi += pad;
            }
            to.y_range = true;
            to.y_lo = (float)lo;
            to.y_hi = (float)hi;
            if (!a->quiet && s->master)
                fprintf(stderr, "y_range: [%g, %g]%s\n", lo, hi,
                        a->y_range && strcmp(a->y_range, "auto") != 0
                            ? ""
                            : " (the training targets' range + 5%; --y-range to change)");
        }
        if (a->layers) {
            if (strlist_split(a->layers, &layers)) return cli_error(CLI_FAIL, cmd, "out of memory");
            for (int i = 0; i < layers.n; i++) {
                char *end;
                long v = strtol(layers.v[i], &end, 10);
                if (i >= CF_TABULAR_MAX_LAYERS || end == layers.v[i] || *end || v < 1 ||
                    v > 1 << 20) {
                    strlist_free(&layers);
                    for (int k = 0; k < n_metrics; k++) cf_metric_free(metrics[k]);
                    cf_free(metrics);
                    return cli_error(CLI_USAGE, cmd,
                                     "--layers expects up to %d sizes like 200,100, got '%s'",
                                     CF_TABULAR_MAX_LAYERS, a->layers);
                }
                to.layers[to.n_layers++] = (int)v;
            }
            strlist_free(&layers);
        }
        st = cf_tabular_learner_(&s->learn, s->dls, &to);
    } else if (d->seg.masks) { /* fastai's unet_learner (seg.c) */
        st = cli_seg_learner(&s->learn, s->dls, arch, metrics, n_metrics, d->seed, quiet,
                             a->pretrained, &d->seg);
    } else {
        float lo = 0, hi = 0;
        bool y_range = (!a->y_range || strcmp(a->y_range, "none") != 0) &&
                       cli_task_y_range(d, train, &lo, &hi);
        if (y_range && a->y_range && strcmp(a->y_range, "auto") != 0) {
            double l, h;
            sscanf(a->y_range, "%lf,%lf", &l, &h);
            lo = (float)l, hi = (float)h;
        }
        if (y_range && !a->quiet && s->master) fprintf(stderr, "y_range: [%g, %g]\n", lo, hi);
        st = cf_vision_learner(&s->learn, s->dls, (cf_arch)cf_arch_from_name(arch),
                               .metrics = metrics, .n_metrics = n_metrics, .seed = d->seed,
                               .quiet = quiet, .pretrained = a->pretrained, .y_range = y_range,
                               .y_lo = lo, .y_hi = hi);
    }
    cf_free(metrics);
    if (st) return cli_lib_error(cmd, "building the learner");
    if (a->wd > 0) s->learn->wd = a->wd;
    if (a->label_smoothing > 0) s->learn->loss.label_smoothing = (float)a->label_smoothing;
    if (a->bf16 && cf_learner_to_bf16(s->learn)) return cli_lib_error(cmd, "--bf16");
    if ((a->mixup > 0 || a->cutmix > 0) &&
        ((a->mixup > 0 && a->cutmix > 0) ||
         cf_learner_add_cb(s->learn,
                           a->mixup > 0 ? cf_mixup_cb(a->mixup) : cf_cutmix_cb(a->cutmix))))
        return cli_lib_error(cmd, a->mixup > 0 && a->cutmix > 0 ? "--mixup with --cutmix"
                                                                : "--mixup/--cutmix");
    if (!a->quiet && s->master)
        fprintf(stderr, "model: %s%s, %zu parameters; %s\n", d->seg.masks ? "unet-" : "", arch,
                cf_model_num_weights(s->learn->model),
                s->par.start_method == CF_START_MPI
                    ? "MPI ranks (--start mpi)"
                    : (s->parallel ? "worker processes (fork)" : "in-process"));
    if (!a->quiet && s->master && s->par.start_method != CF_START_MPI && s->parallel) {
        int w = s->par.num_cores;
        if (a->split_batch) /* the loader gives worker r samples [r*bs/w, (r+1)*bs/w) */
            fprintf(stderr,
                    "cores: %d worker processes, each batch of %d split across them (%d%s each)\n",
                    w, bs, bs / w, bs % w ? " or 1 more" : "");
        else
            fprintf(stderr, "cores: %d worker processes, batch size %d each\n", w, bs);
    }
    int64_t steps = (a->split_batch ? train->n : train->n / world) / bs;
    int epochs = a->epochs + (strcmp(a->schedule, "fine-tune") == 0 ? a->freeze_epochs : 0);
    if (!a->quiet && s->master && strcmp(cmd, "train") == 0 && steps * epochs < 100)
        /* fit_one_cycle warms up over a quarter of the steps and anneals over the rest: a handful
         * of steps ends where it began */
        fprintf(stderr,
                "note: only %lld optimizer step%s (%lld samples, %d per step); that is too few to "
                "learn much: raise --epochs or --limit, or lower --bs\n",
                (long long)(steps * epochs), steps * epochs == 1 ? "" : "s", (long long)train->n,
                a->split_batch ? bs : bs * world);
    return CLI_OK;
}

int cli_setup(const char *cmd, train_args *a, session *s) {
    memset(s, 0, sizeof *s);
    s->master = true;
    cf_model_info pre = {0};
    int tv_depth = 0;
    cf_dataset *train = NULL, *valid = NULL;
    int rc;
    if ((rc = start_processes(cmd, a, s)) || (rc = read_pretrained(cmd, a, &pre, &tv_depth)))
        return rc;
    cli_data *d = &a->data;
    if ((d->images || d->images_csv) && !d->size) d->size = 64;
    if (tv_depth > 0 && s->master) cli_photo_imagenet_size_note(cmd, d->size);
    if ((rc = load_data(cmd, a, s, &pre, &train, &valid))) return rc;
    return build_learner(cmd, a, s, &pre, tv_depth, train, valid);
}
