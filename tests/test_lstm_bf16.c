/* Mixed precision for the recurrent text models (cf_lstm_set_bf16, called by cf_learner_to_bf16):
 * the LSTM's forward and backward over several sizes with the state carried, against PyTorch
 * computing the same in float64 with bf16-rounded operands (tests/oracle/lstm_bf16.py); to_fp32
 * gives fp32 results back bit for bit; to_bf16 switches the LSTMs and the tied decoder of a
 * language model; a bf16 language-model fit on 2 fork workers with split batches stays close to
 * one process. ctest runs it at the best level and capped at avx512 and avx2, where there are no
 * bf16 kernels and to_bf16 changes nothing (the results then equal fp32's to 1e-4). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "corefit/learn.h"
#include "corefit/par.h"
#include "counting_corpus.h"
#include "nn/rnn_internal.h"
#include "oracle.h"
#include "text_fixture.h"

/* max |a - b| and max |b| */
static void diff_scale(const float *a, const float *b, size_t n, double *diff, double *scale) {
    double d = 0, s = 0;
    for (size_t i = 0; i < n; i++) {
        d = fmax(d, fabs((double)a[i] - b[i]));
        s = fmax(s, fabs((double)b[i]));
    }
    *diff = d;
    *scale = s;
}

static double worst_rel, least_margin = INFINITY; /* over every check_against with bf16 */

/* With bf16 kernels: within bf16 tolerance of the bf16 oracle (5e-4 of the largest value) and at
 * least 10 times closer to it than to the exact result (so that an fp32 computation fails).
 * Without them: the exact result to 1e-4 as test_lstm. */
static void check_against(oracle *o, const char *what, const float *got, size_t n,
                          const char *exact_name, const char *bf16_name) {
    cf_tensor e = oracle_get(o, exact_name), b = oracle_get(o, bf16_name);
    assert_int_equal(cf_tensor_numel(&e), n);
    if (!cf_bf16_compute()) {
        assert_close(what, got, e.data, n, 1e-4, 1e-5);
    } else {
        double db, de, sb, se;
        diff_scale(got, b.data, n, &db, &sb);
        diff_scale(got, e.data, n, &de, &se);
        worst_rel = fmax(worst_rel, db / sb);
        least_margin = fmin(least_margin, de / fmax(db, 1e-30));
        if (!(db <= 5e-4 * sb + 1e-6))
            fail_msg("%s: %.3g from the bf16 oracle (largest value %.3g)", what, db, sb);
        if (!(de >= 10 * db))
            fail_msg("%s: %.3g from the bf16 oracle but only %.3g from the exact result: not bf16",
                     what, db, de);
    }
    free(e.data);
    free(b.data);
}

typedef struct lstm_run {
    float *ys[8], *dxs[8];
} lstm_run;

static cf_model *new_lstm(int in, int hid) {
    cf_model *model = NULL;
    assert_int_equal(cf_model_new(&model, cf_lstm(in, hid), 11 + in), CF_OK);
    return model;
}

/* n batches through the LSTM (in, hid), bf16 as asked, from a zero state carried over them; the
 * outputs and input gradients kept in r, the parameter gradients (from zero) left in the model. */
