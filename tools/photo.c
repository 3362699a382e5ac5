/* The command line's photo options: images listed in a CSV (fastai's from_csv), labels from file
 * names (from_name_re), fastai's Resize and RandomResizedCrop, and --pretrained files holding
 * torchvision's or timm's ResNet weights. */
#include "photo.h"

#include <stdio.h>
#include <string.h>

static const char *const resize_names[] = {
    [CF_RESIZE_CROP] = "crop", [CF_RESIZE_PAD] = "pad", [CF_RESIZE_SQUISH] = "squish"};
static const char *const pad_names[] = {
    [CF_PAD_REFLECTION] = "reflection", [CF_PAD_ZEROS] = "zeros", [CF_PAD_BORDER] = "border"};

static int lookup(const char *name, const char *const *names, int n) {
    for (int i = 0; i < n; i++)
        if (strcmp(name, names[i]) == 0) return i;
    return -1;
}

int cli_check_photo_args(const char *cmd, const cli_data *d) {
    bool csv_only = d->fn_col || d->label_col || d->valid_col || d->folder || d->suffix;
    if (csv_only && !d->images_csv)
        return cli_error(CLI_USAGE, cmd,
                         "--fn-col, --label-col, --valid-col, --folder and --suffix are for "
                         "--images-csv");
    if (d->images_csv && (d->images || d->idx || d->csv))
        return cli_error(CLI_USAGE, cmd,
                         "give one data source: --images-csv, --images, --idx "
                         "or --csv");
    if (d->label_re && !d->images)
        return cli_error(CLI_USAGE, cmd,
                         "--label-re labels the files under --images DIR by their names: give "
                         "--images DIR");
    bool photos = d->images || d->images_csv;
    if ((d->resize || d->pad_mode || d->rrc_min_scale > 0) && !photos)
        return cli_error(CLI_USAGE, cmd,
                         "--resize, --pad-mode and --random-resized-crop are for --images or "
                         "--images-csv");
    if (d->resize && lookup(d->resize, resize_names, 3) < 0)
        return cli_error(CLI_USAGE, cmd, "--resize must be crop, pad or squish, got '%s'",
                         d->resize);
    if (d->pad_mode && lookup(d->pad_mode, pad_names, 3) < 0)
        return cli_error(CLI_USAGE, cmd, "--pad-mode must be reflection, zeros or border, got '%s'",
                         d->pad_mode);
    if (d->pad_mode && (!d->resize || strcmp(d->resize, "pad") != 0))
        return cli_error(CLI_USAGE, cmd, "--pad-mode is for --resize pad");
    if (d->resize && d->rrc_min_scale > 0)
        return cli_error(CLI_USAGE, cmd,
                         "give --resize or --random-resized-crop, not both (RandomResizedCrop "
                         "resizes too)");
    return CLI_OK;
}

bool cli_photo_item_tfm(const cli_data *d, int size, cf_item_tfm *out) {
    if (d->model_tfm && d->model_tfm->kind != CF_ITEM_TFM_NONE) {
        *out = *d->model_tfm;
        return true;
    }
    if (d->rrc_min_scale > 0) {
        *out = cf_random_resized_crop_tfm(size, (float)d->rrc_min_scale);
        return true;
    }
    if (!d->resize) return false;
    *out = cf_resize_tfm(size, (cf_resize_method)lookup(d->resize, resize_names, 3));
    if (d->pad_mode) out->pad_mode = (cf_pad_mode)lookup(d->pad_mode, pad_names, 3);
    return true;
}

void cli_photo_adopt_model(cli_data *d, const cf_model_info *m) {
    d->model_tfm = m->item_tfm.kind != CF_ITEM_TFM_NONE ? &m->item_tfm : NULL;
}

