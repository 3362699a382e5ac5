/* The corefit command on small data: every subcommand's output and files, usage errors (message
 * and exit status), and `corefit predict` against cf_get_preds on the same inputs. */
#include "child.h"
#include "oracle.h"

#include <cJSON.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "corefit.h"

#ifdef CF_HAVE_STB
#include <stb_image_write.h>
#endif

#define COREFIT CF_BUILD_DIR "/corefit"
#define FMNIST "/usr/share/datasets/fashion-mnist"

static char dir[256];
static const char *const fmnist_names[10] = {"T-shirt/top", "Trouser",   "Pullover", "Dress",
                                             "Coat",        "Sandal",    "Shirt",    "Sneaker",
                                             "Bag",         "Ankle boot"};
static char model_path[512]; /* a mini-resnet trained on a Fashion-MNIST subset */

typedef struct run_result {
    int status;
    char *out, *err;
} run_result;

static char *slurp(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *s = malloc((size_t)n + 1);
    size_t k = fread(s, 1, (size_t)n, f);
    s[k] = '\0';
    fclose(f);
    return s;
}

/* A corefit run that ended with status (its exit status, or 128 + the signal that ended it): the
 * status and what it wrote to out.txt and err.txt in the test folder. */
static run_result run_outcome(int status) {
    run_result r = {.status = status};
    char path[600];
    snprintf(path, sizeof path, "%s/out.txt", dir);
    r.out = slurp(path);
    snprintf(path, sizeof path, "%s/err.txt", dir);
    r.err = slurp(path);
    assert_non_null(r.out);
    assert_non_null(r.err);
    return r;
}

/* Runs `corefit <args>` in the test folder, capturing stdout and stderr. */
static run_result run(const char *fmt, ...) {
    char args[4096], cmd[8192], out[600], err[600];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(args, sizeof args, fmt, ap);
    va_end(ap);
    snprintf(out, sizeof out, "%s/out.txt", dir);
    snprintf(err, sizeof err, "%s/err.txt", dir);
    /* CF_TEST_COREFIT: another build of the command (to see a test fail on an older one) */
    const char *exe = getenv("CF_TEST_COREFIT") ? getenv("CF_TEST_COREFIT") : COREFIT;
    snprintf(cmd, sizeof cmd, "cd '%s' && '%s' %s >'%s' 2>'%s' </dev/null", dir, exe, args, out,
             err);
    int s = system(cmd);
    return run_outcome(WIFEXITED(s) ? WEXITSTATUS(s) : 128 + WTERMSIG(s));
}

/* Runs a shell command in the test folder; it must succeed. */
static void shell(const char *line) {
    char cmd[2400];
    snprintf(cmd, sizeof cmd, "cd '%s' && %s", dir, line);
    if (system(cmd) != 0) fail_msg("failed: %s", cmd);
}

static void run_free(run_result *r) {
    free(r->out);
    free(r->err);
}

static void expect(run_result *r, int status, const char *in_out, const char *in_err) {
    if (r->status != status || (in_out && !strstr(r->out, in_out)) ||
        (in_err && !strstr(r->err, in_err)))
        fail_msg("exit %d (expected %d)\nstdout: %s\nstderr: %s\nexpected stdout to hold '%s' and "
                 "stderr '%s'",
                 r->status, status, r->out, r->err, in_out ? in_out : "", in_err ? in_err : "");
}

static bool is_png(const char *path) {
    FILE *f = fopen(path, "rb");
    unsigned char b[8] = {0};
    bool ok = f && fread(b, 1, 8, f) == 8 && memcmp(b, "\x89PNG\r\n\x1a\n", 8) == 0;
    if (f) fclose(f);
    return ok;
}

static bool file_exists(const char *path) {
    struct stat sb;
    return stat(path, &sb) == 0;
}

/* The value after "key: " on its own line of text. */
static double value_of(const char *text, const char *key) {
    char pat[128];
    snprintf(pat, sizeof pat, "%s: ", key);
    const char *p = strstr(text, pat);
    if (!p) fail_msg("no '%s' in:\n%s", pat, text);
    return strtod(p + strlen(pat), NULL);
}

/* ---- usage errors -------------------------------------------------------------------------- */