static void run_lstm(cf_model *model, oracle *o, int in, int hid, int n, const int *bs,
                     const int *steps, bool bf16, lstm_run *r) {
    assert_int_equal(cf_lstm_set_bf16(model->root, bf16), 1);
    if (o) oracle_put_params(o, model);
    cf_rnn_reset(model->root);
    cf_model_zero_grad(model);
    for (int k = 0; k < n; k++) {
        const cf_shape xs = {.ndim = 3, .dim = {bs[k], steps[k], in}};
        const cf_shape ys_shape = {.ndim = 3, .dim = {bs[k], steps[k], hid}};
        float *x = malloc(cf_shape_numel(&xs) * sizeof(float));
        float *dy = malloc(cf_shape_numel(&ys_shape) * sizeof(float));
        fill_uniform(x, cf_shape_numel(&xs), 100 + k, -1.5f, 1.5f);
        fill_uniform(dy, cf_shape_numel(&ys_shape), 200 + k, -1.0f, 1.0f);
        if (o) {
            char name[32];
            snprintf(name, sizeof name, "x%d", k);
            oracle_put(o, name, x, xs);
            snprintf(name, sizeof name, "dy%d", k);
            oracle_put(o, name, dy, ys_shape);
        }
        cf_tensor xt = cf_tensor_view(x, xs), dyt = cf_tensor_view(dy, ys_shape);
        const cf_tensor *y;
        assert_int_equal(cf_model_forward(model, &xt, &y), CF_OK);
        r->ys[k] = malloc(cf_tensor_numel(y) * sizeof(float));
        memcpy(r->ys[k], y->data, cf_tensor_numel(y) * sizeof(float));
        const cf_tensor *dx = model->root->ops->backward(model->root, &dyt, true);
        assert_non_null(dx);
        r->dxs[k] = malloc(cf_shape_numel(&xs) * sizeof(float));
        memcpy(r->dxs[k], dx->data, cf_shape_numel(&xs) * sizeof(float));
        free(x);
        free(dy);
    }
}

static void free_run(lstm_run *r, int n) {
    for (int k = 0; k < n; k++) {
        free(r->ys[k]);
        free(r->dxs[k]);
    }
}

static void check_lstm(int in, int hid, int n, const int *bs, const int *steps) {
    oracle o;
    oracle_init(&o);
    lstm_run r;
    cf_model *model = new_lstm(in, hid);
    run_lstm(model, &o, in, hid, n, bs, steps, true, &r);
    char args[64];
    snprintf(args, sizeof args, "%d %d %d", in, hid, n);
    oracle_run(&o, "lstm_bf16.py", args);
    for (int k = 0; k < n; k++) {
        char e[32], b[32], what[64];
        const size_t ny = (size_t)bs[k] * steps[k] * hid, nx = (size_t)bs[k] * steps[k] * in;
        snprintf(e, sizeof e, "y%d", k);
        snprintf(b, sizeof b, "yb%d", k);
        snprintf(what, sizeof what, "LSTM(%d, %d) y%d", in, hid, k);
        check_against(&o, what, r.ys[k], ny, e, b);
        snprintf(e, sizeof e, "dx%d", k);
        snprintf(b, sizeof b, "dxb%d", k);
        snprintf(what, sizeof what, "LSTM(%d, %d) dx%d", in, hid, k);
        check_against(&o, what, r.dxs[k], nx, e, b);
    }
    for (int i = 0; i < model->n_params; i++) {
        const cf_param *p = model->params[i];
        char e[300], b[300], what[400];
        snprintf(e, sizeof e, "g_%s", p->full_name);
        snprintf(b, sizeof b, "gb_%s", p->full_name);
        snprintf(what, sizeof what, "LSTM(%d, %d) %s", in, hid, e);
        check_against(&o, what, p->grad, p->numel, e, b);
    }
    /* back to fp32 (no optimizer ran: the same weights): the batches again equal a fresh fp32
     * model's bit for bit, outputs and every gradient */
    lstm_run r32, again;
    cf_model *m32 = new_lstm(in, hid);
    run_lstm(m32, NULL, in, hid, n, bs, steps, false, &r32);
    run_lstm(model, NULL, in, hid, n, bs, steps, false, &again);
    for (int k = 0; k < n; k++) {
        assert_memory_equal(again.ys[k], r32.ys[k], (size_t)bs[k] * steps[k] * hid * 4);
        assert_memory_equal(again.dxs[k], r32.dxs[k], (size_t)bs[k] * steps[k] * in * 4);
    }
    for (int i = 0; i < model->n_params; i++)
        assert_memory_equal(model->params[i]->grad, m32->params[i]->grad,
                            model->params[i]->numel * sizeof(float));
    free_run(&again, n);
    free_run(&r32, n);
    free_run(&r, n);
    cf_model_free(m32);
    cf_model_free(model);
    oracle_cleanup(&o);
}

