/* The command line's photo options (photo.c): images listed in a CSV, labels from file names,
 * fastai's Resize and RandomResizedCrop, torchvision's/timm's ResNet weights. Not installed. */
#ifndef COREFIT_TOOL_PHOTO_H
#define COREFIT_TOOL_PHOTO_H

#include "corefit.h"

/* The image-source and resize options of train and lr-find, for an opts table over a struct
 * holding a cli_data `data`. */
#define PHOTO_OPTIONS(a)                                                                           \
    CLI_IMAGES_CSV_OPTIONS((a).data),                                                              \
        {"--label-re",                                                                             \
         OPT_STR,                                                                                  \
         &(a).data.label_re,                                                                       \
         "REGEX",                                                                                  \
         "--images DIR: label each image file under DIR by the first group of this POSIX "         \
         "extended regular expression on its name (fastai's from_name_re), split by --valid-pct",  \
         0,                                                                                        \
         0,                                                                                        \
         0},                                                                                       \
        {"--resize",                                                                               \
         OPT_STR,                                                                                  \
         &(a).data.resize,                                                                         \
         "METHOD",                                                                                 \
         "fastai's Resize(--size, METHOD): crop (fastai's default; random in training, centred "   \
         "in validation), pad or squish [none: every image squished to --size]; the model "        \
         "records it, and eval and predict resize as it says",                                     \
         0,                                                                                        \
         0,                                                                                        \
         0},                                                                                       \
        {"--pad-mode",                                                                             \
         OPT_STR,                                                                                  \
         &(a).data.pad_mode,                                                                       \
         "MODE",                                                                                   \
         "--resize pad: reflection, zeros or border [reflection]",                                 \
         0,                                                                                        \
         0,                                                                                        \
         0},                                                                                       \
    {                                                                                              \
        "--random-resized-crop", OPT_DOUBLE, &(a).data.rrc_min_scale, "MIN_SCALE",                 \
            "fastai's RandomResizedCrop(--size, min_scale) instead of --resize (fastai's "         \
            "min_scale: 0.08)",                                                                    \
            0.01, 1, 0                                                                             \
    }

/* Checks the photo options against the rest (a usage error printed and returned). */
int cli_check_photo_args(const char *cmd, const cli_data *d);
/* The item transform the options ask for (false: none). */
bool cli_photo_item_tfm(const cli_data *d, int size, cf_item_tfm *out);
/* eval: the data made as the model's training images were (its recorded item transform; a
 * model without one squishes). */
void cli_photo_adopt_model(cli_data *d, const cf_model_info *m);
/* eval --tta: the model's recorded aug_transforms, or NULL (the defaults) with a note saying
 * why, for the printed line. */
void cli_photo_tta_aug(const cf_model_info *m, const cf_aug_opts **aug, const char **note);
/* Fine-tuning torchvision's or timm's ImageNet weights (trained at 224 px) at a size below 128:
 * a note on stderr that they do better near 224 (fastai's usual size). */
void cli_photo_imagenet_size_note(const char *cmd, int size);
/* ", Resize(64, crop)", ", RandomResizedCrop(64, min_scale 0.35)" or ", squished to 64 x 64":
 * how the options size the images, for the data line. */
void cli_photo_describe(const cli_data *d, int size, char *buf, size_t n);
/* The training and validation sets of --images-csv, or of --images with --label-re. */
cf_status cli_load_photos(const cli_data *d, const cf_image_folder_options *o, cf_dataset **train,
                          cf_dataset **valid);
/* --pretrained FILE: 0 in *resnet_depth for a corefit model, else the depth of the torchvision
 * or timm ResNet it holds; a usage error saying what to do for any other file. */
int cli_pretrained_kind(const char *cmd, const char *path, const char *arch, int *resnet_depth);

#endif
