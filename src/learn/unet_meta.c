/* A U-Net's options in an exported model (the corefit.unet metadata, documented in docs/api.md):
 * DynamicUnet's keyword arguments as unet_learner built the model, so that load_learner builds
 * the same model again. Every key is written; on reading, each must be present with a value
 * corefit builds, and a key corefit does not know is refused (a model it would build otherwise
 * than it was trained). */
#include "internal.h"

#include <cJSON.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

/* The keys, in the order written. */
static const char *const unet_keys[] = {"blur",       "blur_final", "self_attention", "y_range",
                                        "last_cross", "bottle",     "norm_type",      "act_cls"};
enum { N_UNET_KEYS = sizeof unet_keys / sizeof *unet_keys };

char *cf__unet_opts_json(const cf_unet_opts *o) {
    cJSON *j = cJSON_CreateObject();
    if (!j) return NULL;
    cJSON_AddBoolToObject(j, "blur", o->blur);
    cJSON_AddBoolToObject(j, "blur_final", o->blur_final);
    cJSON_AddBoolToObject(j, "self_attention", o->self_attention);
    if (o->y_range) {
        cJSON *yr = cJSON_AddArrayToObject(j, "y_range");
        cJSON_AddItemToArray(yr, cJSON_CreateNumber(o->y_lo));
        cJSON_AddItemToArray(yr, cJSON_CreateNumber(o->y_hi));
    } else {
        cJSON_AddNullToObject(j, "y_range");
    }
    cJSON_AddBoolToObject(j, "last_cross", o->last_cross);
    cJSON_AddBoolToObject(j, "bottle", o->bottle);
    /* what cf_dynamic_unet builds: unet_learner's norm_type=None and act_cls=nn.ReLU */
    cJSON_AddNullToObject(j, "norm_type");
    cJSON_AddStringToObject(j, "act_cls", "ReLU");
    char *s = cJSON_PrintUnformatted(j);
    char *out = s ? cf_strdup(s) : NULL;
    if (s) cJSON_free(s);
    cJSON_Delete(j);
    return out;
}

/* Fails naming the file, the key and its value (as JSON). */
static cf_status bad_value(const char *path, const char *key, const cJSON *v, const char *want) {
    char *text = cJSON_PrintUnformatted(v);
    cf_status st = cf_fail(CF_ERR_FORMAT, "%s: metadata corefit.unet: %s is %s (%s)", path, key,
                           text ? text : "?", want);
    if (text) cJSON_free(text);
    return st;
}

static cf_status read_bool(const char *path, const cJSON *j, const char *key, bool *out) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(j, key);
    if (!cJSON_IsBool(v)) return bad_value(path, key, v, "expected true or false");
    *out = cJSON_IsTrue(v);
    return CF_OK;
}

static cf_status read_opts(const char *path, const cJSON *j, cf_unet_opts *o) {
    if (!cJSON_IsObject(j))
        return cf_fail(CF_ERR_FORMAT,
                       "%s: metadata corefit.unet is not a JSON object of DynamicUnet's options",
                       path);
    const cJSON *it;
    cJSON_ArrayForEach(it, j) {
        bool known = false;
        for (int k = 0; k < N_UNET_KEYS; k++) known |= strcmp(it->string, unet_keys[k]) == 0;
        if (!known)
            return cf_fail(CF_ERR_FORMAT,
                           "%s: metadata corefit.unet: unknown option '%s' (corefit builds blur, "
                           "blur_final, self_attention, y_range, last_cross, bottle, norm_type "
                           "and act_cls)",
                           path, it->string);
    }
    for (int k = 0; k < N_UNET_KEYS; k++)
        if (!cJSON_GetObjectItemCaseSensitive(j, unet_keys[k]))
            return cf_fail(CF_ERR_FORMAT, "%s: metadata corefit.unet: option %s is missing", path,
                           unet_keys[k]);
    cf_status st;
    if ((st = read_bool(path, j, "blur", &o->blur)) ||
        (st = read_bool(path, j, "blur_final", &o->blur_final)) ||
        (st = read_bool(path, j, "self_attention", &o->self_attention)) ||
        (st = read_bool(path, j, "last_cross", &o->last_cross)) ||
        (st = read_bool(path, j, "bottle", &o->bottle)))
        return st;
    if (o->bottle) /* cf_dynamic_unet refuses it, as it breaks in fastai */
        return bad_value(path, "bottle", cJSON_GetObjectItemCaseSensitive(j, "bottle"),
                         "corefit builds bottle=False only: fastai's ResBlock then mismatches the "
                         "final conv's input");
    const cJSON *yr = cJSON_GetObjectItemCaseSensitive(j, "y_range");
    if (cJSON_IsNull(yr)) {
        o->y_range = false;
        o->y_lo = o->y_hi = 0;
    } else {
        const cJSON *lo = cJSON_GetArrayItem(yr, 0), *hi = cJSON_GetArrayItem(yr, 1);
        if (!cJSON_IsArray(yr) || cJSON_GetArraySize(yr) != 2 || !cJSON_IsNumber(lo) ||
            !cJSON_IsNumber(hi) || !isfinite(lo->valuedouble) || !isfinite(hi->valuedouble) ||
            !(lo->valuedouble < hi->valuedouble))
            return bad_value(path, "y_range", yr, "expected null or [low, high] with low < high");
        o->y_range = true;
        o->y_lo = (float)lo->valuedouble;
        o->y_hi = (float)hi->valuedouble;
    }
    const cJSON *norm = cJSON_GetObjectItemCaseSensitive(j, "norm_type");
    if (!cJSON_IsNull(norm))
        return bad_value(path, "norm_type", norm,
                         "corefit builds null only: unet_learner's norm_type=None, the decoder's "
                         "convolutions without a normalisation layer");
    const cJSON *act = cJSON_GetObjectItemCaseSensitive(j, "act_cls");
    if (!cJSON_IsString(act) || strcmp(act->valuestring, "ReLU") != 0)
        return bad_value(path, "act_cls", act, "corefit builds \"ReLU\" only, fastai's default");
    return CF_OK;
}

cf_status cf__unet_opts_read(const char *path, const char *text, cf_unet_opts *out) {
    *out = cf_unet_defaults();
    if (!text) return CF_OK; /* written before the options were recorded: the defaults */
    cJSON *j = cJSON_Parse(text);
    cf_unet_opts o = cf_unet_defaults();
    cf_status st = read_opts(path, j, &o);
    cJSON_Delete(j);
    if (st == CF_OK) *out = o;
    return st;
}