static void test_lstm_bf16_matches_torch(void **state) {
    (void)state;
    print_message("%s\n", cf_bf16_compute() ? "bf16 compute" : "no bf16 kernels: fp32");
    oracle_serve_begin("lstm_bf16.py");
    /* the state carried over three batches, the last one smaller (cut rows) */
    check_lstm(5, 8, 3, (int[]){3, 3, 2}, (int[]){4, 4, 3});
    /* wider, a batch of more rows (zero-padded state), one step */
    check_lstm(24, 40, 3, (int[]){4, 6, 6}, (int[]){5, 7, 1});
    /* odd sizes past the kernels' tiles (k and n not multiples of 2 or 16) */
    check_lstm(33, 19, 2, (int[]){9, 9}, (int[]){6, 6});
    oracle_serve_end();
    if (cf_bf16_compute())
        print_message("worst difference from the bf16 oracle %.3g of the largest value; the exact "
                      "result at least %.3g times farther\n",
                      worst_rel, least_margin);
}

/* ---- the language model ------------------------------------------------------------------- */

enum { VOCAB = 40 };

static cf_dls *make_dls(void) {
    cf_text_corpus *train = counting_corpus(24, 1, 0, VOCAB),
                   *valid = counting_corpus(8, 2, 0, VOCAB);
    assert_non_null(train);
    assert_non_null(valid);
    cf_dls *dls = NULL;
    assert_int_equal(
        cf_text_dls_new(
            train, valid,
            &(cf_text_dls_options){.bs = 6, .seq_len = 7, .seed = 3, .is_lm = true, .prefetch = -1},
            &dls),
        CF_OK);
    cf_text_corpus_free(train);
    cf_text_corpus_free(valid);
    return dls;
}

/* Two layers and dropouts off (as test_text_learner's parallel fits: a fit without them can
 * equal one process across workers). */
static cf_learner *make_learner(cf_dls *dls, uint64_t seed) {
    cf_awd_lstm_config c = cf_awd_lstm_lm_config();
    c.emb_sz = 24;
    c.n_hid = 40;
    c.n_layers = 2;
    c.output_p = c.hidden_p = c.input_p = c.embed_p = c.weight_p = 0;
    cf_metric *metrics[] = {cf_accuracy(), cf_perplexity()};
    cf_learner *learn = NULL;
    assert_int_equal(cf_language_model_learner(&learn, dls, .config = &c, .seed = seed,
                                               .quiet = true, .metrics = metrics, .n_metrics = 2),
                     CF_OK);
    return learn;
}

static double max_rel(const float *a, const float *b, size_t n, double floor) {
    double worst = 0;
    for (size_t i = 0; i < n; i++)
        worst = fmax(worst, fabs((double)a[i] - b[i]) / fmax(fabs((double)b[i]), floor));
    return worst;
}

/* to_bf16 switches both LSTMs and the tied decoder (3 layers); validation in bf16 moves the loss
 * by bf16 rounding only, and to_fp32 gives fp32's loss back exactly. Without bf16 kernels to_bf16
 * changes nothing. */
static void test_learner_to_bf16_and_back(void **state) {
    (void)state;
    cf_dls *dls = make_dls();
    cf_learner *learn = make_learner(dls, 7);
    assert_int_equal(cf_lstm_set_bf16(learn->model->root, false), 3);
    double v32[3], v16[3], back[3];
    assert_int_equal(cf_validate(learn, v32), CF_OK);
    assert_int_equal(cf_learner_to_bf16(learn), CF_OK);
    assert_int_equal(cf_validate(learn, v16), CF_OK);
    assert_int_equal(cf_learner_to_fp32(learn), CF_OK);
    assert_int_equal(cf_validate(learn, back), CF_OK);
    print_message("valid loss fp32 %.9g, bf16 %.9g, fp32 again %.9g\n", v32[0], v16[0], back[0]);
    for (int k = 0; k < 3; k++) assert_true(back[k] == v32[k]);
    if (cf_bf16_compute()) {
        assert_true(v16[0] != v32[0]);
        assert_true(fabs(v16[0] - v32[0]) <= 1e-2 * v32[0]);
    } else
        for (int k = 0; k < 3; k++) assert_true(v16[k] == v32[k]);
    cf_learner_free(learn);
    cf_dls_free(dls);
}

