/* corefit/io.h — model files in the safetensors format, written atomically and checked in full
 * before use (errors name the file and the entry at fault). Format notes: docs/api.md. */
#ifndef COREFIT_IO_H
#define COREFIT_IO_H

#include "corefit/core.h"
#include "corefit/nn.h"
#include "corefit/optim.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum cf_dtype { CF_DTYPE_F32, CF_DTYPE_I64 } cf_dtype;

/* One tensor in a file. data is float32 in memory whatever the dtype on disk (I64 values are
 * converted, exactly up to 2^24). */
typedef struct cf_st_entry {
    char *name;
    cf_dtype dtype;
    cf_shape shape; /* ndim 0 means a scalar */
    size_t numel;
    float *data;
} cf_st_entry;

typedef struct cf_st_file {
    cf_st_entry *entries;
    int n_entries;
    char **meta_keys, **meta_values; /* __metadata__ string pairs */
    int n_meta;
} cf_st_file;

/* Reads and validates a whole file. On failure *out is NULL and nothing leaks. */
cf_status cf_st_read(const char *path, cf_st_file **out);
/* Validates an in-memory image (used by the reader and the fuzzer). */
cf_status cf_st_parse(const unsigned char *bytes, size_t size, const char *name, cf_st_file **out);
void cf_st_free(cf_st_file *file);
const cf_st_entry *cf_st_find(const cf_st_file *file, const char *name);
const char *cf_st_meta(const cf_st_file *file, const char *key);

/* Writes entries (float32 data, converted for I64) atomically in the given order. Names must be
 * unique and non-empty; an existing file keeps its mode. */
cf_status cf_st_write(const char *path, const cf_st_entry *entries, int n_entries,
                      const char *const *meta_keys, const char *const *meta_values, int n_meta);
/* Whether cf_st_write could write `path` (creates and removes a temporary file beside it), so a
 * long job learns up front. CF_OK, or CF_ERR_IO naming the path and why. */
cf_status cf_st_check_writable(const char *path);

/* Saves every parameter and buffer under its state_dict name and, with opt, the optimizer state
 * ("opt." entries). Without opt the file is what torch's load_state_dict(strict=True) expects.
 * Entry names: docs/api.md. */
cf_status cf_model_save(const cf_model *model, const cf_optimizer *opt, const char *path);
/* Loads into a model of the same architecture with PyTorch's strict checks (and opt's state when
 * present and opt is non-NULL). On any error model and optimizer are unchanged. */
cf_status cf_model_load(cf_model *model, cf_optimizer *opt, const char *path);

/* Maps a torchvision/timm ResNet tensor name to a corefit model's (body_prefix NULL: cf_resnet;
 * "0." cf_resnet_learner_model; "" cf_resnet_body). Returns 1 and writes out, 0 for the
 * classifier ("fc.*"), -1 for a name that is not a torchvision ResNet's. */
int cf_resnet_param_name(const char *name, const char *body_prefix, char *out, size_t size);
/* The inverse for messages: torchvision's name of a body parameter of a fastai-cut model
 * (false when `name` is not under body_prefix or not a body name). */
bool cf_resnet_torchvision_name(const char *name, const char *body_prefix, char *out, size_t size);

/* Loads pretrained torchvision or timm ResNet weights (safetensors float32; convert a .pth with
 * tools/convert_pth.py) into cf_resnet_learner_model's body, cf_resnet_body, cf_resnet or the
 * encoder of cf_unet_model on a torchvision ResNet. Every
 * body tensor must match; on error the message names the tensor and the model is unchanged. */
cf_status cf_resnet_load_pretrained(cf_model *model, const char *path);
/* The depth (18 ... 152) of the ResNet whose weights a safetensors file holds; an error naming
 * the file when it holds none. */
cf_status cf_resnet_weights_depth(const char *path, int *depth);

#ifdef __cplusplus
}
#endif
#endif
