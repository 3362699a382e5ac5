/* corefit train --recipe: `fast` trains the very model its options spelled out train (byte for
 * byte: --arch fast-cnn --epochs 4 --small-epochs 1 --bs 64 --lr 1e-2 --label-smoothing 0.1
 * --bf16 --checkpoint-every 0 --valid-every 4) and validates only after its last epoch, an option
 * given on the command line wins over the recipe's (and --bs rescales the recipe's learning rate),
 * and an unknown name is a usage error naming it. On the first samples of Fashion-MNIST (--limit),
 * one thread, so that each fit takes a second or two. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <math.h>

#include "child.h"
#include "oracle.h"

#define COREFIT CF_BUILD_DIR "/corefit"
#define FIT COREFIT " train --limit 256 --cores 1 --threads 1 --seed 3 --quiet"
/* the recipe spelled out */
#define FAST                                                                                       \
    " --arch fast-cnn --epochs 4 --small-epochs 1 --bs 64 --lr 1e-2 --label-smoothing 0.1 --bf16"

static char g_dir[256];
static char out[1 << 16];

#define run(...) test_shell(g_dir, out, sizeof out, __VA_ARGS__)

static int setup(void **state) {
    (void)state;
    test_tmpdir_make(g_dir, sizeof g_dir, "cf_cli_recipe_");
    return 0;
}

static int teardown(void **state) {
    (void)state;
    return test_tmpdir_remove(g_dir);
}

/* Rows of a CSV log after its header. */
static int log_rows(const char *file) {
    if (run("tail -n +2 %s | wc -l", file) != 0) return -1;
    return atoi(out);
}

static void test_fast_is_its_options(void **state) {
    (void)state;
    if (run(FIT " --recipe fast --out fast.st --csv-log fast.csv") != 0) {
        print_message("%s", out);
        if (strstr(out, "fashion-mnist") || strstr(out, "No such file")) skip();
        fail();
    }
    assert_null(strstr(out, "tta:")); /* no flips, so no flip TTA */
    assert_non_null(strstr(out, "result: "));
    assert_null(strstr(out, "accuracy nan")); /* validated after the last epoch */
    assert_int_equal(log_rows("fast.csv"), 4);
    /* the epochs before it skip validation (--valid-every 4): nan in the log */
    assert_int_equal(run("sed -n 2,4p fast.csv | cut -d, -f3,4 | sort -u"), 0);
    assert_string_equal(out, "nan,nan\n");
    assert_int_equal(run(FIT FAST " --checkpoint-every 0 --valid-every 4 --out spelled.st"), 0);
    assert_int_equal(run("cmp fast.st spelled.st"), 0);
    /* the recipe changes the fit: each option of it changes the model */
    assert_int_equal(run(FIT
                         " --arch fast-cnn --epochs 4 --small-epochs 1 --bs 64 --lr 1e-2 --bf16 "
                         "--out plain.st"),
                     0);
    assert_int_not_equal(run("cmp -s fast.st plain.st"), 0);
    assert_int_equal(run(FIT " --arch fast-cnn --epochs 4 --small-epochs 1 --bs 64 "
                             "--label-smoothing 0.1 --bf16 --out lr.st"),
                     0);
    assert_int_not_equal(run("cmp -s fast.st lr.st"), 0);
    assert_int_equal(run(FIT " --arch fast-cnn --epochs 4 --bs 64 --lr 1e-2 --label-smoothing 0.1 "
                             "--bf16 --out big.st"),
                     0);
    assert_int_not_equal(run("cmp -s fast.st big.st"), 0);
    /* --bf16 where the kernels compute in bf16; elsewhere it is fp32's fit */
    assert_int_equal(run(COREFIT " info"), 0);
    const bool bf16 = strstr(out, "kernels: avx512_bf16") || strstr(out, "kernels: amx");
    assert_int_equal(run(FIT " --arch fast-cnn --epochs 4 --small-epochs 1 --bs 64 --lr 1e-2 "
                             "--label-smoothing 0.1 --out fp32.st"),
                     0);
    if (bf16)
        assert_int_not_equal(run("cmp -s fast.st fp32.st"), 0);
    else
        assert_int_equal(run("cmp fast.st fp32.st"), 0);
    /* the model file records the recipe's architecture, and eval rebuilds it */
    assert_int_equal(run("head -c 4096 fast.st | grep -ao '\"corefit.arch\":\"[a-z-]*\"'"), 0);
    assert_non_null(strstr(out, "\"corefit.arch\":\"fast-cnn\""));
    assert_int_equal(run(COREFIT " eval fast.st --limit 256"), 0);
}

