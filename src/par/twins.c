/* The cf_par_ twins of the fit methods. A twin is one line below: the method, its options type
 * and its argument (for methods that return something, the output pointer, whose type picks
 * how the output comes home). Everything else — running the method in every replica, the
 * parallel callback, bringing the learner's state and the output home, faults — is the same
 * for every method and lives in replica.c, home.c, run_fork.c and run_mpi.c. */
#include <stddef.h>
#include <string.h>

#include "corefit/learn.h"
#include "corefit/par.h"
#include "par/par_internal.h"
#include "par/twin.h"

static cf_status par_run(cf_learner *learn, const cf__par_method *method) {
    const cf_fit_common *common = method->opts;
    const cf_par_opts *par = &common->par;
    if (method->output && method->output->clear_bytes)
        memset(cf__par_out(method), 0, method->output->clear_bytes);
    cf_status st = CF_OK;
    if (!learn || !learn->model || !learn->dls)
        st = cf_fail(CF_ERR_INVALID, "parallel fit: no learner (or a learner without model)");
    else if (par->num_cores < 0)
        st = cf_fail(CF_ERR_INVALID, "num_cores %d < 0", par->num_cores);
    else if (learn->replica.comm)
        st = cf_fail(CF_ERR_STATE, "a parallel fit cannot run inside a replica");
    cf_start_method how = par->start_method;
    if (how == CF_START_AUTO) how = cf_mpi_launched() ? CF_START_MPI : CF_START_FORK;
    if (st == CF_OK && how == CF_START_MPI) {
        cf_comm *comm = NULL;
        st = cf_par_mpi_comm(&comm);
        if (st == CF_OK) return cf__par_run_mpi(learn, comm, method, common);
    }
    if (st != CF_OK) {
        cf__par_free_call_cbs(common);
        return st;
    }
    return cf__par_run_fork(learn, method, common);
}

/* cf_par_NAME_(learn, ARG, opts) runs cf_NAME_(learn, ARG, opts) in every replica. OUTPUT is
 * how the method's output comes home (NULL: it has none). */
#define PAR_TWIN(name, opts_t, arg_t, output, resumable)                                           \
    _Static_assert(offsetof(opts_t, common) == 0, #opts_t " must begin with CF_FIT_COMMON");       \
    static cf_status name##_in_replica(cf_learner *learn, const void *opts, void *args) {          \
        return cf_##name##_(learn, *(arg_t *)args, opts);                                          \
    }                                                                                              \
    cf_status cf_par_##name##_(cf_learner *learn, arg_t arg, const opts_t *opts) {                 \
        return par_run(learn, &(cf__par_method){name##_in_replica, opts, sizeof *opts, &arg,       \
                                                output, resumable});                               \
    }

/* The same for methods with two arguments. */
typedef struct two_ints {
    int a, b;
} two_ints;
#define PAR_TWIN2(name, opts_t)                                                                    \
    _Static_assert(offsetof(opts_t, common) == 0, #opts_t " must begin with CF_FIT_COMMON");       \
    static cf_status name##_in_replica(cf_learner *learn, const void *opts, void *args) {          \
        const two_ints *n = args;                                                                  \
        return cf_##name##_(learn, n->a, n->b, opts);                                              \
    }                                                                                              \
    cf_status cf_par_##name##_(cf_learner *learn, int a, int b, const opts_t *opts) {              \
        return par_run(learn, &(cf__par_method){name##_in_replica, opts, sizeof *opts,             \
                                                &(two_ints){a, b}, NULL, true});                   \
    }

/* clang-format off */
PAR_TWIN(fit, cf_fit_opts, int, NULL, true)
PAR_TWIN(fit_one_cycle, cf_one_cycle_opts, int, NULL, true)
PAR_TWIN(fit_flat_cos, cf_flat_cos_opts, int, NULL, true)
PAR_TWIN2(fit_sgdr, cf_sgdr_opts)
PAR_TWIN(fine_tune, cf_fine_tune_opts, int, NULL, true)
PAR_TWIN(lr_find, cf_lr_find_opts, cf_lr_find_result *, &cf__par_lr_find_output, false)
PAR_TWIN(validate, cf_validate_opts, double *, &cf__par_values_output, false)
PAR_TWIN(get_preds, cf_get_preds_opts, cf_preds *, &cf__par_preds_output, false)
PAR_TWIN(tta, cf_tta_opts, cf_preds *, &cf__par_preds_output, false)
/* clang-format on */