static void test_usage_errors(void **state) {
    (void)state;
    /* a file that is not a model */
    char junk[600];
    snprintf(junk, sizeof junk, "%s/junk.safetensors", dir);
    FILE *f = fopen(junk, "wb");
    fputs("not a model", f);
    fclose(f);
    static const struct {
        const char *args;
        int status;
        const char *err;
    } cases[] = {
        {"", 2, "Usage: corefit <command>"},
        {"frob", 2, "unknown command 'frob'"},
        {"train --bogus", 2, "corefit train: unknown option '--bogus'"},
        {"train --epochs x", 2, "--epochs expects a whole number"},
        {"train --epochs 0", 2, "--epochs expects a whole number in [1,"},
        {"train --bs", 2, "--bs expects a value"},
        {"train --quiet=1", 2, "--quiet takes no value"},
        {"train --arch foo", 2, "unknown --arch 'foo' (choose mini-resnet"},
        {"train --schedule warp", 2, "unknown --schedule 'warp'"},
        {"train --lr -1", 2, "--lr expects a positive number or 'auto'"},
        {"train --lr fast", 2, "--lr expects a positive number or 'auto'"},
        {"train --valid-pct 2", 2, "--valid-pct expects a number in"},
        {"train --start smoke", 2, "--start must be fork or mpi"},
        {"train --channels 2", 2, "--channels must be 1 or 3"},
        {"train --csv t.csv --cat a", 2, "--csv needs --target"},
        {"train --cat a", 2, "need --csv"},
        {"train --idx a --images b", 2, "give one data source"},
        {"train --arch tabular", 2, "--arch tabular needs --csv"},
        {"train extra", 2, "unexpected argument 'extra'"},
        {"train --idx /nonexistent/fmnist", 1, "--idx /nonexistent/fmnist: No such file"},
        {"train --idx /tmp --limit 10", 1, "no train-images-idx3-ubyte(.gz) in /tmp"},
        {"train --pretrained /nonexistent.safetensors", 1, "/nonexistent.safetensors"},
        {"train --metrics nonsense --limit 200 --bs 8", 2, "unknown --metrics name 'nonsense'"},
        /* checked before any data is read (the folder does not exist) */
        {"train --metrics foo --idx /nonexistent", 2, "unknown --metrics name 'foo'"},
        {"train --csv t.csv --target y --cont a --regression --metrics accuracy", 2,
         "unknown --metrics name 'accuracy' for a regression"},
        {"train --cores 999", 2, "--cores expects a whole number in [1, 256], got '999'"},
        {"train --max-restarts -1", 2, "--max-restarts expects a whole number in [0,"},
        {"train --max-restarts 2 --start mpi", 2,
         "under mpirun run the job with corefit-mpirun --max-restarts 2"},
        {"train --max-restarts 1 --cores 1", 2,
         "--max-restarts restarts fork workers: give "
         "--cores 2 or more"},
        {"train --commit-every 5", 2, "--commit-every is how often --max-restarts commits"},
        {"train --commit-every 0 --max-restarts 1", 2, "--commit-every expects a whole number"},
        {"train --cores 0", 2, "--cores expects a whole number in [1, 256]"},
        {"train --csv t.csv --target y --cont a --regression --y-range 5,1", 2,
         "--y-range expects LOW,HIGH with LOW < HIGH"},
        {"train --y-range 0,1", 2, "--y-range is for --regression"},
        {"lr-find --plot a.png --plots figs", 2, "give --plot FILE or --plots DIR, not both"},
        {"train --limit 100 --cores 2", 1, "100 samples: no full batch of 64 per process for 2"},
        {"lr-find --num-it 2", 2, "--num-it expects a whole number in [6,"},
        {"lr-find --start-lr 1 --end-lr 0.1", 2, "--end-lr 0.1 must exceed --start-lr 1"},
        {"eval", 2, "corefit eval: expects one model file"},
        {"eval /nonexistent.safetensors", 1, "model file /nonexistent.safetensors: No such file"},
        {"eval junk.safetensors", 1, "corefit eval: reading the model:"},
        {"predict", 2, "corefit predict: expects a model file"},
        {"predict junk.safetensors", 2, "expects image files after the model"},
        {"predict junk.safetensors a.png --csv b.csv", 2, "not both"},
        {"predict --top 0 junk.safetensors a.png", 2, "--top expects a whole number"},
        {"predict junk.safetensors a.png", 1, "corefit predict: reading the model:"},
        {"info a b", 2, "unexpected argument 'b'"},
        {"info /nonexistent.safetensors", 1, "corefit info: reading the model:"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        run_result r = run("%s", cases[i].args);
        if (r.status != cases[i].status || !strstr(r.err, cases[i].err))
            fail_msg("corefit %s: exit %d (expected %d), stderr: %s(expected '%s')", cases[i].args,
                     r.status, cases[i].status, r.err, cases[i].err);
        run_free(&r);
    }
}

static void test_help(void **state) {
    (void)state;
    static const char *const cmds[] = {"train", "lr-find", "eval", "predict", "info"};
    run_result r = run("--help");
    expect(&r, 0, "Commands:", NULL);
    run_free(&r);
    for (size_t i = 0; i < sizeof cmds / sizeof *cmds; i++) {
        char usage[64];
        snprintf(usage, sizeof usage, "Usage: corefit %s", cmds[i]);
        r = run("%s --help", cmds[i]);
        expect(&r, 0, usage, NULL);
        assert_non_null(strstr(r.out, "--help"));
        run_free(&r);
    }
    /* info without a model file describes the machine as corefit sees it */
    r = run("info");
    expect(&r, 0, "kernels: ", NULL);
    assert_non_null(strstr(r.out, "cores: "));
    run_free(&r);
    r = run("train -h");
    expect(&r, 0, "--csv-log FILE", NULL);
    assert_non_null(strstr(r.out, "--max-restarts N"));
    assert_non_null(strstr(r.out, "--commit-every K"));
    run_free(&r);
}

/* ---- train, eval, info on a Fashion-MNIST subset -------------------------------------------- */

static void test_train_eval_info(void **state) {
    (void)state;
    /* 2 fork workers, figures, a CSV log; --show without a terminal says so */
    run_result r = run("train --limit 640 --bs 32 --epochs 2 --cores 2 --plots figs --csv-log "
                       "log.csv --out model.safetensors --show");
    expect(&r, 0, "model: model.safetensors", "--show needs a terminal");
    /* fastprogress's table on stdout: the header, then a row per epoch */
    assert_non_null(strstr(r.out, "epoch     train_loss  valid_loss  accuracy  time"));
    assert_non_null(strstr(r.out, "log: log.csv"));
    assert_non_null(strstr(r.err, "640 training and 128 validation samples"));
    /* 640 samples in steps of 2 x 32, twice: the hint that this is too little to learn from */
    assert_non_null(strstr(r.err, "note: only 20 optimizer steps (640 samples, 64 per step)"));
    snprintf(model_path, sizeof model_path, "%s/model.safetensors", dir);
    assert_true(file_exists(model_path));
    /* fastai's CSVLogger format */
    char path[600];
    snprintf(path, sizeof path, "%s/log.csv", dir);
    char *log = slurp(path);
    assert_non_null(log);
    assert_true(strncmp(log, "epoch,train_loss,valid_loss,accuracy,time\n0,", 44) == 0);
    const char *row2 = strstr(log, "\n1,");
    assert_non_null(row2);
    assert_null(strstr(row2 + 1, "\n2,"));
    double cols[4];
    assert_int_equal(sscanf(row2 + 1, "1,%lf,%lf,%lf", &cols[0], &cols[1], &cols[2]), 3);
    assert_true(cols[2] >= 0 && cols[2] <= 1);
    /* the result line agrees with the log */
    const char *res = strstr(r.out, "result: ");
    assert_non_null(res);
    const char *acc = strstr(res, " accuracy ");
    assert_non_null(acc);
    assert_true(fabs(strtod(acc + 10, NULL) - cols[2]) < 1e-12);
    if (cf_plot_available()) {
        static const char *const figs[] = {"loss", "schedule", "metrics", "confusion"};
        for (size_t i = 0; i < 4; i++) {
            snprintf(path, sizeof path, "%s/figs/%s.png", dir, figs[i]);
            if (!is_png(path)) fail_msg("%s is not a PNG file", path);
            char line[64];
            snprintf(line, sizeof line, "figure: figs/%s.png\n", figs[i]);
            assert_non_null(strstr(r.out, line));
        }
    }
    run_free(&r);

    /* eval on the same validation subset gives the fit's last validation */
    r = run("eval model.safetensors --limit 640");
    expect(&r, 0, "samples: 128", NULL);
    assert_true(fabs(value_of(r.out, "accuracy") - cols[2]) <= 1.0 / 128 + 1e-12);
    assert_true(fabs(value_of(r.out, "valid_loss") - cols[1]) <= 1e-4 * fabs(cols[1]) + 1e-6);
    run_free(&r);
    r = run("eval model.safetensors --limit 640 --json");
    expect(&r, 0, NULL, NULL);
    cJSON *j = cJSON_Parse(r.out);
    assert_non_null(j);
    assert_true(cJSON_GetObjectItem(j, "n")->valuedouble == 128);
    assert_true(fabs(cJSON_GetObjectItem(j, "accuracy")->valuedouble - cols[2]) <= 1.0 / 128);
    cJSON_Delete(j);
    run_free(&r);
    free(log);

    /* info: what the file holds, and the parameter count of the model it rebuilds */
    cf_module *root = cf_mini_resnet(1, 10);
    cf_model *m = NULL;
    assert_int_equal(cf_model_new(&m, root, 1), CF_OK);
    char count[64];
    snprintf(count, sizeof count, "parameters:  %zu trainable", cf_model_num_weights(m));
    cf_model_free(m);
    r = run("info model.safetensors");
    expect(&r, 0, "arch:        mini-resnet", NULL);
    assert_non_null(strstr(r.out, count));
    assert_non_null(strstr(r.out, "input:       1 x 28 x 28"));
    assert_non_null(strstr(r.out, "outputs:     10"));
    assert_non_null(strstr(r.out, "classes:     T-shirt/top, Trouser,"));
    run_free(&r);
    r = run("info model.safetensors --json");
    expect(&r, 0, NULL, NULL);
    j = cJSON_Parse(r.out);
    assert_non_null(j);
    cJSON *meta = cJSON_GetObjectItem(j, "metadata");
    assert_string_equal(cJSON_GetObjectItem(meta, "format")->valuestring, "pt");
    assert_string_equal(cJSON_GetObjectItem(meta, "corefit.arch")->valuestring, "mini-resnet");
    assert_string_equal(cJSON_GetObjectItem(meta, "corefit.image_size")->valuestring, "28x28");
    assert_non_null(cJSON_GetObjectItem(meta, "corefit.normalize"));
    cJSON_Delete(j);
    run_free(&r);
    /* the file is what cf_model_load takes */
    cf_st_file *st = NULL;
    assert_int_equal(cf_st_read(model_path, &st), CF_OK);
    assert_non_null(cf_st_find(st, "0.0.weight"));
    assert_null(cf_st_find(st, "opt.hypers"));
    cf_st_free(st);
}

/* ---- predict agrees with cf_get_preds ------------------------------------------------------ */

static void read_norm(const char *path, float *mean, float *std) {
    cf_st_file *f = NULL;
    assert_int_equal(cf_st_read(path, &f), CF_OK);
    cJSON *j = cJSON_Parse(cf_st_meta(f, "corefit.normalize"));
    assert_non_null(j);
    mean[0] = (float)cJSON_GetArrayItem(cJSON_GetObjectItem(j, "mean"), 0)->valuedouble;
    std[0] = (float)cJSON_GetArrayItem(cJSON_GetObjectItem(j, "std"), 0)->valuedouble;
    cJSON_Delete(j);
    cf_st_free(f);
}

static void test_predict_matches_get_preds(void **state) {
    (void)state;
#ifndef CF_HAVE_STB
    skip();
#else
    if (!model_path[0]) skip();
    enum { N = 7 };
    cf_dataset *all = NULL, *ds = NULL;
    assert_int_equal(cf_dataset_from_idx(FMNIST "/t10k-images-idx3-ubyte.gz",
                                         FMNIST "/t10k-labels-idx1-ubyte.gz", &all),
                     CF_OK);
    int64_t idx[N] = {0, 1, 2, 3, 4, 5, 6};
    assert_int_equal(cf_dataset_subset(all, idx, N, &ds), CF_OK);
    cf_dataset_free(all);
    /* the images as PNG files: pixel / 255 reads back exactly */
    char args[4096] = "predict model.safetensors --json";
    for (int i = 0; i < N; i++) {
        unsigned char px[28 * 28];
        for (int k = 0; k < 28 * 28; k++) px[k] = (unsigned char)lrintf(ds->x[i * 784 + k] * 255);
        char path[600];
        snprintf(path, sizeof path, "%s/img%d.png", dir, i);
        assert_true(stbi_write_png(path, 28, 28, 1, px, 28) != 0);
        snprintf(args + strlen(args), sizeof args - strlen(args), " img%d.png", i);
    }
    run_result r = run("%s", args);
    expect(&r, 0, NULL, NULL);
    cJSON *j = cJSON_Parse(r.out);
    if (!cJSON_IsArray(j)) fail_msg("not a JSON array: %s", r.out);
    assert_int_equal(cJSON_GetArraySize(j), N);

    /* the library's get_preds on the same images with the model file */
    float mean[4] = {0}, std[4] = {0};
    read_norm(model_path, mean, std);
    cf_dataset *first = NULL;
    assert_int_equal(cf_dataset_subset(ds, idx, 1, &first), CF_OK);
    cf_dls *dls = NULL;
    cf_dls_options o = {.bs = 3, .n_norm = 1, .mean = {mean[0]}, .std = {std[0]}};
    assert_int_equal(cf_dls_new(first, ds, &o, &dls), CF_OK);
    cf_learner *learn = NULL;
    assert_int_equal(
        cf_vision_learner(&learn, dls, CF_ARCH_MINI_RESNET, .n_out = 10, .quiet = true), CF_OK);
    assert_int_equal(cf_model_load(learn->model, NULL, model_path), CF_OK);
    cf_preds p = {0};
    assert_int_equal(cf_get_preds(learn, &p), CF_OK);
    assert_int_equal(p.n, N);
    for (int i = 0; i < N; i++) {
        cJSON *item = cJSON_GetArrayItem(j, i);
        char name[32];
        snprintf(name, sizeof name, "img%d.png", i);
        assert_string_equal(cJSON_GetObjectItem(item, "input")->valuestring, name);
        cJSON *probs = cJSON_GetObjectItem(item, "probabilities");
        assert_int_equal(cJSON_GetArraySize(probs), 10);
        int best = 0;
        for (int k = 0; k < 10; k++) {
            double got = cJSON_GetArrayItem(probs, k)->valuedouble;
            double want = p.preds.data[i * 10 + k];
            if (fabs(got - want) > 1e-5)
                fail_msg("image %d class %d: corefit predict %.8f, cf_get_preds %.8f", i, k, got,
                         want);
            if (want > p.preds.data[i * 10 + best]) best = k;
        }
        assert_int_equal((int)cJSON_GetObjectItem(item, "index")->valuedouble, best);
        assert_string_equal(cJSON_GetObjectItem(item, "class")->valuestring, fmnist_names[best]);
    }
    cJSON_Delete(j);
    run_free(&r);
    /* text output: input, class, probability */
    r = run("predict model.safetensors img0.png --top 2");
    expect(&r, 0, "img0.png\t", NULL);
    int best = 0;
    for (int k = 1; k < 10; k++)
        if (p.preds.data[k] > p.preds.data[best]) best = k;
    char line[128];
    snprintf(line, sizeof line, "img0.png\t%s\t%.6f\t", fmnist_names[best], p.preds.data[best]);
    if (strncmp(r.out, line, strlen(line)) != 0) fail_msg("'%s' does not start '%s'", r.out, line);
    run_free(&r);
    cf_preds_free(&p);
    cf_learner_free(learn);
    cf_dls_free(dls);
#endif
}

/* ---- lr-find and --lr auto ----------------------------------------------------------------- */

static void test_lr_find(void **state) {
    (void)state;
    run_result r =
        run("lr-find --limit 320 --bs 16 --num-it 30 --cores 1 --threads 1 --plot lr.png");
    expect(&r, 0, "valley: ", NULL);
    double valley = value_of(r.out, "valley");
    assert_true(valley > 1e-7 && valley < 10);
    assert_true(value_of(r.out, "minimum") > 0);
    char path[600];
    snprintf(path, sizeof path, "%s/lr.png", dir);
    if (cf_plot_available()) {
        assert_true(is_png(path));
        assert_non_null(strstr(r.out, "figure: lr.png"));
    }
    run_free(&r);
    /* train --lr auto takes lr_find's valley */
    r = run("train --limit 320 --bs 16 --cores 2 --lr auto --quiet --plots auto --out "
            "auto.safetensors");
    expect(&r, 0, "lr_find's valley", NULL);
    const char *lr = strstr(r.out, "lr: ");
    assert_non_null(lr);
    assert_true(strtod(lr + 4, NULL) > 0);
    if (cf_plot_available()) {
        snprintf(path, sizeof path, "%s/auto/lr_find.png", dir);
        assert_true(is_png(path));
    }
    run_free(&r);
}

/* ---- tabular: train, predict (against cf_get_preds), eval ---------------------------------- */

/* The library's loaders of table.csv as `corefit train --csv` makes them: color categorical,
 * size and weight continuous, label the target, 20% validation from seed 42. */
static cf_dls *table_dls(const char *csv) {
    const char *cat[] = {"color"}, *cont[] = {"size", "weight"};
    cf_tabular_options to = {.cat_names = cat,
                             .n_cat = 1,
                             .cont_names = cont,
                             .n_cont = 2,
                             .y_name = "label",
                             .valid_pct = 0.2,
                             .seed = 42};
    cf_dls *dls = NULL;
    assert_int_equal(cf_dls_from_csv(csv, &to, &(cf_dls_options){.bs = 16}, &dls), CF_OK);
    return dls;
}

static void test_tabular(void **state) {
    (void)state;
    enum { ROWS = 300 };
    char csv[600], csv2[600];
    snprintf(csv, sizeof csv, "%s/table.csv", dir);
    snprintf(csv2, sizeof csv2, "%s/rows.csv", dir);
    FILE *f = fopen(csv, "w"), *g = fopen(csv2, "w");
    fprintf(f, "color,size,weight,label\n");
    fprintf(g, "weight,size,color\n");
    static const char *const colors[] = {"red", "green", "blue"};
    cf_rng rng;
    cf_rng_seed(&rng, 5);
    for (int i = 0; i < ROWS; i++) {
        const char *c = colors[cf_rng_below(&rng, 3)];
        double size = cf_rng_uniform(&rng) * 10, weight = cf_rng_normal(&rng) * 3 + 20;
        bool yes = (size > 5) != (c[0] == 'b');
        char sz[32];
        if (i % 17 == 3)
            snprintf(sz, sizeof sz, "NA"); /* missing: filled with the median, flagged */
        else
            snprintf(sz, sizeof sz, "%.3f", size);
        fprintf(f, "%s,%s,%.3f,%s\n", c, sz, weight, yes ? "yes" : "no");
        fprintf(g, "%.3f,%s,%s\n", weight, sz, c);
    }
    fclose(f);
    fclose(g);
    run_result r = run("train --csv table.csv --cat color --cont size,weight --target label "
                       "--epochs 3 --cores 1 --bs 16 --lr 1e-2 --out tab.safetensors --csv-log "
                       "tab.csv");
    expect(&r, 0, "model: tab.safetensors", NULL);
    run_free(&r);
    r = run("info tab.safetensors");
    expect(&r, 0, "arch:        tabular", NULL);
    assert_non_null(
        strstr(r.out, "categorical: size_na (3 categories, missing-value flag of size)"));
    assert_non_null(strstr(r.out, "target:      label (classes)"));
    run_free(&r);

    /* the library's view: the same split and procs, the trained weights */
    char model[600];
    snprintf(model, sizeof model, "%s/tab.safetensors", dir);
    cf_dls *dls = table_dls(csv);
    cf_learner *learn = NULL;
    assert_int_equal(cf_tabular_learner(&learn, dls, .quiet = true), CF_OK);
    assert_int_equal(cf_model_load(learn->model, NULL, model), CF_OK);
    cf_preds p = {0};
    assert_int_equal(cf_get_preds(learn, &p, .train_set = true), CF_OK);
    int64_t *tr = NULL, *va = NULL, ntr = 0, nva = 0;
    assert_int_equal(cf_random_split(ROWS, 0.2, 42, &tr, &ntr, &va, &nva), CF_OK);
    assert_int_equal(p.n, ntr);

    /* predict every row, from the training table and from one without the target */
    for (int pass = 0; pass < 2; pass++) {
        r = run("predict tab.safetensors --csv %s --json", pass ? "rows.csv" : "table.csv");
        expect(&r, 0, NULL, NULL);
        cJSON *j = cJSON_Parse(r.out);
        if (!cJSON_IsArray(j)) fail_msg("not a JSON array: %s", r.out);
        assert_int_equal(cJSON_GetArraySize(j), ROWS);
        for (int64_t i = 0; i < ntr; i++) {
            cJSON *item = cJSON_GetArrayItem(j, (int)tr[i]);
            cJSON *probs = cJSON_GetObjectItem(item, "probabilities");
            for (int k = 0; k < 2; k++) {
                double got = cJSON_GetObjectItem(probs, dls->train_ds->vocab[k])->valuedouble;
                double want = p.preds.data[i * 2 + k];
                if (fabs(got - want) > 2e-5)
                    fail_msg("row %lld class %d: corefit predict %.8f, cf_get_preds %.8f",
                             (long long)tr[i], k, got, want);
            }
        }
        cJSON_Delete(j);
        run_free(&r);
    }
    r = run("eval tab.safetensors --csv table.csv");
    expect(&r, 0, "samples: 300", NULL);
    assert_true(value_of(r.out, "accuracy") >= 0.5);
    run_free(&r);
    r = run("eval tab.safetensors --csv rows.csv");
    expect(&r, 1, NULL, "no target column 'label'");
    run_free(&r);
    r = run("eval tab.safetensors --limit 10");
    expect(&r, 2, NULL, "a tabular model needs --csv");
    run_free(&r);
    cf_free(tr);
    cf_free(va);
    cf_preds_free(&p);
    cf_learner_free(learn);
    cf_dls_free(dls);
}

/* ---- fine-tuning the saved model on an image folder ---------------------------------------- */

#ifdef CF_HAVE_STB
/* Writes image k of class c to `stem` plus its extension, drawing its pixels from rng. */
typedef void (*image_writer)(const char *stem, int c, int k, cf_rng *rng);

/* root/{train,valid}/<class>/<k>.<ext>: n_train and n_valid images a class, written in that
 * order by write_one from one generator seeded with seed. */
static void write_folder(const char *root, const char *const *classes, int n_classes, int n_train,
                         int n_valid, uint64_t seed, image_writer write_one) {
    static const char *const parts[] = {"train", "valid"};
    char path[700];
    mkdir(root, 0777);
    cf_rng rng;
    cf_rng_seed(&rng, seed);
    for (int s = 0; s < 2; s++) {
        snprintf(path, sizeof path, "%s/%s", root, parts[s]);
        mkdir(path, 0777);
        for (int c = 0; c < n_classes; c++) {
            snprintf(path, sizeof path, "%s/%s/%s", root, parts[s], classes[c]);
            mkdir(path, 0777);
            for (int k = 0; k < (s ? n_valid : n_train); k++) {
                snprintf(path, sizeof path, "%s/%s/%s/%d", root, parts[s], classes[c], k);
                write_one(path, c, k, &rng);
            }
        }
    }
}

/* 28x28 grayscale PNG: class 0 bright, class 1 dark. */
static void write_gray(const char *stem, int c, int k, cf_rng *rng) {
    (void)k;
    unsigned char px[28 * 28];
    for (int i = 0; i < 28 * 28; i++)
        px[i] = (unsigned char)((c ? 40 : 180) + cf_rng_below(rng, 60));
    char path[800];
    snprintf(path, sizeof path, "%s.png", stem);
    assert_true(stbi_write_png(path, 28, 28, 1, px, 28) != 0);
}

/* root/{train,valid}/{bright,dark}/k.png: 28x28 grayscale. */
static void write_image_folder(const char *root) {
    static const char *const classes[] = {"bright", "dark"};
    write_folder(root, classes, 2, 12, 4, 3, write_gray);
}
#endif

static void test_fine_tune_image_folder(void **state) {
    (void)state;
#ifndef CF_HAVE_STB
    skip();
#else
    if (!model_path[0]) skip();
    char root[600];
    snprintf(root, sizeof root, "%s/pics", dir);
    write_image_folder(root);
    run_result r = run("train --images pics --pretrained model.safetensors --schedule fine-tune "
                       "--freeze-epochs 1 --epochs 1 --cores 1 --bs 8 --out ft.safetensors "
                       "--csv-log ft.csv");
    expect(&r, 0, "model: ft.safetensors", NULL);
    run_free(&r);
    /* fine_tune: the frozen epoch and the unfrozen one */
    char path[700];
    snprintf(path, sizeof path, "%s/ft.csv", dir);
    char *log = slurp(path);
    assert_non_null(log);
    assert_true(strncmp(log, "epoch,train_loss,valid_loss,accuracy,time\n0,", 44) == 0);
    free(log);
    /* channels and size come from the pretrained model */
    r = run("info ft.safetensors");
    expect(&r, 0, "classes:     bright, dark", NULL);
    assert_non_null(strstr(r.out, "input:       1 x 28 x 28"));
    assert_non_null(strstr(r.out, "trained on:  images"));
    run_free(&r);
    r = run("eval ft.safetensors --images pics");
    expect(&r, 0, "samples: 8", NULL);
    run_free(&r);
    r = run("predict ft.safetensors pics/valid/dark/0.png pics/valid/bright/1.png");
    expect(&r, 0, "pics/valid/dark/0.png\t", NULL);
    assert_non_null(strstr(r.out, "pics/valid/bright/1.png\t"));
    run_free(&r);
    /* a pretrained model of another arch is refused */
    r = run("train --images pics --pretrained model.safetensors --arch xresnet18");
    expect(&r, 2, NULL, "--arch xresnet18 differs from the pretrained model's mini-resnet");
    run_free(&r);
#endif
}

/* ---- a model exported by the library is one the command line reads (and back) -------------- */

static void test_library_export(void **state) {
    (void)state;
#ifndef CF_HAVE_STB
    skip();
#else
    char root[600], path[700];
    snprintf(root, sizeof root, "%s/pics", dir);
    struct stat sb;
    if (stat(root, &sb) != 0) write_image_folder(root);
    /* an image learner with its own head, trained and exported by the library */
    cf_dls *dls = NULL;
    assert_int_equal(
        cf_dls_from_image_folder(root, &(cf_image_folder_options){.size = 28, .channels = 1},
                                 &(cf_dls_options){.bs = 8, .seed = 1, .normalize = true}, &dls),
        CF_OK);
    cf_learner *learn = NULL;
    assert_int_equal(cf_vision_learner(&learn, dls, CF_ARCH_MINI_RESNET, .quiet = true, .seed = 2,
                                       .n_lin_ftrs = 1, .lin_ftrs = {24}),
                     CF_OK);
    assert_int_equal(cf_fit_one_cycle(learn, 1, .lr_max = CF_LR(1e-2)), CF_OK);
    snprintf(path, sizeof path, "%s/lib.safetensors", dir);
    assert_int_equal(cf_learner_export(learn, path), CF_OK);
    run_result r = run("info lib.safetensors");
    expect(&r, 0, "arch:        mini-resnet", NULL);
    assert_non_null(strstr(r.out, "classes:     bright, dark"));
    assert_non_null(strstr(r.out, "input:       1 x 28 x 28"));
    run_free(&r);
    r = run("eval lib.safetensors --images pics");
    expect(&r, 0, "samples: 8", NULL);
    run_free(&r);
    /* predict on the command line = cf_load_learner + cf_predict_image_file = the learner's own
     * get_preds on the same image (valid/dark/0.png is the 5th validation image) */
    r = run("predict lib.safetensors pics/valid/dark/0.png --json");
    expect(&r, 0, NULL, NULL);
    cJSON *j = cJSON_Parse(r.out);
    cJSON *probs = cJSON_GetObjectItem(cJSON_GetArrayItem(j, 0), "probabilities");
    assert_int_equal(cJSON_GetArraySize(probs), 2);
    cf_learner *loaded = NULL;
    assert_int_equal(cf_load_learner(path, &loaded), CF_OK);
    assert_string_equal(loaded->recipe.arch, "mini-resnet");
    assert_int_equal(loaded->recipe.lin_ftrs[0], 24);
    float got[2];
    int cls = -1;
    snprintf(path, sizeof path, "%s/pics/valid/dark/0.png", dir);
    assert_int_equal(cf_predict_image_file(loaded, path, got, &cls), CF_OK);
    cf_preds p = {0};
    assert_int_equal(cf_get_preds(learn, &p), CF_OK);
    assert_int_equal((int)dls->valid_ds->y[4], 1);
    for (int k = 0; k < 2; k++) {
        assert_float_equal(got[k], p.preds.data[4 * 2 + k], 1e-5);
        assert_float_equal(cJSON_GetArrayItem(probs, k)->valuedouble, got[k], 1e-5);
    }
    assert_int_equal(cls, got[1] > got[0]);
    cf_preds_free(&p);
    cJSON_Delete(j);
    run_free(&r);
    /* the loaded learner exports the same metadata again */
    snprintf(path, sizeof path, "%s/again.safetensors", dir);
    assert_int_equal(cf_learner_export(loaded, path), CF_OK);
    r = run("info again.safetensors --json");
    expect(&r, 0, "\"corefit.vocab\":\t\"[\\\"bright\\\",\\\"dark\\\"]\"", NULL);
    assert_non_null(strstr(r.out, "\"corefit.head\""));
    run_free(&r);
    /* missing image: a clear error naming it */
    assert_int_equal(cf_predict_image_file(loaded, "/nonexistent.png", got, NULL), CF_ERR_IO);
    assert_non_null(strstr(cf_last_error(), "/nonexistent.png"));
    /* a hand-made model exports its tensors and what the data says, but no architecture: the
     * command line says why it cannot rebuild it */
    cf_module *layers[] = {cf_flatten(), cf_linear(28 * 28, 2, true)};
    cf_model *hand = NULL;
    assert_int_equal(cf_model_new(&hand, cf_sequential(2, layers), 1), CF_OK);
    cf_learner *hl = NULL;
    assert_int_equal(cf_learner_new(&hl, dls, hand, .quiet = true), CF_OK);
    snprintf(path, sizeof path, "%s/hand.safetensors", dir);
    assert_int_equal(cf_learner_export(hl, path), CF_OK);
    cf_learner_free(hl);
    r = run("eval hand.safetensors --images pics");
    expect(&r, 1, NULL, "holds no corefit.arch metadata, so the model cannot be rebuilt");
    run_free(&r);
    r = run("info hand.safetensors --json");
    expect(&r, 0, "\"corefit.vocab\"", NULL);
    run_free(&r);
    /* lib.safetensors with both classes named alike: refused on load, naming them */
    snprintf(path, sizeof path, "%s/lib.safetensors", dir);
    cf_st_file *sf = NULL;
    assert_int_equal(cf_st_read(path, &sf), CF_OK);
    for (int i = 0; i < sf->n_meta; i++)
        if (strcmp(sf->meta_keys[i], "corefit.vocab") == 0) {
            cf_free(sf->meta_values[i]);
            sf->meta_values[i] = cf_strdup("[\"bright\",\"bright\"]");
        }
    char twin[700];
    snprintf(twin, sizeof twin, "%s/twin.safetensors", dir);
    assert_int_equal(cf_st_write(twin, sf->entries, sf->n_entries,
                                 (const char *const *)sf->meta_keys,
                                 (const char *const *)sf->meta_values, sf->n_meta),
                     CF_OK);
    cf_st_free(sf);
    cf_model_info twin_info;
    assert_int_equal(cf_model_info_read(twin, &twin_info), CF_ERR_FORMAT);
    assert_non_null(strstr(cf_last_error(), "names class 0 and class 1 both 'bright'"));
    cf_learner_free(loaded);
    cf_learner_free(learn);
    cf_dls_free(dls);
    /* a missing file: an error, nothing built */
    assert_int_equal(cf_load_learner("/nonexistent.safetensors", &loaded), CF_ERR_IO);
    assert_null(loaded);
#endif
}

/* A tabular learner exported by the library: eval and predict read its columns and target. */
static void test_library_export_tabular(void **state) {
    (void)state;
    char csv[600], path[600];
    snprintf(csv, sizeof csv, "%s/table.csv", dir);
    cf_dls *dls = table_dls(csv);
    cf_learner *learn = NULL;
    assert_int_equal(
        cf_tabular_learner(&learn, dls, .quiet = true, .n_layers = 2, .layers = {20, 10}), CF_OK);
    snprintf(path, sizeof path, "%s/libtab.safetensors", dir);
    assert_int_equal(cf_learner_export(learn, path), CF_OK);
    run_result r = run("info libtab.safetensors");
    expect(&r, 0, "target:      label (classes)", NULL);
    run_free(&r);
    r = run("eval libtab.safetensors --csv table.csv");
    expect(&r, 0, "samples: 300", NULL);
    run_free(&r);
    cf_learner *loaded = NULL;
    assert_int_equal(cf_load_learner(path, &loaded), CF_OK);
    assert_int_equal(loaded->recipe.layers[1], 10);
    assert_string_equal(loaded->dls->train_ds->y_name, "label");
    cf_learner_free(loaded);
    cf_learner_free(learn);
    cf_dls_free(dls);
}

/* ---- a newcomer's rough edges ------------------------------------------------------------- */

/* More workers than cores: a warning before the data is read. */
static void test_cores_warning(void **state) {
    (void)state;
    run_result r = run("train --cores 64 --limit 100");
    if (!strstr(r.err, "warning: --cores 64 runs more worker processes than the"))
        fail_msg("no warning: %s", r.err);
    assert_true(strstr(r.err, "warning:") < strstr(r.err, "data:") || !strstr(r.err, "data:"));
    run_free(&r);
}

/* lr-find takes --plots DIR as train does (the README's form). */
static void test_lr_find_plots_dir(void **state) {
    (void)state;
    run_result r = run("lr-find --limit 320 --bs 16 --num-it 10 --cores 1 --plots lrdir");
    expect(&r, 0, "valley: ", NULL);
    run_free(&r);
    if (cf_plot_available()) {
        char path[600];
        snprintf(path, sizeof path, "%s/lrdir/lr_find.png", dir);
        assert_true(is_png(path));
    }
}

/* A diverged fit stops (TerminateOnNaN), fails, writes no model and leaves no empty log or
 * figures folder behind. */
static void test_diverged_fit_fails(void **state) {
    (void)state;
    run_result r = run("train --limit 256 --bs 32 --cores 1 --lr 1e9 --out nan.safetensors "
                       "--csv-log nan.csv --plots nanfigs");
    expect(&r, 1, NULL, "corefit train: training:");
    assert_non_null(strstr(r.err, "no model written"));
    char path[600];
    snprintf(path, sizeof path, "%s/nan.safetensors", dir);
    assert_false(file_exists(path));
    snprintf(path, sizeof path, "%s/nan.csv", dir);
    assert_false(file_exists(path));
    snprintf(path, sizeof path, "%s/nanfigs", dir);
    assert_false(file_exists(path));
    run_free(&r);
}

/* Ctrl-C: the same in one process and under fork workers: a message, exit 130, and with
 * --save-every-epoch the last completed epoch's model (one `corefit info` reads). */
static void interrupt_run(const char *cores, bool save) {
    char out[600], err[600], log[600], model[600];
    snprintf(out, sizeof out, "%s/int_stdout.txt", dir);
    snprintf(err, sizeof err, "%s/int_stderr.txt", dir);
    snprintf(log, sizeof log, "%s/int_%s.csv", dir, cores);
    snprintf(model, sizeof model, "%s/int_%s.safetensors", dir, cores);
    unlink(log);
    unlink(model);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        setpgid(0, 0); /* Ctrl-C reaches the whole foreground process group */
        int o = open(out, O_WRONLY | O_CREAT | O_TRUNC, 0644),
            e = open(err, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        dup2(o, 1);
        dup2(e, 2);
        if (chdir(dir) != 0) _exit(99);
        execl(COREFIT, COREFIT, "train", "--limit", "640", "--bs", "32", "--epochs", "200",
              "--cores", cores, "--out", model, "--csv-log", log,
              save ? "--save-every-epoch" : "--quiet", (char *)NULL);
        _exit(98);
    }
    setpgid(pid, pid);
    /* Wait (liveness: while the process runs) until an epoch is done: its row is in the log (the
     * log appears with its first row) and, with --save-every-epoch, its model is saved. The row
     * comes first (CSVLogger's order is below the save's) and the save takes a while (fsync):
     * interrupting between the two would rightly leave no model, on a busy machine now and then. */
    struct stat sb;
    for (;;) {
        char *text = slurp(log);
        int lines = 0;
        for (const char *p = text; p && *p; p++) lines += *p == '\n';
        free(text);
        if (lines >= 2 && (!save || stat(model, &sb) == 0)) break;
        int status;
        if (waitpid(pid, &status, WNOHANG) == pid) fail_msg("corefit train ended early");
        usleep(100000);
    }
    kill(-pid, SIGINT);
    int status;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    char *e = slurp(err);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 130 ||
        !strstr(e, "corefit train: interrupted (Ctrl-C)") ||
        !strstr(e, save ? "holds the model of the last completed epoch" : "no model written"))
        fail_msg("--cores %s: status %d, stderr: %s", cores, status, e);
    free(e);
    if (save) {
        run_result r = run("info %s", model);
        expect(&r, 0, "arch:        mini-resnet", NULL);
        run_free(&r);
    } else { /* nothing saved, and the log keeps its completed epochs */
        assert_false(file_exists(model));
        char *text = slurp(log);
        int lines = 0;
        for (const char *p = text; p && *p; p++) lines += *p == '\n';
        if (!text || lines < 2) fail_msg("--cores %s: the log lost its epochs: %s", cores, text);
        free(text);
    }
}