static void test_command_line_wins(void **state) {
    (void)state;
    if (run(FIT " --recipe fast --epochs 1 --out one.st --csv-log one.csv") != 0) {
        print_message("%s", out);
        if (strstr(out, "fashion-mnist") || strstr(out, "No such file")) skip();
        fail();
    }
    assert_int_equal(log_rows("one.csv"), 1);
    assert_int_equal(
        run(FIT " --arch fast-cnn --epochs 1 --small-epochs 1 --bs 64 --lr 1e-2 --label-smoothing "
                "0.1 --bf16 --out o.st"),
        0);
    assert_int_equal(run("cmp one.st o.st"), 0);
    /* --bs 128: the recipe's learning rate scales with it (2e-2) */
    assert_int_equal(run(FIT " --recipe fast --epochs 1 --bs 128 --out b128.st"), 0);
    assert_int_equal(run(FIT " --arch fast-cnn --epochs 1 --small-epochs 1 --bs 128 --lr 2e-2 "
                             "--label-smoothing 0.1 --bf16 --out s128.st"),
                     0);
    assert_int_equal(run("cmp b128.st s128.st"), 0);
    /* an explicit --label-smoothing 0 is kept */
    assert_int_equal(run(FIT " --recipe fast --epochs 1 --label-smoothing 0 --out ls0.st"), 0);
    assert_int_equal(run(FIT
                         " --arch fast-cnn --epochs 1 --small-epochs 1 --bs 64 --lr 1e-2 --bf16 "
                         "--out p0.st"),
                     0);
    assert_int_equal(run("cmp ls0.st p0.st"), 0);
    /* so is another --arch */
    assert_int_equal(run(FIT " --recipe fast --epochs 1 --arch mini-resnet --out mr.st"), 0);
    assert_int_equal(run(FIT " --arch mini-resnet --epochs 1 --small-epochs 1 --bs 64 --lr 1e-2 "
                             "--label-smoothing 0.1 --bf16 --out smr.st"),
                     0);
    assert_int_equal(run("cmp mr.st smr.st"), 0);
    /* and --valid-every: every epoch of the recipe validated, the same model */
    assert_int_equal(run(FIT " --recipe fast --valid-every 1 --out v1.st --csv-log v1.csv"), 0);
    assert_int_equal(run("cut -d, -f3 v1.csv | grep -c nan"), 1); /* grep -c: 0 found, status 1 */
    assert_string_equal(out, "0\n");
    assert_int_equal(run("cmp v1.st fast.st"), 0);
    /* --tta with the recipe: no validation in the fit, the TTA pass measures */
    assert_int_equal(run(FIT " --recipe fast --epochs 1 --tta --out t.st --csv-log t.csv"), 0);
    assert_non_null(strstr(out, "tta: accuracy "));
    assert_int_equal(run("cmp t.st one.st"), 0);
    assert_int_equal(run("cut -d, -f3 t.csv | tail -n +2"), 0);
    assert_string_equal(out, "nan\n");
}

/* The value after `key` in out, from `from` on (-1 when missing). */
static double value_after(const char *from, const char *key) {
    const char *p = strstr(out, from);
    if (p) p = strstr(p, key);
    return p ? atof(p + strlen(key)) : -1;
}

/* --flip changes the fit (and is refused beside --aug, which flips already, and for tables);
 * --tta leaves the model as it is and reports the accuracy of the plain and mirrored images'
 * averaged probabilities, as PyTorch computes it from the same model file
 * (tests/oracle/tta_flip.py, with bench/fast_torch.py's model), and the plain accuracy too. */
#define TWO " --arch fast-cnn --epochs 2 --bs 64 --lr 1e-2 --label-smoothing 0.1"
static void test_flip_and_tta(void **state) {
    (void)state;
    if (run(FIT TWO " --flip --tta --out tta.st") != 0) {
        print_message("%s", out);
        if (strstr(out, "fashion-mnist") || strstr(out, "No such file")) skip();
        fail();
    }
    double plain = value_after("result:", " accuracy "),
           tta = value_after("tta:", "tta: accuracy ");
    assert_true(plain >= 0 && plain <= 1);
    assert_true(tta >= 0 && tta <= 1);
    assert_int_equal(run(FIT TWO " --flip --out flip.st"), 0);
    assert_int_equal(run("cmp tta.st flip.st"), 0);
    assert_null(strstr(out, "tta:"));
    assert_int_equal(run(FIT TWO " --out noflip.st"), 0);
    assert_int_not_equal(run("cmp -s flip.st noflip.st"), 0);
    int rc = run("/usr/bin/python3 " CF_SOURCE_DIR "/tests/oracle/tta_flip.py tta.st "
                 "/usr/share/datasets/fashion-mnist 51");
    if (rc != 0) print_message("%s", out);
    assert_int_equal(rc, 0);
    assert_true(fabs(value_after("plain ", "plain ") - plain) < 1e-4);
    assert_true(fabs(value_after("tta ", "tta ") - tta) < 1e-4);

    assert_int_equal(run(FIT " --flip --aug --epochs 1 --out x.st"), 2);
    assert_non_null(strstr(out, "--flip with --aug"));
    assert_int_equal(run("printf 'a,y\\n1,0\\n2,1\\n' > t.csv && " COREFIT
                         " train --csv t.csv --cont a --target y --flip --quiet"),
                     2);
    assert_non_null(strstr(out, "--flip is for images"));
}

