/* corefit/io.h — model files in the safetensors format (https://huggingface.co/docs/safetensors):
 * an 8-byte little-endian header length, a JSON header {"name": {"dtype", "shape",
 * "data_offsets": [begin, end]}, "__metadata__": {...}}, then the raw little-endian data.
 *
 * Writes are atomic: a temporary file in the same folder (mode 0600, O_EXCL), fsync, rename.
 * The reader checks the header length, the JSON, dtypes, shapes, offsets and sizes against the
 * file before trusting any of it, and names the file and the entry at fault on error. */
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

/* Writes entries (data taken as float32, converted for I64) atomically, in the given order,
 * the header padded with spaces so the data starts at a multiple of 8 bytes. A new file gets
 * mode 0666 & ~umask; an existing one keeps its mode. Names must be unique and non-empty. */
cf_status cf_st_write(const char *path, const cf_st_entry *entries, int n_entries,
                      const char *const *meta_keys, const char *const *meta_values, int n_meta);
/* Whether cf_st_write could write `path`: creates and removes a temporary file beside it (the
 * way a save does), so that a long job can learn before it starts, not after, that its output
 * folder is missing, read-only or full of inodes. CF_OK, or CF_ERR_IO naming the path and why. */
cf_status cf_st_check_writable(const char *path);

/* Saves every parameter and buffer under its state_dict name (num_batches_tracked as an I64
 * 0-dim tensor, as PyTorch keeps it), and with opt the optimizer state as "opt.<name>.grad_avg",
 * "opt.<name>.sqr_avg" (when the optimizer keeps them), "opt.<name>.step" (I64 scalar) plus
 * per-group hypers "opt.hypers" (n_groups x 5: lr, mom, sqr_mom, eps, wd). Metadata: "format":
 * "pt"; with opt also "corefit.optimizer" ("Adam"/"SGD") and "corefit.opt.hypers" (the hypers as
 * text in full double precision, so a reloaded optimizer continues bit for bit). Without the
 * "opt." entries the file is what torch's load_state_dict(strict=True) expects. */
cf_status cf_model_save(const cf_model *model, const cf_optimizer *opt, const char *path);
/* Loads into an existing model of the same architecture: every name must be present with the
 * same shape, and no other tensor (besides "opt." entries) may be (PyTorch's strict loading).
 * With opt non-NULL and the state present, loads it too (it must be of the same optimizer kind
 * and groups); a file without optimizer state leaves opt alone. On any error the model and
 * optimizer are left exactly as they were. */
cf_status cf_model_load(cf_model *model, cf_optimizer *opt, const char *path);

/* The name, in a corefit model, of a pretrained ResNet tensor. `name` is torchvision's or timm's
 * (the same for the plain ResNets; a "module." or "model." prefix is dropped). body_prefix NULL:
 * the model is cf_resnet's (names unchanged); otherwise the model holds fastai's cut body under
 * body_prefix ("0." for cf_resnet_learner_model, "" for cf_resnet_body), so "conv1.*" becomes
 * "<prefix>0.*", "bn1.*" "<prefix>1.*" and "layerK.*" "<prefix>(3+K).*". Returns 1 and writes
 * out, 0 for the classifier ("fc.*", which a fastai body has no place for), -1 for a name that
 * is not part of a torchvision ResNet (e.g. timm's deep-stem "conv1.0.weight"). */
int cf_resnet_param_name(const char *name, const char *body_prefix, char *out, size_t size);
/* The inverse for messages: torchvision's name of a body parameter of a fastai-cut model
 * (false when `name` is not under body_prefix or not a body name). */
bool cf_resnet_torchvision_name(const char *name, const char *body_prefix, char *out, size_t size);

/* Loads a pretrained torchvision or timm ResNet (safetensors, float32, with their state_dict
 * names; convert a torchvision .pth with tools/convert_pth.py) into a model built by
 * cf_resnet_learner_model (the body "0.*"; the head keeps its own initialisation),
 * cf_resnet_body, or cf_resnet (everything; fc only when its shape matches, else it keeps its
 * initialisation). Names are mapped with cf_resnet_param_name. Every body parameter and running
 * statistic must be in the file with the model's shape (num_batches_tracked may be absent), and
 * every tensor of the file but the classifier must have a place in the model; otherwise the
 * error names the first tensor at fault (file name and model name, both shapes) and the model
 * is left exactly as it was. */
cf_status cf_resnet_load_pretrained(cf_model *model, const char *path);
/* The depth (18, 34, 50, 101 or 152) of the torchvision or timm ResNet whose weights a
 * safetensors file holds, told by its names and block counts (a "module." or "model." prefix
 * allowed); an error naming the file when it holds none of them. */
cf_status cf_resnet_weights_depth(const char *path, int *depth);

#ifdef __cplusplus
}
#endif
#endif
