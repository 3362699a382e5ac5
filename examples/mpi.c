/* The quickstart under MPI: the same program runs in every rank (SPMD) started by mpirun, with
 * start_method CF_START_MPI; rank 0 prints, plots and saves; every rank ends with the same model.
 *
 *   mpirun -np 2 example_mpi [OUT_DIR] [EPOCHS]
 *
 * (as root: mpirun --allow-run-as-root; more ranks than cores: --oversubscribe)
 * COREFIT_EXAMPLE_LIMIT=N trains on the first N training and N/5 validation images. */
#include <corefit.h>

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#define CHECK(call)                                                                                \
    do {                                                                                           \
        cf_status st_ = (call);                                                                    \
        if (st_ != CF_OK) {                                                                        \
            fprintf(stderr, "rank %d: error: %s\n", rank, cf_last_error());                        \
            return 1;                                                                              \
        }                                                                                          \
    } while (0)

int main(int argc, char **argv) {
    const char *out = argc > 1 ? argv[1] : ".";
    int epochs = argc > 2 ? atoi(argv[2]) : 1;
    const char *limit = getenv("COREFIT_EXAMPLE_LIMIT");
    int rank = 0;
    cf_comm *world = NULL;
    /* The MPI world the cf_par_ methods use: which rank this process is. */
    CHECK(cf_par_mpi_comm(&world));
    rank = cf_comm_rank(world);
    if (rank == 0) printf("%d MPI ranks\n", cf_comm_size(world));

    if (rank == 0 && mkdir(out, 0777) != 0 && errno != EEXIST) { /* rank 0 writes here */
        fprintf(stderr, "error: cannot create %s: %s\n", out, strerror(errno));
        return 1;
    }

    cf_dls_options dopt = {.bs = 64, .seed = 42, .n_norm = 1, .mean = {0.2860f}, .std = {0.3530f}};
    if (limit && atoi(limit) > 0) { /* fastai's dls.train.n and dls.valid.n */
        dopt.n_train = atoi(limit);
        dopt.n_valid = dopt.n_train / 5 > 0 ? dopt.n_train / 5 : 1;
    }
    cf_dls *dls = NULL;
    CHECK(cf_dls_from_idx_dir("/usr/share/datasets/fashion-mnist", &dopt, &dls));

    cf_learner *learn = NULL;
    cf_metric *metrics[] = {cf_accuracy()};
    CHECK(cf_vision_learner(&learn, dls, CF_ARCH_MINI_RESNET, .metrics = metrics, .n_metrics = 1,
                            .path = out, .seed = 42));
    /* Master callbacks run on rank 0 only: it writes the CSV log. */
    cf_callback *log[] = {cf_csv_logger_cb("mpi_history.csv", false)};
    CHECK(cf_learner_add_master_cbs(learn, log, 1));

    /* Every rank calls the same method; the group is the MPI world. */
    CHECK(cf_par_fit_one_cycle(learn, epochs, .lr_max = CF_LR(3e-3),
                               .par.start_method = CF_START_MPI));
    double values[2];
    CHECK(cf_par_validate(learn, values, .par.start_method = CF_START_MPI));

    char path[1024];
    if (rank == 0) {
        printf("rank 0: accuracy %.4f after %d epoch(s)\n", values[1], epochs);
        snprintf(path, sizeof path, "%s/mpi_loss.png", out);
        if (cf_plot_loss(&learn->recorder, path, NULL) == CF_OK) printf("wrote %s\n", path);
        snprintf(path, sizeof path, "%s/mpi_model.safetensors", out);
        CHECK(cf_learner_export(learn, path));
        printf("wrote %s\n", path);
    }
    cf_learner_free(learn);
    cf_dls_free(dls);
    return 0;
}
