/* torchvision's ResNets (tests/oracle/resnet.py): torchvision builds resnet18/50 with random
 * weights and saves them as safetensors (with torchvision's names, timm's, or converted from a
 * .pth by tools/convert_pth.py); corefit loads them into its own resnets and must give the same
 * outputs, parameter gradients of L = sum(out * r) and BatchNorm running statistics, in train
 * and eval mode, for fastai's cut body and for the whole model. Also: the errors for a missing
 * or mis-shaped tensor, the model left untouched by a failed load, the fastai learner model's
 * names and head. */
#include "oracle.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "corefit/data.h"
#include "corefit/io.h"
#include "corefit/learn.h"
#include "corefit/nn.h"

#define RTOL 1e-4

static double max_abs(const float *x, size_t n) {
    double m = 0;
    for (size_t i = 0; i < n; i++)
        if (fabs(x[i]) > m) m = fabs(x[i]);
    return m;
}

/* |a - b| <= RTOL * |b| + max(RTOL * max|b|, 4 * PyTorch's own float32 error on the tensor) */
/* allow_frac > 0: up to that fraction of the elements may be out of bounds (see
 * test_resnet50_body_train). */
static void check_close(const char *what, const float *a, const float *b, size_t n,
                        double torch_err, double allow_frac) {
    double atol = fmax(RTOL * max_abs(b, n), 4.0 * torch_err);
    if (allow_frac > 0) {
        size_t bad = 0;
        for (size_t i = 0; i < n; i++)
            if (!(fabs((double)a[i] - b[i]) <= atol + RTOL * fabs(b[i]))) bad++;
        if ((double)bad <= fmax(1.0, allow_frac * (double)n)) return; /* one channel at least */
    }
    if (getenv("RESNET_DEBUG")) { /* print every element out of bounds instead of failing */
        for (size_t i = 0; i < n; i++)
            if (fabs((double)a[i] - b[i]) > atol + RTOL * fabs(b[i]))
                fprintf(stderr, "%s [%zu]: %.7g vs %.7g (atol %.3g, torch32 %.3g)\n", what, i, a[i],
                        b[i], atol, torch_err);
        return;
    }
    assert_close(what, a, b, n, RTOL, atol);
}

static cf_shape out_shape(int depth, bool body, int n, int size) {
    return body ? cf_shape4(n, cf_resnet_nf(depth), size / 32, size / 32) : cf_shape2(n, 10);
}

/* Writes x (2, 3, size, size) and r into o and runs resnet.py. */
static void run_oracle(oracle *o, int depth, bool train, bool body, const char *variant, int size,
                       float **x_out, float **r_out) {
    cf_shape xs = cf_shape4(2, 3, size, size), ys = out_shape(depth, body, 2, size);
    float *x = malloc(cf_shape_numel(&xs) * sizeof(float));
    float *r = malloc(cf_shape_numel(&ys) * sizeof(float));
    fill_uniform(x, cf_shape_numel(&xs), 7, -1.0f, 1.0f);
    fill_uniform(r, cf_shape_numel(&ys), 9, -1.0f, 1.0f);
    oracle_put(o, "x", x, xs);
    oracle_put(o, "r", r, ys);
    char args[256];
    snprintf(args, sizeof args, "depth=%d mode=%s layout=%s variant=%s", depth,
             train ? "train" : "eval", body ? "body" : "full", variant);
    oracle_run(o, "resnet.py", args);
    *x_out = x;
    *r_out = r;
}

static void weights_path(const oracle *o, char *path, size_t size) {
    snprintf(path, size, "%s/weights.safetensors", o->dir);
}