static void test_interrupt(void **state) {
    (void)state;
    interrupt_run("1", true);
    interrupt_run("2", true);
    interrupt_run("1", false);
    interrupt_run("2", false);
}

/* --csv-log: a fit that fails before its first epoch leaves an existing log as it was; a log
 * path that is a symbolic link is replaced by the log, and the file it pointed to is untouched. */
static void test_csv_log_replaced_only_by_a_log(void **state) {
    (void)state;
    char path[600], target[600];
    snprintf(path, sizeof path, "%s/kept.csv", dir);
    FILE *f = fopen(path, "w");
    fputs("epoch,train_loss\n0,1.5\n", f);
    fclose(f);
    run_result r =
        run("train --limit 256 --bs 32 --cores 1 --lr 1e9 --quiet --out kept.safetensors "
            "--csv-log kept.csv");
    expect(&r, 1, NULL, "corefit train: training:");
    run_free(&r);
    char *text = slurp(path);
    assert_non_null(text);
    assert_string_equal(text, "epoch,train_loss\n0,1.5\n");
    free(text);
    /* the same under fork workers */
    r = run("train --limit 256 --bs 32 --cores 2 --lr 1e9 --quiet --out kept.safetensors "
            "--csv-log kept.csv");
    expect(&r, 1, NULL, "corefit train: training:");
    run_free(&r);
    text = slurp(path);
    assert_string_equal(text, "epoch,train_loss\n0,1.5\n");
    free(text);
    /* a symbolic link: the log replaces the link, not the file it points to */
    snprintf(target, sizeof target, "%s/precious.txt", dir);
    f = fopen(target, "w");
    fputs("precious\n", f);
    fclose(f);
    snprintf(path, sizeof path, "%s/linked.csv", dir);
    unlink(path);
    assert_int_equal(symlink("precious.txt", path), 0);
    r = run("train --limit 256 --bs 32 --cores 1 --quiet --out linked.safetensors "
            "--csv-log linked.csv");
    expect(&r, 0, "log: linked.csv", NULL);
    run_free(&r);
    text = slurp(target);
    assert_string_equal(text, "precious\n");
    free(text);
    struct stat sb;
    assert_int_equal(lstat(path, &sb), 0);
    assert_true(S_ISREG(sb.st_mode));
    text = slurp(path);
    assert_non_null(strstr(text, "epoch,train_loss,valid_loss,accuracy,time\n0,"));
    free(text);
    /* no temporary file stays beside either log */
    char cmd[700];
    snprintf(cmd, sizeof cmd, "ls '%s' | grep -q '\\.csv\\.tmp-'", dir);
    assert_int_not_equal(system(cmd), 0);
}