/* --valid-every N: validation after every N-th epoch and the last (nan in the CSV log's other
 * rows), none with 0; the model is the one validated every epoch, byte for byte (validation
 * changes no weight, buffer or draw). Out of range is a usage error naming the option. */
static void test_valid_every(void **state) {
    (void)state;
    const char *three = FIT " --arch fast-cnn --epochs 3 --bs 64 --lr 1e-2";
    if (run("%s --out v1.st --csv-log v1.csv", three) != 0) {
        print_message("%s", out);
        if (strstr(out, "fashion-mnist") || strstr(out, "No such file")) skip();
        fail();
    }
    assert_int_equal(run("%s --valid-every 2 --out v2.st --csv-log v2.csv", three), 0);
    assert_int_equal(run("cmp v1.st v2.st"), 0);
    /* epoch,train_loss,valid_loss,accuracy,time: epoch 0 skipped, 1 (the 2nd) and 2 (the last) run
     */
    assert_int_equal(run("cut -d, -f3,4 v2.csv | tail -n +2 | tr '\\n' ' '"), 0);
    double v1 = -1, a1 = -1, v2 = -1, a2 = -1;
    char first[64] = "";
    assert_int_equal(sscanf(out, "%63s %lf,%lf %lf,%lf", first, &v1, &a1, &v2, &a2), 5);
    assert_string_equal(first, "nan,nan");
    assert_true(v1 > 0 && a1 > 0 && a1 <= 1 && v2 > 0 && a2 > 0 && a2 <= 1);
    /* the same rows as the run validated every epoch, where they ran */
    assert_int_equal(run("tail -n +3 v1.csv | cut -d, -f3,4 > a.txt && tail -n +3 v2.csv | cut "
                         "-d, -f3,4 > b.txt && cmp a.txt b.txt"),
                     0);
    assert_int_equal(run("%s --valid-every 0 --out v0.st --csv-log v0.csv", three), 0);
    assert_int_equal(run("cmp v1.st v0.st"), 0);
    assert_int_equal(run("cut -d, -f3,4 v0.csv | tail -n +2 | sort -u"), 0);
    assert_string_equal(out, "nan,nan\n");
    assert_int_equal(run("%s --valid-every -1", three), 2);
    assert_non_null(strstr(out, "--valid-every"));
}

/* An IDX image file of n side x side images at dir/name, each pixel the byte of the image's
 * 14 x 14 pattern at (row * 14 / side, column * 14 / side): at side 28 every 2x2 block holds one
 * value, at side 14 that value once. */
static void write_images(const char *name, int n, int side) {
    char path[512];
    snprintf(path, sizeof path, "%s/%s", g_dir, name);
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    const unsigned char head[16] = {
        0, 0, 8, 3, 0, 0, 0, 0, 0, 0, 0, (unsigned char)side, 0, 0, 0, (unsigned char)side};
    unsigned char h[16];
    memcpy(h, head, 16);
    h[4] = (unsigned char)(n >> 24), h[5] = (unsigned char)(n >> 16);
    h[6] = (unsigned char)(n >> 8), h[7] = (unsigned char)n;
    fwrite(h, 1, 16, f);
    for (int i = 0; i < n; i++)
        for (int r = 0; r < side; r++)
            for (int c = 0; c < side; c++) {
                const int pr = r * 14 / side, pc = c * 14 / side;
                /* a bright blob whose place depends on the label (i % 10), and some texture */
                const int lab = i % 10, cr = 3 + lab % 5 * 2, cc = 3 + lab / 5 * 6;
                const int d2 = (pr - cr) * (pr - cr) + (pc - cc) * (pc - cc);
                fputc(d2 < 6 ? 220 : (unsigned char)((pr * 31 + pc * 17 + i * 7) % 60), f);
            }
    fclose(f);
}