static void run_case(int depth, bool train, bool body, const char *variant, int size,
                     double allow_frac) {
    oracle o;
    oracle_init(&o);
    float *x, *r;
    run_oracle(&o, depth, train, body, variant, size, &x, &r);

    cf_model *model;
    assert_int_equal(
        cf_model_new(&model, body ? cf_resnet_body(depth, 3) : cf_resnet(depth, 3, 10), 4321),
        CF_OK);
    char path[512];
    weights_path(&o, path, sizeof path);
    if (cf_resnet_load_pretrained(model, path) != CF_OK) fail_msg("%s", cf_last_error());

    /* names: torchvision's (whole model) or fastai's cut body, in state_dict order */
    char what[32];
    snprintf(what, sizeof what, "resnet%d", depth);
    oracle_assert_param_names(&o, model, what);

    cf_shape xs = cf_shape4(2, 3, size, size);
    cf_tensor xt = cf_tensor_view(x, xs);
    cf_model_train(model, train);
    cf_model_zero_grad(model);
    const cf_tensor *y;
    assert_int_equal(cf_model_forward(model, &xt, &y), CF_OK);
    cf_shape ys = out_shape(depth, body, 2, size);
    assert_true(cf_shape_equal(&y->shape, &ys));
    cf_tensor terr = oracle_get(&o, "torch_err");
    assert_int_equal(cf_shape_numel(&terr.shape), model->n_params + 1);
    cf_tensor ref = oracle_get(&o, "out");
    check_close("output", y->data, ref.data, cf_shape_numel(&ys), terr.data[model->n_params], 0);
    free(ref.data);
    cf_tensor rt = cf_tensor_view(r, ys);
    assert_int_equal(cf_model_backward(model, &rt), CF_OK);

    for (int i = 0; i < model->n_params; i++) {
        cf_param *p = model->params[i];
        char name[32], what[300];
        bool buffer = p->grad == NULL;
        /* timm's files have no num_batches_tracked: corefit keeps its own 0 */
        if (p->kind == CF_PARAM_COUNTER && strcmp(variant, "timm") == 0) continue;
        snprintf(name, sizeof name, "%s%d", buffer ? "b" : "g", i);
        snprintf(what, sizeof what, "resnet%d %s %s %s (%s)", depth, body ? "body" : "model",
                 buffer ? "buffer" : "gradient", p->full_name, train ? "train" : "eval");
        cf_tensor t = oracle_get(&o, name);
        assert_int_equal(cf_shape_numel(&t.shape), p->numel);
        check_close(what, buffer ? p->data : p->grad, t.data, p->numel, terr.data[i],
                    buffer ? 0 : allow_frac);
        free(t.data);
    }
    free(terr.data);
    free(x);
    free(r);
    cf_model_free(model);
    oracle_cleanup(&o);
}

static void test_resnet18_body_train(void **state) {
    (void)state;
    run_case(18, true, true, "tv", 64, 0);
}

static void test_resnet18_body_eval_timm_names(void **state) {
    (void)state;
    run_case(18, false, true, "timm", 64, 0);
}

static void test_resnet18_full_eval(void **state) {
    (void)state;
    run_case(18, false, false, "tv", 64, 0);
}

static void test_resnet50_body_eval_from_pth(void **state) {
    (void)state;
    run_case(50, false, true, "pth", 64, 0);
}

/* Train mode through 16 Bottlenecks: a value that lands within float32 rounding of 0 before a
 * ReLU switches its mask in one of the two computations (PyTorch's own float32 run flips
 * others), which moves that one channel's gradients by O(1) from there back. So up to 0.1% of a
 * gradient's elements may differ (in practice one channel of one or two layers); the output,
 * the running statistics and every other element must agree, and an error in the layers
 * themselves shows everywhere (resnet18 in train mode and resnet50 in eval mode are checked
 * without this allowance). */
static void test_resnet50_body_train(void **state) {
    (void)state;
    run_case(50, true, true, "tv", 64, 1e-3);
}

/* ---- errors and the fastai learner model --------------------------------------------------- */

static float *snapshot(const cf_model *m) {
    float *s = malloc((m->n_weights + m->n_buffers) * sizeof(float));
    memcpy(s, m->weights, m->n_weights * sizeof(float));
    memcpy(s + m->n_weights, m->buffers, m->n_buffers * sizeof(float));
    return s;
}

static void assert_unchanged(const cf_model *m, const float *s) {
    assert_memory_equal(m->weights, s, m->n_weights * sizeof(float));
    assert_memory_equal(m->buffers, s + m->n_weights, m->n_buffers * sizeof(float));
}

static void test_missing_tensor_named(void **state) {
    (void)state;
    oracle o;
    oracle_init(&o);
    float *x, *r;
    run_oracle(&o, 18, false, true, "missing", 64, &x, &r);
    cf_model *model;
    assert_int_equal(cf_model_new(&model, cf_resnet_learner_model(18, 3, 5, NULL), 1), CF_OK);
    float *before = snapshot(model);
    char path[512];
    weights_path(&o, path, sizeof path);
    assert_int_equal(cf_resnet_load_pretrained(model, path), CF_ERR_FORMAT);
    const char *msg = cf_last_error();
    assert_non_null(strstr(msg, path));
    assert_non_null(strstr(msg, "layer3.1.bn2.running_var"));
    assert_non_null(strstr(msg, "0.6.1.bn2.running_var"));
    assert_unchanged(model, before);
    free(before);
    free(x);
    free(r);
    cf_model_free(model);
    oracle_cleanup(&o);
}