/* A model file whose corefit.image_size is absurd: predict, eval and info name the file and the
 * value, before sizing anything from it. */
static void test_absurd_image_size(void **state) {
    (void)state;
    if (!model_path[0]) skip(); /* test_train_eval_info makes it */
    FILE *f = fopen(model_path, "rb");
    assert_non_null(f);
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    unsigned char *b = malloc((size_t)n + 64);
    assert_int_equal(fread(b, 1, (size_t)n, f), (size_t)n);
    fclose(f);
    uint64_t hl = 0;
    for (int i = 0; i < 8; i++) hl |= (uint64_t)b[i] << (8 * i);
    char *header = malloc(hl + 64);
    memcpy(header, b + 8, hl);
    header[hl] = '\0';
    const char *key = "\"corefit.image_size\":\"";
    char *at = strstr(header, key);
    assert_non_null(at);
    at += strlen(key);
    char *end = strchr(at, '"');
    /* the new value, then the rest of the header (the header grows: its length changes) */
    char *patched = malloc(hl + 64);
    snprintf(patched, hl + 64, "%.*s16384x16384%s", (int)(at - header), header, end);
    uint64_t pl = strlen(patched);
    char path[600];
    snprintf(path, sizeof path, "%s/absurd.safetensors", dir);
    f = fopen(path, "wb");
    for (int i = 0; i < 8; i++) fputc((int)((pl >> (8 * i)) & 0xff), f);
    fwrite(patched, 1, pl, f);
    fwrite(b + 8 + hl, 1, (size_t)n - 8 - hl, f);
    fclose(f);
    free(b);
    free(header);
    free(patched);
    const char *want = "absurd.safetensors: metadata corefit.image_size is '16384x16384': "
                       "268435456 values per image for 1 channel";
    run_result r = run("predict absurd.safetensors absurd.safetensors");
    expect(&r, 1, NULL, want);
    run_free(&r);
    r = run("eval absurd.safetensors --limit 64");
    expect(&r, 1, NULL, want);
    run_free(&r);
    r = run("info absurd.safetensors");
    expect(&r, 0, want, NULL);
    run_free(&r);
}

