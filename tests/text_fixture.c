#include "text_fixture.h"

#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>

#include "nn/rnn_internal.h"

bool have_fortunes(void) {
    struct stat sb;
    return stat("/usr/share/games/fortunes/food", &sb) == 0;
}

int fortunes_folder(const char *dir, int max_per_topic) {
    char cmd[1024];
    snprintf(cmd, sizeof cmd,
             "/usr/bin/python3 %s/scripts/fortunes-folder %s --topics food,love,science "
             "--max-per-topic %d --valid-pct 0.25 >/dev/null",
             CF_SOURCE_DIR, dir, max_per_topic);
    return system(cmd);
}

void oracle_put_params(oracle *o, const cf_model *m) {
    for (int i = 0; i < m->n_params; i++) {
        const cf_param *p = m->params[i];
        char name[300];
        snprintf(name, sizeof name, "p_%s", p->full_name);
        oracle_put(o, name, p->data, p->shape);
    }
}

void oracle_put_mask(oracle *o, const char *name, const float *mask, cf_shape shape) {
    float *ones = NULL;
    if (!mask) { /* no mask drawn (p = 0): all ones */
        ones = malloc(cf_shape_numel(&shape) * sizeof(float));
        for (size_t i = 0; i < cf_shape_numel(&shape); i++) ones[i] = 1.0f;
        mask = ones;
    }
    oracle_put(o, name, mask, shape);
    free(ones);
}

void oracle_put_awd_masks(oracle *o, const char *prefix, const cf_module *awd, int rows, int vocab,
                          int emb_sz, int n_hid, int n_layers) {
    const int L = n_layers;
    char name[128];
    snprintf(name, sizeof name, "%s_emb", prefix);
    oracle_put_mask(o, name, cf_nn_embedding_dropout_mask(awd->children[0]), cf_shape1(vocab));
    snprintf(name, sizeof name, "%s_in", prefix);
    oracle_put_mask(o, name, cf_nn_rnn_dropout_mask(awd->children[1 + L]), cf_shape2(rows, emb_sz));
    for (int l = 0; l < L; l++) {
        const int hid = l == L - 1 ? emb_sz : n_hid;
        snprintf(name, sizeof name, "%s_w%d", prefix, l);
        oracle_put_mask(o, name, cf_nn_weight_dropout_mask(awd->children[1 + l]),
                        cf_shape2(4 * hid, hid));
        if (l < L - 1) {
            snprintf(name, sizeof name, "%s_h%d", prefix, l);
            oracle_put_mask(o, name, cf_nn_rnn_dropout_mask(awd->children[2 + L + l]),
                            cf_shape2(rows, hid));
        }
    }
}

void assert_grads_match_oracle(oracle *o, const cf_model *m, const float *grads) {
    size_t at = 0;
    for (int i = 0; i < m->n_params; i++) {
        const cf_param *p = m->params[i];
        if (!p->grad) continue; /* BatchNorm's running statistics */
        char name[300];
        snprintf(name, sizeof name, "g_%s", p->full_name);
        cf_tensor g = oracle_get(o, name);
        assert_int_equal(cf_tensor_numel(&g), p->numel);
        assert_close(name, grads ? grads + at : p->grad, g.data, p->numel, 1e-4, 1e-5);
        at += p->numel;
        free(g.data);
    }
}
