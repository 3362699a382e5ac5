/* corefit's text commands on a slice of Debian's fortunes: a language model (train --text --lm),
 * a classifier from its encoder with the ULMFiT schedule, predict --text and on a text file,
 * generate, info; and bad input (a classifier file given to generate, an image option mix). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>

#include <cmocka.h>

#include "child.h"
#include "corefit/core.h"
#include "oracle.h"
#include "text_fixture.h"

#define COREFIT CF_BUILD_DIR "/corefit"

static char g_dir[256];

/* Runs a shell command in g_dir; its output (stdout and stderr) into out; the exit status. */
#define run(out, size, ...) test_shell(g_dir, out, size, __VA_ARGS__)

static void test_lm_encoder_classifier_predict(void **state) {
    (void)state;
    if (!have_fortunes()) skip();
    test_tmpdir_make(g_dir, sizeof g_dir, "cf_cli_text");
    static char out[1 << 16];
    char data[300];
    snprintf(data, sizeof data, "%s/f", g_dir);
    assert_int_equal(fortunes_folder(data, 40), 0);
    const char *small = "--emb-sz 16 --n-hid 24 --n-layers 2 --bs 8 --seq-len 16";
    /* 1. the language model */
    assert_int_equal(run(out, sizeof out,
                         COREFIT " train --text f --lm %s --min-freq 2 --epochs 1 --cores 2 "
                                 "--out lm.safetensors",
                         small),
                     0);
    assert_non_null(strstr(out, "perplexity"));
    assert_non_null(strstr(out, "saved lm.safetensors (language model"));
    assert_int_equal(run(out, sizeof out, "test -d f_tok && ls f_tok | wc -l"), 0);
    assert_int_equal(atoi(out), 120); /* fastai's Tokenizer.from_folder cache: one copy a file */
    /* 2. the classifier from its encoder, gradual unfreezing: four fits */
    assert_int_equal(run(out, sizeof out,
                         COREFIT " train --text f --encoder lm.safetensors --schedule ulmfit "
                                 "--epochs 1 --bs 8 --seq-len 16 --cores 2 --out clas.safetensors"),
                     0);
    int fits = 0;
    for (const char *p = out; (p = strstr(p, "train_loss")); p++) fits++;
    assert_int_equal(fits, 4);
    assert_non_null(strstr(out, "3 classes"));
    /* the classifier took the language model's vocabulary */
    char lm_words[64], clas_words[64];
    assert_int_equal(run(out, sizeof out, COREFIT " info lm.safetensors"), 0);
    assert_non_null(strstr(out, "arch:        awd_lstm_lm"));
    const char *w = strstr(out, "a vocabulary of ");
    assert_non_null(w);
    snprintf(lm_words, sizeof lm_words, "%.*s", (int)strcspn(w, "("), w);
    assert_int_equal(run(out, sizeof out, COREFIT " info clas.safetensors"), 0);
    assert_non_null(strstr(out, "arch:        awd_lstm_clas"));
    assert_non_null(strstr(out, "classes:     food, love, science"));
    w = strstr(out, "a vocabulary of ");
    assert_non_null(w);
    snprintf(clas_words, sizeof clas_words, "%.*s", (int)strcspn(w, "("), w);
    assert_string_equal(lm_words, clas_words);
    /* 3. predict on raw text and on a file */
    assert_int_equal(run(out, sizeof out,
                         COREFIT " predict clas.safetensors --text \"I LOVE a good dinner!\" "
                                 "--json"),
                     0);
    assert_non_null(strstr(out, "\"class\": "));
    assert_non_null(strstr(out, "\"probs\": ["));
    assert_int_equal(run(out, sizeof out,
                         "printf 'Eat, drink and be merry.\\n' > t.txt && " COREFIT
                         " predict clas.safetensors t.txt --top 3"),
                     0);
    assert_non_null(strstr(out, "t.txt: "));
    assert_true(strstr(out, "food") && strstr(out, "love") && strstr(out, "science"));
    /* a text of unknown words: a prediction and a warning, not a failure */
    assert_int_equal(run(out, sizeof out, COREFIT " predict clas.safetensors --text \"zzqx qqzz\""),
                     0);
    assert_non_null(strstr(out, "2 tokens not in the vocabulary"));
    /* 4. generate: the prompt decoded, then the words */
    assert_int_equal(run(out, sizeof out,
                         COREFIT " generate lm.safetensors \"The food\" --words 8 "
                                 "--temperature 0.7 --seed 3"),
                     0);
    assert_true(strncmp(out, "The food ", 9) == 0);
    assert_null(strstr(out, "xxbos"));
    /* the same seed draws the same words */
    static char again[1 << 16];
    assert_int_equal(run(again, sizeof again,
                         COREFIT " generate lm.safetensors \"The food\" --words 8 "
                                 "--temperature 0.7 --seed 3"),
                     0);
    assert_string_equal(out, again);
    /* bad input: the wrong kind of model, a classifier without labels in the CSV */
    assert_int_equal(run(out, sizeof out, COREFIT " generate clas.safetensors \"x\""), 2);
    assert_non_null(strstr(out, "not a language model"));
    assert_int_equal(run(out, sizeof out, COREFIT " predict lm.safetensors --text \"x\""), 2);
    assert_non_null(strstr(out, "not a text classifier"));
    assert_int_equal(run(out, sizeof out,
                         "printf 'text,label\\nhello there,a\\n' > t.csv && " COREFIT
                         " train --text t.csv --label-col topic %s",
                         small),
                     1);
    assert_non_null(strstr(out, "topic"));
    assert_int_equal(run(out, sizeof out, COREFIT " train --text f --lm --schedule ulmfit"), 2);
    test_tmpdir_remove(g_dir);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_lm_encoder_classifier_predict),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