/* An --out that cannot be written fails before the fit (no epoch in the table): a folder that is
 * a regular file, and a read-only folder (unless root, who may write there anyway). */
static void test_unwritable_out_fails_first(void **state) {
    (void)state;
    char path[600];
    snprintf(path, sizeof path, "%s/plain_file", dir);
    FILE *f = fopen(path, "w");
    fputs("x\n", f);
    fclose(f);
    run_result r = run("train --limit 256 --bs 32 --cores 1 --out plain_file/m.safetensors");
    expect(&r, 1, NULL, "corefit train: --out: cannot write plain_file/m.safetensors: Not a dir");
    assert_null(strstr(r.out, "train_loss"));
    run_free(&r);
    snprintf(path, sizeof path, "%s/read_only", dir);
    assert_int_equal(mkdir(path, 0500), 0);
    if (geteuid() != 0) {
        r = run("train --limit 256 --bs 32 --cores 2 --out read_only/m.safetensors");
        expect(&r, 1, NULL, "corefit train: --out: cannot write read_only/m.safetensors");
        assert_non_null(strstr(r.err, "Permission denied"));
        assert_null(strstr(r.out, "train_loss"));
        run_free(&r);
    }
    chmod(path, 0700);
}

/* --quiet: no bars or messages, but the table and the results. */
static void test_quiet_keeps_table(void **state) {
    (void)state;
    run_result r = run("train --limit 320 --bs 32 --cores 1 --quiet --out q.safetensors");
    expect(&r, 0, "epoch     train_loss  valid_loss  accuracy  time", NULL);
    assert_non_null(strstr(r.out, "result: "));
    assert_null(strstr(r.err, "data:"));
    run_free(&r);
}

