#!/usr/bin/env bash
# corefit-mpirun under a lost rank (ctest test_mpi_restart_np2, see mpi_restart.cmake):
#   1. an undisturbed `mpirun -np 2 corefit train --start mpi` job writes the reference model;
#   2. corefit-mpirun --max-restarts 2: rank 1 SIGKILLed once the job's first checkpoint exists
#      (after batch 3 of 80): the wrapper reruns the job with --resume and the model file has the
#      reference's bytes;
#   3. --max-restarts 0: rank 0 (the checkpoint's writer) SIGKILLed: the job fails, no model, the
#      wrapper prints the command that continues, and that command gives the reference's bytes;
#   4. SIGTERM to the wrapper: passed on (the ranks write a checkpoint and stop), no restart, no
#      model.
#
#   mpi_restart.sh WRAPPER COREFIT MPIRUN DIR [MPIRUN OPTIONS...]
# Exit 0 on success, 77 when the data set is missing (skipped), 1 on a failed check.
set -u
wrapper=$1 corefit=$2 mpirun=$3 dir=$4
shift 4
mpi=("$@" -np 2)
data=/usr/share/datasets/fashion-mnist
[[ -d $data ]] || { echo "skipped: no $data"; exit 77; }
rm -rf "$dir" && mkdir -p "$dir" && cd "$dir" || exit 1
train=(train --start mpi --limit 1280 --bs 16 --epochs 2 --quiet --checkpoint-every 3)

fail() {
    echo "FAIL: $*"
    for f in *.err; do [[ -e $f ]] && { echo "--- $f"; cat "$f"; }; done
    exit 1
}

# The rank processes of the job that wrapper pid $1 runs (mpirun's children), by rank.
rank_pid() {
    local w=$1 rank=$2 m p
    for m in $(pgrep -P "$w"); do
        for p in $(pgrep -P "$m"); do
            if tr '\0' '\n' <"/proc/$p/environ" 2>/dev/null | grep -qx "OMPI_COMM_WORLD_RANK=$rank"; then
                echo "$p"
                return 0
            fi
        done
    done
    return 1
}

# Waits (liveness: however long it takes) for checkpoint $2 of the job of wrapper $1, then
# SIGKILLs rank $3.
kill_rank_after_checkpoint() {
    local w=$1 ckpt=$2 rank=$3 p
    until [[ -e $ckpt ]] && p=$(rank_pid "$w" "$rank"); do
        kill -0 "$w" 2>/dev/null || fail "the job ended before $ckpt was written"
        sleep 0.005
    done
    echo "SIGKILL to rank $rank (pid $p)"
    kill -KILL "$p" || fail "cannot kill rank $rank"
}

# 1. the reference
"$mpirun" "${mpi[@]}" "$corefit" "${train[@]}" --out undisturbed.safetensors >ref.out 2>ref.err ||
    fail "the undisturbed job failed"
[[ -s undisturbed.safetensors ]] || fail "no undisturbed.safetensors"

# 2. a lost rank, restarted from the checkpoint (through an mpirun that notes its command lines
#    and becomes the real one: the same process)
printf '#!/usr/bin/env bash\nprintf "%%s\\n" "$*" >>"%s/mpirun.log"\nexec "%s" "$@"\n' \
    "$dir" "$mpirun" >mpirun-noted
chmod +x mpirun-noted
"$wrapper" --max-restarts 2 --mpirun "$dir/mpirun-noted" "${mpi[@]}" -- "$corefit" "${train[@]}" \
    --checkpoint fit.ckpt --out restarted.safetensors >restarted.out 2>restarted.err &
w=$!
kill_rank_after_checkpoint $w fit.ckpt 1
wait $w
rc=$?
((rc == 0)) || fail "corefit-mpirun --max-restarts 2 exited with $rc"
grep -q "exited on signal 9" restarted.err || fail "mpirun did not report the killed rank"
grep -q "restarting it from checkpoint fit.ckpt (restart 1 of 2)" restarted.err ||
    fail "no restart from the checkpoint reported"
mapfile -t runs <mpirun.log
((${#runs[@]} == 2)) || fail "mpirun ran ${#runs[@]} times (expected 2): ${runs[*]}"
[[ ${runs[0]} != *--resume* && ${runs[1]} == *" --out restarted.safetensors --resume fit.ckpt" ]] ||
    fail "the second job does not resume from fit.ckpt: ${runs[*]}"
cmp undisturbed.safetensors restarted.safetensors || fail "the restarted job's model file differs"

# 3. no restarts: a clean failure and the command that continues
"$wrapper" --max-restarts 0 --mpirun "$mpirun" "${mpi[@]}" -- "$corefit" "${train[@]}" \
    --out lost.safetensors >lost.out 2>lost.err &
w=$!
kill_rank_after_checkpoint $w lost.ckpt 0
wait $w
rc=$?
((rc != 0)) || fail "the job with a killed rank 0 and --max-restarts 0 succeeded"
grep -q "0 restarts spent (--max-restarts 0)" lost.err || fail "no 'restarts spent' message"
[[ ! -e lost.safetensors ]] || fail "a model was written by a job that did not finish"
again=$(grep -A1 "to continue from lost.ckpt, run:" lost.err | tail -n 1)
[[ $again == *"--resume lost.ckpt"* ]] || fail "no command to continue"
eval "$again" >again.out 2>again.err || fail "the printed command failed: $again"
cmp undisturbed.safetensors lost.safetensors || fail "the continued job's model file differs"

# 4. SIGTERM to the wrapper: a checkpoint, a stop, no restart (20 epochs: mpirun passes the
#    signal on to the ranks a second or so later, and the job must still be running then)
"$wrapper" --max-restarts 2 --mpirun "$mpirun" "${mpi[@]}" -- "$corefit" "${train[@]}" \
    --epochs 20 --checkpoint stop.ckpt --out stop.safetensors >stop.out 2>stop.err &
w=$!
until [[ -e stop.ckpt ]]; do
    kill -0 $w 2>/dev/null || fail "the job ended before stop.ckpt was written"
    sleep 0.005
done
kill -TERM $w
wait $w
rc=$?
((rc != 0)) || fail "the job stopped by SIGTERM exited 0"
grep -q "stopped by SIGTERM" stop.err || fail "no 'stopped by SIGTERM' message"
grep -q "restarting" stop.err && fail "a job stopped by SIGTERM was restarted"
[[ ! -e stop.safetensors ]] || fail "a model was written by a job stopped by SIGTERM"
echo "ok: restarted job and continued job equal the undisturbed one ($(stat -c %s undisturbed.safetensors) bytes)"