static void test_wrong_depth_names_first_misshaped(void **state) {
    (void)state;
    oracle o;
    oracle_init(&o);
    float *x, *r;
    run_oracle(&o, 50, false, true, "tv", 64, &x, &r); /* resnet50's weights */
    cf_model *model;
    assert_int_equal(cf_model_new(&model, cf_resnet_learner_model(18, 3, 5, NULL), 1), CF_OK);
    float *before = snapshot(model);
    char path[512];
    weights_path(&o, path, sizeof path);
    assert_int_equal(cf_resnet_load_pretrained(model, path), CF_ERR_FORMAT);
    const char *msg = cf_last_error();
    /* conv1 and bn1 fit; layer1.0.conv1 is 1x1 in a Bottleneck, 3x3 in a BasicBlock */
    assert_non_null(strstr(msg, "'layer1.0.conv1.weight' has shape (64, 64, 1, 1)"));
    assert_non_null(strstr(msg, "0.4.0.conv1.weight is (64, 64, 3, 3)"));
    assert_unchanged(model, before);
    free(before);

    /* into a resnet50 learner model: the body loads, the head keeps its initialisation */
    cf_model *m50;
    assert_int_equal(cf_model_new(&m50, cf_resnet_learner_model(50, 3, 5, NULL), 1), CF_OK);
    cf_param *head_w = cf_model_param(m50, "1.4.weight");
    assert_non_null(head_w);
    float *head = malloc(head_w->numel * sizeof(float));
    memcpy(head, head_w->data, head_w->numel * sizeof(float));
    if (cf_resnet_load_pretrained(m50, path) != CF_OK) fail_msg("%s", cf_last_error());
    assert_memory_equal(head, head_w->data, head_w->numel * sizeof(float));
    free(head);
    /* the body's values came from the file: compare one tensor read back from it */
    cf_st_file *file;
    assert_int_equal(cf_st_read(path, &file), CF_OK);
    const cf_st_entry *e = cf_st_find(file, "layer4.2.bn3.running_var");
    assert_non_null(e);
    cf_param *p = cf_model_param(m50, "0.7.2.bn3.running_var");
    assert_non_null(p);
    assert_memory_equal(e->data, p->data, p->numel * sizeof(float));
    cf_st_free(file);
    cf_model_free(m50);
    free(x);
    free(r);
    cf_model_free(model);
    oracle_cleanup(&o);
}

static void test_name_mapping(void **state) {
    (void)state;
    char out[128];
    assert_int_equal(cf_resnet_param_name("conv1.weight", "0.", out, sizeof out), 1);
    assert_string_equal(out, "0.0.weight");
    assert_int_equal(cf_resnet_param_name("module.bn1.running_mean", "0.", out, sizeof out), 1);
    assert_string_equal(out, "0.1.running_mean");
    assert_int_equal(cf_resnet_param_name("layer4.1.downsample.1.bias", "", out, sizeof out), 1);
    assert_string_equal(out, "7.1.downsample.1.bias");
    assert_int_equal(cf_resnet_param_name("model.layer2.0.conv1.weight", NULL, out, sizeof out), 1);
    assert_string_equal(out, "layer2.0.conv1.weight");
    assert_int_equal(cf_resnet_param_name("fc.weight", "0.", out, sizeof out), 0);
    assert_int_equal(cf_resnet_param_name("conv1.0.weight", "0.", out, sizeof out), -1);
    assert_int_equal(cf_resnet_param_name("stem.conv.weight", "0.", out, sizeof out), -1);
    assert_true(cf_resnet_torchvision_name("0.5.0.downsample.0.weight", "0.", out, sizeof out));
    assert_string_equal(out, "layer2.0.downsample.0.weight");
    assert_false(cf_resnet_torchvision_name("1.2.weight", "0.", out, sizeof out));

    /* the learner model: fastai's cut body, create_head(512 -> concat 1024) */
    cf_model *model;
    assert_int_equal(cf_model_new(&model, cf_vision_model("resnet34", 3, 7), 1), CF_OK);
    assert_non_null(cf_model_param(model, "0.6.5.conv2.weight"));
    assert_null(cf_model_param(model, "0.6.6.conv2.weight"));
    cf_param *bn = cf_model_param(model, "1.2.weight"); /* BatchNorm1d(1024) */
    assert_non_null(bn);
    assert_int_equal(bn->numel, 1024);
    assert_int_equal(cf_model_param(model, "1.8.weight")->shape.dim[0], 7);
    cf_model_free(model);
    assert_null(cf_resnet(19, 3, 10));
    assert_non_null(strstr(cf_last_error(), "depth 19"));
}