/* A bf16 fit_one_cycle (2 epochs) on 2 split-batch workers against one process: in fp32 the two
 * agree to 1e-5 (test_text_learner); in bf16 the workers' products round the same values (each
 * row's are the same whatever the batch split) but the fp32 sums of the gradients come in
 * another order, which moves an occasional value across a bf16 rounding boundary (2^-8) in the
 * next step, and Adam carries that on. Measured (this fixture, AVX512_BF16): weights 3.0e-6
 * relative (fp32: 3.2e-6), losses 1.1e-8; bf16 against fp32 4.7e-2. Bound: 1e-4 and 1e-5. */
static void test_bf16_fit_on_two_workers(void **state) {
    (void)state;
    cf_dls *dls = make_dls();
    cf_learner *fp32 = make_learner(dls, 11), *one = make_learner(dls, 11),
               *par = make_learner(dls, 11);
    assert_int_equal(cf_fit_one_cycle(fp32, 2, .lr_max = CF_LR(3e-3)), CF_OK);
    assert_int_equal(cf_learner_to_bf16(one), CF_OK);
    assert_int_equal(cf_fit_one_cycle(one, 2, .lr_max = CF_LR(3e-3)), CF_OK);
    assert_int_equal(cf_learner_to_bf16(par), CF_OK);
    cf_status st = cf_par_fit_one_cycle(par, 2, .lr_max = CF_LR(3e-3),
                                        .par = {.num_cores = 2, .split_batch = true});
    if (st != CF_OK) fail_msg("2 workers: %s", cf_last_error());
    const size_t n = one->model->n_weights;
    const double ew = max_rel(par->model->weights, one->model->weights, n, 1e-3),
                 e32 = max_rel(one->model->weights, fp32->model->weights, n, 1e-3);
    const cf_recorder *rp = &par->recorder, *ro = &one->recorder, *r32 = &fp32->recorder;
    double el = 0, el32 = 0;
    assert_int_equal(rp->n_batches, ro->n_batches);
    for (int64_t i = 0; i < ro->n_batches; i++) {
        el = fmax(el, fabs(rp->losses[i] - ro->losses[i]) / (1 + ro->losses[i]));
        el32 = fmax(el32, fabs(r32->losses[i] - ro->losses[i]) / (1 + ro->losses[i]));
    }
    print_message("%s: 2 workers vs 1 process: weights %.3g, losses %.3g; bf16 vs fp32: weights "
                  "%.3g, losses %.3g\n",
                  cf_bf16_compute() ? "bf16" : "fp32 (no bf16 kernels)", ew, el, e32, el32);
    if (!cf_bf16_compute()) {
        assert_true(e32 == 0); /* to_bf16 changed nothing */
        assert_true(ew <= 1e-5 && el <= 1e-5);
    } else {
        if (!(ew <= 1e-4 && el <= 1e-5))
            fail_msg("2 workers differ from 1 process: weights by %.3g, losses by %.3g", ew, el);
        if (!(e32 >= 3 * ew && el32 > 0)) fail_msg("the fits did not compute in bf16");
    }
    assert_int_equal(rp->n_epochs, 2);
    cf_learner_free(par);
    cf_learner_free(one);
    cf_learner_free(fp32);
    cf_dls_free(dls);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_lstm_bf16_matches_torch),
        cmocka_unit_test(test_learner_to_bf16_and_back),
        cmocka_unit_test(test_bf16_fit_on_two_workers),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