static void write_labels(const char *name, int n) {
    char path[512];
    snprintf(path, sizeof path, "%s/%s", g_dir, name);
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    const unsigned char h[8] = {0,
                                0,
                                8,
                                1,
                                (unsigned char)(n >> 24),
                                (unsigned char)(n >> 16),
                                (unsigned char)(n >> 8),
                                (unsigned char)n};
    fwrite(h, 1, 8, f);
    for (int i = 0; i < n; i++) fputc(i % 10, f);
    fclose(f);
}

/* --small-epochs K trains the first K epochs on the images at half size, 2x2 averages: on 28 px
 * images made of 2x2 blocks of one value, a fit whose epochs are all small ends with the weights
 * of the same fit on the 14 px images (the averages), flips included; the full-size epochs after
 * them change the model; only training batches are halved (the TTA pass sees 28 px images and
 * the model is exported for them). */
static void test_small_epochs(void **state) {
    (void)state;
    assert_int_equal(run("mkdir -p big small"), 0);
    write_images("big/train-images-idx3-ubyte", 320, 28);
    write_images("big/t10k-images-idx3-ubyte", 60, 28);
    write_images("small/train-images-idx3-ubyte", 320, 14);
    write_images("small/t10k-images-idx3-ubyte", 60, 14);
    write_labels("big/train-labels-idx1-ubyte", 320);
    write_labels("big/t10k-labels-idx1-ubyte", 60);
    write_labels("small/train-labels-idx1-ubyte", 320);
    write_labels("small/t10k-labels-idx1-ubyte", 60);
    const char *fit = COREFIT " train --cores 1 --threads 1 --seed 5 --quiet --arch fast-cnn --bs "
                              "32 --lr 1e-2 --flip --valid-every 0 --checkpoint-every 0";
    if (run("%s --idx big --epochs 1 --small-epochs 1 --tta --out halved.st", fit) != 0) {
        print_message("%s", out);
        fail();
    }
    assert_non_null(strstr(out, "tta: accuracy "));
    assert_int_equal(run("%s --idx small --epochs 1 --out small.st", fit), 0);
    assert_int_equal(run("%s --idx big --epochs 2 --small-epochs 1 --out mixed.st", fit), 0);
    assert_int_equal(run("%s --idx big --epochs 1 --out full.st", fit), 0);
    /* the weights, tensor by tensor, the largest difference against the tensor's largest value:
     * equal to float rounding (the normalisation statistics of the two image sizes are summed in
     * another order), far from the full-size fit's */
    const char *cmp =
        "/usr/bin/python3 -c \"import sys, json, struct\n"
        "def load(p):\n"
        "  b = open(p, 'rb').read(); n = struct.unpack('<Q', b[:8])[0]\n"
        "  h = json.loads(b[8:8 + n]); h.pop('__metadata__', None)\n"
        "  return {k: struct.unpack('<%%df' %% ((v['data_offsets'][1] - "
        "v['data_offsets'][0]) // 4), b[8 + n + v['data_offsets'][0]:8 + n + "
        "v['data_offsets'][1]]) for k, v in h.items() if v['dtype'] == 'F32'}\n"
        "a, b = load(sys.argv[1]), load(sys.argv[2])\n"
        "assert a.keys() == b.keys() and a\n"
        "print(max(max(abs(x - y) for x, y in zip(a[k], b[k])) / max(1e-6, max(map(abs, "
        "b[k]))) for k in a))\" %s %s";
    assert_int_equal(run(cmp, "halved.st", "small.st"), 0);
    assert_true(atof(out) < 1e-3);
    assert_int_equal(run(cmp, "halved.st", "full.st"), 0);
    assert_true(atof(out) > 1e-2);
    assert_int_equal(run(cmp, "halved.st", "mixed.st"), 0);
    assert_true(atof(out) > 1e-2);
    /* tables have no images to halve */
    assert_int_equal(run("printf 'a,y\\n1,0\\n2,1\\n' > s.csv && " COREFIT
                         " train --csv s.csv --cont a --target y --small-epochs 1 --quiet"),
                     2);
    assert_non_null(strstr(out, "--small-epochs is for images"));
}

static void test_unknown_recipe(void **state) {
    (void)state;
    assert_int_equal(run(COREFIT " train --recipe slow --epochs 1"), 2);
    assert_non_null(strstr(out, "unknown --recipe 'slow'"));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fast_is_its_options), cmocka_unit_test(test_command_line_wins),
        cmocka_unit_test(test_flip_and_tta),        cmocka_unit_test(test_valid_every),
        cmocka_unit_test(test_small_epochs),        cmocka_unit_test(test_unknown_recipe),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