/* fastai's vision_learner(dls, resnet18, pretrained): the body from torchvision's file, three
 * parameter groups with the body frozen (BatchNorm still training), ImageNet's normalisation
 * added to loaders that had none, and fine_tune runs and trains only what it should. */
static void test_vision_learner_pretrained(void **state) {
    (void)state;
    oracle o;
    oracle_init(&o);
    float *x, *r;
    run_oracle(&o, 18, false, true, "tv", 64, &x, &r);
    char path[512];
    weights_path(&o, path, sizeof path);

    enum { N = 8, S = 3 * 64 * 64 };
    float *imgs = malloc(N * S * sizeof(float)), y[N];
    fill_uniform(imgs, N * S, 3, 0.0f, 1.0f);
    for (int i = 0; i < N; i++) y[i] = (float)(i % 2);
    cf_dataset *train, *valid;
    cf_shape ss = cf_shape_make(3, (int[]){3, 64, 64});
    assert_int_equal(cf_dataset_from_arrays(imgs, y, N, ss, 1, 2, &train), CF_OK);
    assert_int_equal(cf_dataset_from_arrays(imgs, y, 4, ss, 1, 2, &valid), CF_OK);
    cf_aug_opts aug = cf_aug_transforms_defaults(1.0f);
    cf_dls *dls;
    assert_int_equal(cf_dls_new(train, valid, &(cf_dls_options){.bs = 4, .aug = &aug}, &dls),
                     CF_OK);
    cf_learner *learn = NULL;
    if (cf_vision_learner(&learn, dls, CF_ARCH_RESNET18, .pretrained = path, .quiet = true,
                          .seed = 5) != CF_OK)
        fail_msg("%s", cf_last_error());
    cf_model *m = learn->model;
    assert_int_equal(m->n_groups, 3);
    const cf_dl_options *lo = cf_dataloader_options(dls->train);
    assert_int_equal(lo->n_norm, 3);
    assert_true(fabsf(lo->mean[1] - 0.456f) < 1e-7f && fabsf(lo->std[2] - 0.225f) < 1e-7f);
    assert_int_equal(cf_dataloader_options(dls->valid)->n_norm, 3);

    cf_st_file *file;
    assert_int_equal(cf_st_read(path, &file), CF_OK);
    const cf_st_entry *e = cf_st_find(file, "layer2.1.conv2.weight");
    cf_param *conv = cf_model_param(m, "0.5.1.conv2.weight"),
             *bn = cf_model_param(m, "0.5.1.bn2.weight"), *head = cf_model_param(m, "1.4.weight");
    assert_non_null(conv);
    assert_memory_equal(conv->data, e->data, conv->numel * sizeof(float));
    assert_int_equal(conv->group, 0);
    assert_int_equal(cf_model_param(m, "0.7.0.conv1.weight")->group, 1);
    assert_int_equal(head->group, 2);
    assert_false(conv->trainable);
    assert_true(bn->trainable); /* train_bn */
    assert_true(head->trainable);

    /* fine_tune(1, freeze_epochs 1): the frozen epoch moves the head and BatchNorm only */
    float *conv0 = malloc(conv->numel * sizeof(float)),
          *head0 = malloc(head->numel * sizeof(float));
    memcpy(conv0, conv->data, conv->numel * sizeof(float));
    memcpy(head0, head->data, head->numel * sizeof(float));
    assert_int_equal(cf_fit_one_cycle(learn, 1, .lr_max = CF_LR(1e-3)), CF_OK);
    assert_memory_equal(conv0, conv->data, conv->numel * sizeof(float));
    assert_true(memcmp(head0, head->data, head->numel * sizeof(float)) != 0);
    if (cf_fine_tune(learn, 1, .base_lr = 1e-3) != CF_OK) fail_msg("%s", cf_last_error());
    assert_true(memcmp(conv0, conv->data, conv->numel * sizeof(float)) != 0);
    free(conv0);
    free(head0);
    cf_st_free(file);
    cf_learner_free(learn);
    cf_dls_free(dls);
    free(imgs);
    free(x);
    free(r);
    oracle_cleanup(&o);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_name_mapping),
        cmocka_unit_test(test_resnet18_body_train),
        cmocka_unit_test(test_resnet18_body_eval_timm_names),
        cmocka_unit_test(test_resnet18_full_eval),
        cmocka_unit_test(test_resnet50_body_eval_from_pth),
        cmocka_unit_test(test_resnet50_body_train),
        cmocka_unit_test(test_missing_tensor_named),
        cmocka_unit_test(test_wrong_depth_names_first_misshaped),
        cmocka_unit_test(test_vision_learner_pretrained),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