/* --out into a folder that does not exist yet: made before the fit; "DIR/" prints as DIR. */
static void test_out_folder(void **state) {
    (void)state;
    run_result r =
        run("train --limit 256 --bs 32 --cores 1 --quiet --out new/sub/m.safetensors --plots f2/");
    expect(&r, 0, "model: new/sub/m.safetensors", NULL);
    if (cf_plot_available()) assert_non_null(strstr(r.out, "figure: f2/loss.png"));
    assert_null(strstr(r.out, "//"));
    run_free(&r);
    r = run("lr-find --limit 320 --bs 16 --num-it 10 --cores 1 --plots f3/");
    expect(&r, 0, NULL, NULL);
    if (cf_plot_available()) assert_non_null(strstr(r.out, "figure: f3/lr_find.png"));
    run_free(&r);
}

/* Regression on the command line: targets far from 0 are learned (y_range), the table's columns
 * stay apart, eval reports errors in the target's units. */
static void test_regression(void **state) {
    (void)state;
    char csv[600];
    snprintf(csv, sizeof csv, "%s/prices.csv", dir);
    FILE *f = fopen(csv, "w");
    fprintf(f, "rooms,area,price\n");
    cf_rng rng;
    cf_rng_seed(&rng, 11);
    for (int i = 0; i < 400; i++) {
        double area = 40 + cf_rng_uniform(&rng) * 100;
        int rooms = 1 + (int)cf_rng_below(&rng, 5);
        fprintf(f, "%d,%.2f,%.2f\n", rooms, area, 20000 + 100 * area + 1000 * rooms);
    }
    fclose(f);
    run_result r = run("train --csv prices.csv --cat rooms --cont area --target price --regression "
                       "--epochs 4 --cores 1 --bs 32 --lr 1e-2 --out price.safetensors");
    expect(&r, 0, "model: price.safetensors", "y_range: [");
    /* each row of the table: 5 separate fields (epoch, train_loss, valid_loss, mae, time) */
    const char *h = strstr(r.out, "epoch     train_loss  valid_loss  mae       time");
    if (!h) fail_msg("no table header: %s", r.out);
    const char *row = strchr(h, '\n') + 1;
    char a[64], b[64], c[64], d[64], e[64];
    assert_int_equal(sscanf(row, "%63s %63s %63s %63s %63s", a, b, c, d, e), 5);
    assert_non_null(strchr(e, ':')); /* the time column */
    run_free(&r);
    r = run("eval price.safetensors --csv prices.csv");
    expect(&r, 0, "mae: ", NULL);
    double mae = value_of(r.out, "mae");
    assert_non_null(strstr(r.out, "_rmse: "));
    /* the targets are 24000..36000: a model stuck near 0 would be ~30000 off */
    if (!(mae < 3000)) fail_msg("mae %g:\n%s", mae, r.out);
    run_free(&r);
    /* a category training never saw: #na#, and said */
    snprintf(csv, sizeof csv, "%s/new_prices.csv", dir);
    f = fopen(csv, "w");
    fprintf(f, "rooms,area,price\n2,50,26000\n9,60,35000\n12,70,39000\n");
    fclose(f);
    r = run("eval price.safetensors --csv new_prices.csv");
    expect(&r, 0, "samples: 3",
           "warning: 2 categorical values in new_prices.csv were not seen in training");
    run_free(&r);
}

/* --limit N of a CSV table reads its first N + N/5 rows and fits the vocabularies on the N
 * training rows among them: a table whose training split holds more category bytes than a saved
 * model carries (8 MiB: 2800 rows of 4 KB categories, each distinct) is refused whole, and
 * trained with --limit 100; rows past those read are never parsed. */
static void test_csv_limit_bounds_what_is_read(void **state) {
    (void)state;
    char csv[600];
    snprintf(csv, sizeof csv, "%s/wide.csv", dir);
    FILE *f = fopen(csv, "w");
    assert_non_null(f);
    fprintf(f, "color,size,label\n");
    char *pad = malloc(4001);
    assert_non_null(pad);
    memset(pad, 'c', 4000);
    pad[4000] = '\0';
    for (int i = 0; i < 2800; i++)
        fprintf(f, "%s%05d,%.3f,%s\n", pad, i, (i % 97) / 97.0, i % 2 ? "odd" : "even");
    fclose(f);
    free(pad);
    run_result r = run("train --csv wide.csv --cat color --cont size --target label --epochs 1 "
                       "--cores 1 --bs 16 --out wide_all.safetensors");
    expect(&r, 1, NULL, "the categorical vocabularies hold");
    run_free(&r);
    /* a broken row past the first 120 rows: --limit never reads it */
    f = fopen(csv, "a");
    fprintf(f, "only,two\n");
    fclose(f);
    r = run("train --csv wide.csv --cat color --cont size --target label --epochs 1 --cores 1 "
            "--bs 16 --limit 100 --seed 5 --out wide.safetensors");
    expect(&r, 0, "model: wide.safetensors", "limit: the first 120 rows of wide.csv");
    assert_non_null(strstr(r.err, "data: 100 training and 20 validation samples"));
    run_free(&r);
    char path[600];
    snprintf(path, sizeof path, "%s/wide.safetensors", dir);
    cf_model_info info;
    assert_int_equal(cf_model_info_read(path, &info), CF_OK);
    assert_int_equal(info.n_cat, 1);
    assert_int_equal(info.cat_cardinality[0], 101); /* #na# and the 100 training rows' colors */
    assert_int_equal(info.n_vocab, 2);
    cf_model_info_free(&info);
    /* without --limit the broken row is found, by its line */
    r = run("train --csv wide.csv --cat color --cont size --target label --epochs 1 --cores 1 "
            "--out wide_all.safetensors");
    expect(&r, 1, NULL, "wide.csv: line 2802 has 2 fields, the header has 3");
    run_free(&r);
}

/* eval on a flat class folder, and on a folder with only valid/. */
static void test_eval_flat_folder(void **state) {
    (void)state;
    if (!model_path[0]) skip();
    run_result r = run("eval ft.safetensors --images pics/valid");
    expect(&r, 0, "samples: 8", NULL);
    run_free(&r);
    shell("mkdir -p onlyvalid && cp -r pics/valid onlyvalid/");
    r = run("eval ft.safetensors --images onlyvalid");
    expect(&r, 0, "samples: 8", NULL);
    run_free(&r);
}

/* ---- photos: an RGB folder of JPEGs and PNGs of assorted sizes (issue 30's bugs) ----------- */

#ifdef CF_HAVE_STB
/* four classes: a one-class vocabulary read as four names reads past its allocation */
static const char *const photo_classes[4] = {"cat", "dog", "fox", "owl"};

