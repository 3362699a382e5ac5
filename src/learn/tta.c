/* fastai's Learner.tta: n augmented get_preds passes, one plain pass, blended. */
#include "corefit/learn.h"

#include <math.h>
#include <string.h>

#include "learn/internal.h"

uint64_t cf_tta_seed(uint64_t seed, int pass) {
    /* splitmix64 of the seed moved by the pass: passes draw unrelated augmentations, and none
     * repeats the training loader's own draws (which use seed itself) */
    uint64_t z = seed + 0x9E3779B97F4A7C15ull * ((uint64_t)pass + 1);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static void free_call_cbs(const cf_tta_opts *o) {
    for (int i = 0; i < o->n_cbs; i++) cf_callback_free(o->cbs[i]);
}

/* torch.lerp(start, end, weight) as PyTorch computes it, so that weight 1 gives end exactly. */
static float lerp_torch(float start, float end, float weight) {
    return weight < 0.5f ? start + weight * (end - start) : end - (end - start) * (1.0f - weight);
}

cf_status cf_tta_(cf_learner *learn, cf_preds *out, const cf_tta_opts *o) {
    memset(out, 0, sizeof *out);
    const int n = o->flip_pass ? 1 : o->n ? o->n : 4;
    const double beta = o->aug_only ? 0.0 : o->beta != 0 ? o->beta : 0.25;
    cf_status st = CF_OK;
    if (!learn || !learn->dls || !learn->model)
        st = cf_fail(CF_ERR_INVALID, "tta: no learner (or a learner without model or data)");
    else if (n < 1 || n > 1000)
        st = cf_fail(CF_ERR_INVALID, "tta: n %d outside [1, 1000]", n);
    else if (!(beta >= 0 && beta <= 1))
        st = cf_fail(CF_ERR_INVALID, "tta: beta %g outside [0, 1]", beta);
    else if (!(o->train_set ? learn->dls->train : learn->dls->valid))
        st = cf_fail(CF_ERR_INVALID, "tta: no %s set", o->train_set ? "training" : "validation");
    if (st != CF_OK) {
        free_call_cbs(o);
        return st;
    }
    /* fastai runs the passes with the dataset in training split mode: the training loader's
     * augmentations (or the caller's) act on the items */
    const cf_dataloader *train = learn->dls->train;
    const cf_dl_options *topt = cf_dataloader_options(train ? train : learn->dls->valid);
    cf__preds_tfms tfms = {.aug = o->flip_pass ? NULL : o->aug, .mirror = o->flip_pass};
    if (!o->aug && !o->flip_pass && train) {
        tfms.crop_pad = topt->crop_pad;
        tfms.flip = topt->flip;
        tfms.aug = topt->aug;
    }
    const cf_get_preds_opts quiet = {0};
    float *aug = NULL; /* the mean (or max) of the augmented passes */
    double *sum = NULL;
    size_t numel = 0;
    for (int pass = 0; pass < n && st == CF_OK; pass++) {
        cf_preds p;
        tfms.seed = cf_tta_seed(topt->seed, pass);
        st = cf__get_preds_tfms(learn, &p, &quiet, &tfms);
        if (st != CF_OK) break;
        if (pass == 0) {
            numel = cf_tensor_numel(&p.preds);
            aug = cf_malloc((numel + 1) * sizeof *aug);
            sum = o->use_max ? NULL : cf_calloc(numel + 1, sizeof *sum);
            if (!aug || (!o->use_max && !sum))
                st = cf_fail(CF_ERR_NOMEM, "tta: %zu predictions", numel);
            else if (o->use_max)
                memcpy(aug, p.preds.data, numel * sizeof *aug);
        } else if (cf_tensor_numel(&p.preds) != numel) {
            st = cf_fail(CF_ERR_STATE, "tta: pass %d gave %zu predictions, pass 0 %zu", pass,
                         cf_tensor_numel(&p.preds), numel);
        } else if (o->use_max) {
            for (size_t i = 0; i < numel; i++)
                if (p.preds.data[i] > aug[i]) aug[i] = p.preds.data[i];
        }
        if (st == CF_OK && !o->use_max)
            for (size_t i = 0; i < numel; i++) sum[i] += p.preds.data[i];
        cf_preds_free(&p);
    }
    if (st == CF_OK && !o->use_max)
        for (size_t i = 0; i < numel; i++) aug[i] = (float)(sum[i] / n);
    cf_free(sum);
    if (st != CF_OK) {
        cf_free(aug);
        free_call_cbs(o);
        return st;
    }
    /* the plain pass, with the call's callbacks */
    st = cf_get_preds(learn, out, .cbs = o->cbs, .n_cbs = o->n_cbs, .train_set = o->train_set);
    if (st == CF_OK && cf_tensor_numel(&out->preds) != numel)
        st = cf_fail(CF_ERR_STATE, "tta: the plain pass gave %zu predictions, the augmented %zu",
                     cf_tensor_numel(&out->preds), numel);
    if (st == CF_OK) {
        float *plain = out->preds.data;
        for (size_t i = 0; i < numel; i++)
            plain[i] = o->use_max ? (aug[i] > plain[i] ? aug[i] : plain[i])
                                  : lerp_torch(aug[i], plain[i], (float)beta);
    } else {
        cf_preds_free(out);
    }
    cf_free(aug);
    return st;
}