void cli_photo_tta_aug(const cf_model_info *m, const cf_aug_opts **aug, const char **note) {
    *aug = m->has_aug ? &m->aug : NULL;
    *note = m->has_aug          ? "aug_transforms as in training"
            : m->has_batch_tfms ? "aug_transforms(): the model was trained without augmentation"
                                : "aug_transforms(): the model does not record its augmentation";
}

void cli_photo_imagenet_size_note(const char *cmd, int size) {
    if (size < 128)
        fprintf(stderr,
                "corefit %s: note: the ImageNet weights were trained on 224 x 224 images; "
                "fine-tuning them at %d x %d is fast but less accurate (fastai users give "
                "--size 224)\n",
                cmd, size, size);
}

void cli_photo_describe(const cli_data *d, int size, char *buf, size_t n) {
    if (d->rrc_min_scale > 0)
        snprintf(buf, n, ", RandomResizedCrop(%d, min_scale %g)", size, d->rrc_min_scale);
    else if (d->resize && strcmp(d->resize, "pad") == 0)
        snprintf(buf, n, ", Resize(%d, pad, %s)", size, d->pad_mode ? d->pad_mode : "reflection");
    else if (d->resize)
        snprintf(buf, n, ", Resize(%d, %s)", size, d->resize);
    else
        snprintf(buf, n, ", squished to %d x %d", size, size);
}

cf_status cli_load_photos(const cli_data *d, const cf_image_folder_options *o, cf_dataset **train,
                          cf_dataset **valid) {
    if (d->images_csv) {
        /* fastai's from_csv: without a validation column, RandomSplitter(valid_pct) */
        cf_image_folder_options co = *o;
        co.valid_pct = d->valid_col ? 0 : d->valid_pct;
        cf_image_csv_options c = {.folder = d->folder,
                                  .fn_col = d->fn_col,
                                  .label_col = d->label_col,
                                  .valid_col = d->valid_col,
                                  .suffix = d->suffix};
        return cf_datasets_from_image_csv_opts(d->images_csv, &c, &co, train, valid);
    }
    return cf_datasets_from_image_names(d->images, d->label_re, o, train, valid);
}

int cli_pretrained_kind(const char *cmd, const char *path, const char *arch, int *resnet_depth) {
    *resnet_depth = 0;
    cf_model_info info;
    if (cf_model_info_read(path, &info) == CF_OK) { /* a corefit model */
        cf_model_info_free(&info);
        return CLI_OK;
    }
    char why_not_corefit[512];
    snprintf(why_not_corefit, sizeof why_not_corefit, "%s", cf_last_error());
    int depth = 0;
    static const char *const what_to_do =
        "Give a model written by corefit train, or torchvision's or timm's ResNet weights as "
        "safetensors; convert a PyTorch .pth with: corefit-convert-pth IN.pth OUT.safetensors";
    if (cf_resnet_weights_depth(path, &depth) != CF_OK) {
        /* a file that is no safetensors at all fails both the same way: said once */
        if (strcmp(why_not_corefit, cf_last_error()) == 0)
            return cli_error(CLI_FAIL, cmd, "--pretrained %s. %s", why_not_corefit, what_to_do);
        return cli_error(CLI_FAIL, cmd,
                         "--pretrained %s is neither a corefit model (%s) nor torchvision's or "
                         "timm's ResNet weights (%s). %s",
                         path, why_not_corefit, cf_last_error(), what_to_do);
    }
    cf_clear_error();
    if (depth != 18 && depth != 34 && depth != 50)
        return cli_error(CLI_FAIL, cmd,
                         "--pretrained %s holds resnet%d weights; the command line builds "
                         "resnet18, resnet34 and resnet50",
                         path, depth);
    char name[16];
    snprintf(name, sizeof name, "resnet%d", depth);
    if (arch && strcmp(arch, name) != 0)
        return cli_error(CLI_USAGE, cmd, "--arch %s differs from the pretrained weights' %s (%s)",
                         arch, name, path);
    *resnet_depth = depth;
    return CLI_OK;
}