/* An RGB image of 20-35 px, class c's colour with noise: a JPEG for odd k, else a PNG. */
static void write_photo(const char *stem, int c, int k, cf_rng *rng) {
    static const unsigned char colour[4][3] = {
        {200, 60, 60}, {60, 200, 60}, {200, 200, 60}, {60, 60, 200}};
    int w = 20 + (int)cf_rng_below(rng, 16), h = 20 + (int)cf_rng_below(rng, 16);
    unsigned char *px = malloc((size_t)w * h * 3);
    for (int i = 0; i < w * h * 3; i++)
        px[i] = (unsigned char)(colour[c][i % 3] / 2 + cf_rng_below(rng, 100));
    char path[800];
    snprintf(path, sizeof path, "%s.%s", stem, k % 2 ? "jpg" : "png");
    assert_true(k % 2 ? stbi_write_jpg(path, w, h, 3, px, 90)
                      : stbi_write_png(path, w, h, 3, px, w * 3));
    free(px);
}

/* root/{train,valid}/{cat,dog,fox,owl}/k.{png,jpg}: n_train and n_valid photos a class. */
static void write_photo_folder(const char *root, int n_train, int n_valid) {
    write_folder(root, photo_classes, 4, n_train, n_valid, 7, write_photo);
}

/* photos/ and photo.safetensors (a mini-resnet on 16 px RGB), made once. */
static void photo_model(void) {
    static bool made;
    if (made) return;
    char root[600];
    snprintf(root, sizeof root, "%s/photos", dir);
    write_photo_folder(root, 8, 3);
    run_result r = run("train --images photos --size 16 --cores 1 --bs 8 --out photo.safetensors "
                       "--quiet");
    expect(&r, 0, "model: photo.safetensors", NULL);
    run_free(&r);
    made = true;
}
#endif

/* #1: eval on a folder with only some of the model's classes (only valid/cat/, or a flat
 * folder with one class) gives the model's class count and names, not a crash. */
static void test_eval_some_classes(void **state) {
    (void)state;
#ifndef CF_HAVE_STB
    skip();
#else
    photo_model();
    shell("mkdir -p onlycat/valid flatdog && cp -r photos/valid/cat onlycat/valid/ && "
          "cp -r photos/valid/dog flatdog/");
    run_result r = run("eval photo.safetensors --images onlycat");
    expect(&r, 0, "samples: 3", NULL);
    run_free(&r);
    r = run("eval photo.safetensors --images flatdog --json");
    expect(&r, 0, "\"n\":\t3", NULL);
    run_free(&r);
#endif
}

/* #7: a JPEG given where a model is expected is said not to be a safetensors file. */
static void test_jpeg_as_model(void **state) {
    (void)state;
#ifndef CF_HAVE_STB
    skip();
#else
    photo_model();
    run_result r = run("predict photos/valid/cat/1.jpg photos/valid/cat/0.png");
    expect(&r, 1, NULL, "photos/valid/cat/1.jpg: not a safetensors file: it is a JPEG image");
    assert_null(strstr(r.err, "absurd"));
    run_free(&r);
    r = run("train --images photos --pretrained photos/valid/dog/0.png --cores 1");
    expect(&r, 1, NULL, "photos/valid/dog/0.png: not a safetensors file: it is a PNG image");
    run_free(&r);
#endif
}

/* The "normalize:" line of `corefit info path` (a copy, freed by the caller). */
static char *normalize_line(const char *path) {
    run_result r = run("info %s", path);
    expect(&r, 0, "normalize:   mean", NULL);
    const char *p = strstr(r.out, "normalize:");
    char *line = strndup(p, strcspn(p, "\n"));
    run_free(&r);
    return line;
}

/* #4, #5, #6: fine-tuning a pretrained model keeps its normalisation (fastai keeps the
 * pretrained statistics); --split-batch says what each worker gets; fine_tune's summary counts
 * the frozen epochs too. */
static void test_fine_tune_summary(void **state) {
    (void)state;
#ifndef CF_HAVE_STB
    skip();
#else
    photo_model();
    /* new data whose statistics differ: the photos darkened */
    shell("/usr/bin/python3 -c \"import glob,os\nfrom PIL import Image\nfor f in "
          "glob.glob('photos/*/*/*'):\n  d=os.path.join('dark',f[7:]); "
          "os.makedirs(os.path.dirname(d),exist_ok=True)\n  im=Image.open(f).point(lambda v: "
          "v//3); im.save(d)\"");
    run_result r = run("train --images dark --pretrained photo.safetensors --schedule fine-tune "
                       "--epochs 1 --freeze-epochs 1 --cores 2 --split-batch --bs 6 "
                       "--out dark.safetensors");
    expect(&r, 0, "(2 epochs: 1 frozen, 1 unfrozen, fork workers)", "each batch of 6 split across");
    assert_non_null(strstr(r.err, "(3 each)"));
    assert_null(strstr(r.err, "batch size 6 each"));
    run_free(&r);
    char *pre = normalize_line("photo.safetensors"), *tuned = normalize_line("dark.safetensors");
    assert_string_equal(pre, tuned);
    free(pre);
    free(tuned);
    /* a one-cycle fit of one epoch says one epoch */
    r = run("train --images dark --size 16 --cores 1 --bs 8 --out dark1.safetensors --quiet");
    expect(&r, 0, "(1 epoch, in-process)", NULL);
    run_free(&r);
#endif
}

/* #8: predict goes on past files it cannot read (named on stderr, exit 1 at the end), and class
 * names holding a tab or a newline are escaped in its tab-separated output. */
static void test_predict_bad_files_and_odd_names(void **state) {
    (void)state;
#ifndef CF_HAVE_STB
    skip();
#else
    photo_model();
    shell("cp -r photos odd && /usr/bin/python3 -c \"import os\nfor p in "
          "('train','valid'):\n  os.rename('odd/%s/cat'%p, 'odd/%s/big\\tcat'%p); "
          "os.rename('odd/%s/dog'%p, 'odd/%s/hot\\ndog'%p)\" && echo garbage > bad.jpg");
    run_result r =
        run("train --images odd --size 16 --cores 1 --bs 8 --out odd.safetensors --quiet");
    expect(&r, 0, "model: odd.safetensors", NULL);
    run_free(&r);
    r = run("predict odd.safetensors photos/valid/fox/0.png bad.jpg missing.png "
            "photos/valid/owl/1.jpg --top 4");
    expect(&r, 1, "photos/valid/fox/0.png\t", "bad.jpg: not an image");
    assert_non_null(strstr(r.err, "missing.png"));
    assert_non_null(strstr(r.err, "2 of 4 image files could not be predicted"));
    /* both readable files, one line each, every class named once a line */
    const char *second = strchr(r.out, '\n');
    assert_non_null(second);
    assert_true(strncmp(second + 1, "photos/valid/owl/1.jpg\t", 23) == 0);
    assert_non_null(strchr(second + 1, '\n'));
    assert_string_equal(strchr(second + 1, '\n'), "\n");
    for (const char *line = r.out; *line; line = strchr(line, '\n') + 1) {
        char one[512];
        snprintf(one, sizeof one, "%.*s", (int)strcspn(line, "\n"), line);
        assert_non_null(strstr(one, "\tbig\\tcat\t"));
        assert_non_null(strstr(one, "\thot\\ndog\t"));
        int tabs = 0;
        for (const char *c = one; *c; c++) tabs += *c == '\t';
        assert_int_equal(tabs, 8); /* input, then 4 x (class, probability) */
    }
    run_free(&r);
#endif
}

/* #3: --limit on an image folder takes a seeded sample stratified by class, not the first N
 * files (which are all cats), and says so. */
static void test_limit_stratified(void **state) {
    (void)state;
#ifndef CF_HAVE_STB
    skip();
#else
    photo_model();
    run_result r = run("train --images photos --size 16 --limit 8 --bs 4 --cores 1 "
                       "--out limit.safetensors");
    expect(&r, 0, "model: limit.safetensors",
           "stratified by class (--seed 42): cat 2, dog 2, fox 2, owl 2");
    run_free(&r);
    /* 10 of 32: each class its share (2.5) rounded by largest remainder */
    r = run("train --images photos --size 16 --limit 10 --bs 4 --cores 1 --seed 3 "
            "--out limit.safetensors");
    expect(&r, 0, "model: limit.safetensors", "a random sample of 10 training and 2 validation");
    const char *counts = strstr(r.err, "(--seed 3): ");
    assert_non_null(counts);
    int n[4];
    assert_int_equal(
        sscanf(counts, "(--seed 3): cat %d, dog %d, fox %d, owl %d", &n[0], &n[1], &n[2], &n[3]),
        4);
    for (int c = 0; c < 4; c++) assert_true(n[c] == 2 || n[c] == 3);
    assert_int_equal(n[0] + n[1] + n[2] + n[3], 10);
    run_free(&r);
#endif
}

/* #2: --skip-bad leaves out unreadable images with the default load too, and says how many. */
static void test_skip_bad(void **state) {
    (void)state;
#ifndef CF_HAVE_STB
    skip();
#else
    photo_model();
    shell("cp -r photos badphotos && head -c 300 photos/train/cat/1.jpg > "
          "badphotos/train/cat/cut.jpg && echo garbage > badphotos/valid/dog/bad.png");
    static const char *const loads[] = {"", "--load auto", "--load stream"};
    for (int i = 0; i < 3; i++) {
        run_result r = run("train --images badphotos --size 16 --skip-bad %s --cores 2 --bs 4 "
                           "--out skip.safetensors",
                           loads[i]);
        expect(&r, 0, "model: skip.safetensors",
               "skip-bad: left out 1 of 33 training images that cannot be read");
        assert_non_null(strstr(r.err, "badphotos/train/cat/cut.jpg: corrupt or truncated JPEG"));
        assert_non_null(strstr(r.err, "left out 1 of 13 validation images"));
        assert_non_null(strstr(r.err, "data: 32 training and 12 validation samples"));
        run_free(&r);
    }
    run_result r = run("train --images badphotos --skip-bad --load memory");
    expect(&r, 2, NULL, "give --load stream or auto with it");
    run_free(&r);
#endif
}

/* #9: --load auto (the default) streams an image folder that would fit in memory: measured
 * faster (docs/cli.md); --load memory still decodes it up front. */
static void test_load_auto_streams(void **state) {
    (void)state;
#ifndef CF_HAVE_STB
    skip();
#else
    photo_model();
    static const char *const loads[] = {"", "--load auto", "--load stream"};
    for (int i = 0; i < 3; i++) {
        run_result r = run("train --images photos --size 16 %s --cores 1 --bs 8 "
                           "--out auto.safetensors",
                           loads[i]);
        expect(&r, 0, "model: auto.safetensors",
               "data: 32 training and 12 validation samples, streamed from their files");
        run_free(&r);
    }
    run_result r = run("train --images photos --size 16 --load memory --cores 1 --bs 8 "
                       "--out auto.safetensors");
    expect(&r, 0, "model: auto.safetensors",
           "data: 32 training and 12 validation samples, decoded into memory");
    run_free(&r);
#endif
}

/* ---- --max-restarts: a worker SIGKILLed mid-fit --------------------------------------------
 * With --max-restarts the workers are restarted from the last commit and the model file has the
 * bytes of an undisturbed run; without it the same fault fails cleanly (exit 1, no model, no
 * worker or commit left) and says how to continue from the checkpoint, which also gives those
 * bytes. The fault: SIGKILL to one of corefit's worker processes once the first checkpoint (after
 * batch 3 of 80) exists. */

#define RESTART_ARGS "train --limit 1280 --bs 16 --epochs 2 --cores 2 --checkpoint-every 3"

/* The processes whose parent is `parent` (its fork workers), from /proc. */
static int children_of(pid_t parent, pid_t *out, int cap) {
    DIR *d = opendir("/proc");
    assert_non_null(d);
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)) && n < cap) {
        char *end;
        long pid = strtol(e->d_name, &end, 10);
        if (*end || pid <= 0) continue;
        char path[64], line[512];
        snprintf(path, sizeof path, "/proc/%ld/stat", pid);
        FILE *f = fopen(path, "r");
        if (!f) continue;
        size_t k = fread(line, 1, sizeof line - 1, f);
        fclose(f);
        line[k] = '\0';
        const char *rp = strrchr(line, ')'); /* the command name may hold spaces */
        char state;
        long ppid;
        if (rp && sscanf(rp + 1, " %c %ld", &state, &ppid) == 2 && ppid == parent && state != 'Z')
            out[n++] = (pid_t)pid;
    }
    closedir(d);
    return n;
}

/* Once the checkpoint exists (liveness: however long that takes), SIGKILLs one worker of the
 * running corefit. Returns the workers seen then. */
static int kill_a_worker(pid_t pid, const char *ckpt, pid_t *workers, int cap) {
    struct stat sb;
    char path[600];
    snprintf(path, sizeof path, "%s/%s", dir, ckpt);
    int n = 0;
    for (;;) {
        if (stat(path, &sb) == 0 && (n = children_of(pid, workers, cap)) >= 2) break;
        int status;
        if (waitpid(pid, &status, WNOHANG) == pid) fail_msg("corefit ended before %s", ckpt);
        usleep(2000);
    }
    pid_t victim = workers[(unsigned)time(NULL) % (unsigned)n];
    print_message("SIGKILL to worker pid %d of %d workers\n", (int)victim, n);
    assert_int_equal(kill(victim, SIGKILL), 0);
    return n;
}

/* Every worker gone, and no commit directory of this corefit in shared memory. */
static void assert_workers_gone(pid_t pid, const pid_t *workers, int n) {
    for (int i = 0; i < n; i++)
        if (kill(workers[i], 0) == 0 || errno != ESRCH)
            fail_msg("worker pid %d is still there", (int)workers[i]);
    char mine[64];
    snprintf(mine, sizeof mine, "corefit-commit-%ld-", (long)pid);
    DIR *d = opendir("/dev/shm");
    struct dirent *e;
    while (d && (e = readdir(d)))
        if (!strncmp(e->d_name, mine, strlen(mine))) fail_msg("/dev/shm/%s is left", e->d_name);
    if (d) closedir(d);
}

static void assert_same_file(const char *a, const char *b) {
    char pa[600], pb[600];
    snprintf(pa, sizeof pa, "%s/%s", dir, a);
    snprintf(pb, sizeof pb, "%s/%s", dir, b);
    void *da = NULL, *db = NULL;
    size_t na = 0, nb = 0;
    assert_int_equal(cf_read_file(pa, (size_t)1 << 30, &da, &na), CF_OK);
    assert_int_equal(cf_read_file(pb, (size_t)1 << 30, &db, &nb), CF_OK);
    if (na != nb || memcmp(da, db, na))
        fail_msg("%s differs from %s (%zu, %zu bytes)", b, a, na, nb);
    cf_free(da);
    cf_free(db);
}

static void test_max_restarts(void **state) {
    (void)state;
    run_result r = run(RESTART_ARGS " --quiet --out undisturbed.safetensors");
    expect(&r, 0, "model: undisturbed.safetensors", NULL);
    run_free(&r);

    /* the worker is restarted from a commit (every 2 batches) and the fit finishes */
    pid_t workers[8];
    pid_t pid = test_cli_start(dir,
                               RESTART_ARGS " --max-restarts 1 --commit-every 2 --out "
                                            "restarted.safetensors",
                               false);
    int n = kill_a_worker(pid, "restarted.ckpt", workers, 8);
    r = run_outcome(test_cli_wait(pid));
    expect(&r, 0, "(2 epochs, fork workers, 1 restart)", "was killed by signal 9 (SIGKILL)");
    if (!strstr(r.err, "restarting 2 workers from epoch 0 batch") ||
        !strstr(r.err, "(restart 1 of 1)"))
        fail_msg("no restart from a commit reported: %s", r.err);
    run_free(&r);
    assert_same_file("undisturbed.safetensors", "restarted.safetensors");
    assert_workers_gone(pid, workers, n);

    /* without --max-restarts: a clean failure, and the command that continues */
    pid = test_cli_start(dir, RESTART_ARGS " --out lost.safetensors", false);
    n = kill_a_worker(pid, "lost.ckpt", workers, 8);
    r = run_outcome(test_cli_wait(pid));
    expect(&r, 1, NULL, "corefit train: training: worker ");
    assert_non_null(strstr(r.err, "was killed by signal 9 (SIGKILL)"));
    assert_non_null(strstr(r.err, "no model written"));
    assert_workers_gone(pid, workers, n);
    char path[600];
    snprintf(path, sizeof path, "%s/lost.safetensors", dir);
    assert_false(file_exists(path));
    const char *hint = strstr(r.err, "  corefit ");
    if (!hint || !strstr(hint, "--resume ./lost.ckpt")) fail_msg("no resume hint: %s", r.err);
    char again[1024];
    snprintf(again, sizeof again, "%.*s", (int)strcspn(hint + 10, "\n"), hint + 10);
    run_free(&r);
    r = run("%s", again);
    expect(&r, 0, "model: lost.safetensors", NULL);
    run_free(&r);
    assert_same_file("undisturbed.safetensors", "lost.safetensors");
}

static int setup(void **state) {
    (void)state;
    test_tmpdir_make(dir, sizeof dir, "cf_cli_");
    return 0;
}

static int teardown(void **state) {
    (void)state;
    return test_tmpdir_remove(dir);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_usage_errors),
        cmocka_unit_test(test_help),
        cmocka_unit_test(test_train_eval_info),
        cmocka_unit_test(test_predict_matches_get_preds),
        cmocka_unit_test(test_lr_find),
        cmocka_unit_test(test_tabular),
        cmocka_unit_test(test_fine_tune_image_folder),
        cmocka_unit_test(test_library_export),
        cmocka_unit_test(test_library_export_tabular),
        cmocka_unit_test(test_eval_flat_folder),
        cmocka_unit_test(test_cores_warning),
        cmocka_unit_test(test_lr_find_plots_dir),
        cmocka_unit_test(test_diverged_fit_fails),
        cmocka_unit_test(test_interrupt),
        cmocka_unit_test(test_csv_log_replaced_only_by_a_log),
        cmocka_unit_test(test_absurd_image_size),
        cmocka_unit_test(test_unwritable_out_fails_first),
        cmocka_unit_test(test_quiet_keeps_table),
        cmocka_unit_test(test_regression),
        cmocka_unit_test(test_csv_limit_bounds_what_is_read),
        cmocka_unit_test(test_out_folder),
        cmocka_unit_test(test_max_restarts),
        cmocka_unit_test(test_eval_some_classes),
        cmocka_unit_test(test_jpeg_as_model),
        cmocka_unit_test(test_fine_tune_summary),
        cmocka_unit_test(test_predict_bad_files_and_odd_names),
        cmocka_unit_test(test_limit_stratified),
        cmocka_unit_test(test_skip_bad),
        cmocka_unit_test(test_load_auto_streams),
    };
    /* CF_TEST_FILTER=test_interrupt (a cmocka pattern): run only those, e.g. again and again */
    if (getenv("CF_TEST_FILTER")) cmocka_set_test_filter(getenv("CF_TEST_FILTER"));
    return cmocka_run_group_tests(tests, setup, teardown);
}
