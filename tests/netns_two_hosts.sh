#!/bin/sh
# Two hosts on one machine: a 2-rank Open MPI job across two network namespaces joined by a
# veth pair, over TCP only, launched without ssh.
#
#   netns_two_hosts.sh PROGRAM [MPIRUN]    (ctest runs it on tests/mpi_fit with "hosts")
#
# Each "host" is a network namespace (ip netns) with its own address (10.203.X.1 and .2) and,
# through unshare --uts, its own host name, so Open MPI sees two nodes: one daemon and one rank
# on each, ranks joined by the tcp BTL over the veth pair. mpirun runs in host A; to start its
# daemon on host B it calls a launch agent (plm_rsh_agent) in place of ssh: a script that runs
# the daemon's command line in B's namespace. Needs root (CAP_SYS_ADMIN and CAP_NET_ADMIN);
# exits 77 (skipped, with a message) where namespaces cannot be made. Cleans up after itself.
set -u
prog=${1:?usage: netns_two_hosts.sh PROGRAM [MPIRUN]}
mpirun=${2:-mpirun}

skip() {
    echo "netns_two_hosts: skipped: $*"
    exit 77
}
[ "$(id -u)" -eq 0 ] || skip "needs root to create network namespaces"
command -v ip >/dev/null 2>&1 || skip "no ip (iproute2)"
command -v unshare >/dev/null 2>&1 || skip "no unshare (util-linux)"

id=$$
net=$((id % 200 + 20))
nsa=cfmpia$id
nsb=cfmpib$id
va=cfva$id
vb=cfvb$id
ipa=10.203.$net.1
ipb=10.203.$net.2
dir=$(mktemp -d /tmp/cf-netns.XXXXXX)

cleanup() {
    ip netns del "$nsa" 2>/dev/null
    ip netns del "$nsb" 2>/dev/null
    ip link del "$va" 2>/dev/null
    rm -rf "$dir"
}
trap cleanup EXIT
trap 'exit 1' INT TERM

ip netns add "$nsa" 2>"$dir/err" || skip "cannot create a network namespace: $(cat "$dir/err")"
ip netns add "$nsb" || exit 1
ip link add "$va" type veth peer name "$vb" 2>"$dir/err" ||
    skip "cannot create a veth pair: $(cat "$dir/err")"
ip link set "$va" netns "$nsa" && ip link set "$vb" netns "$nsb" || exit 1
ip -n "$nsa" addr add "$ipa/24" dev "$va" && ip -n "$nsb" addr add "$ipb/24" dev "$vb" || exit 1
for ns in "$nsa" "$nsb"; do
    ip -n "$ns" link set lo up || exit 1
done
ip -n "$nsa" link set "$va" up && ip -n "$nsb" link set "$vb" up || exit 1

# The launch agent: called by mpirun as  agent HOST COMMAND...  (like ssh); runs COMMAND (the
# daemon's command line, a shell string) on HOST, i.e. in that namespace under its host name.
cat >"$dir/agent" <<EOF
#!/bin/sh
host=\$1
shift
case \$host in
$ipa) ns=$nsa name=cfhosta ;;
$ipb) ns=$nsb name=cfhostb ;;
*) echo "agent: unknown host \$host" >&2; exit 1 ;;
esac
exec ip netns exec "\$ns" unshare --uts /bin/sh -c "hostname \$name && \$*"
EOF
chmod +x "$dir/agent"

export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
asan=
[ -n "${ASAN_OPTIONS+x}" ] && asan="-x ASAN_OPTIONS"
start=$(date +%s)
timeout 150 ip netns exec "$nsa" unshare --uts /bin/sh -c "hostname cfhosta && exec \"\$@\"" sh \
    "$mpirun" --allow-run-as-root -np 2 --host "$ipa:1,$ipb:1" --map-by node \
    --mca plm_rsh_agent "$dir/agent" --mca plm_rsh_no_tree_spawn 1 \
    --mca btl tcp,self --mca btl_tcp_if_include "10.203.$net.0/24" \
    --mca oob_tcp_if_include "10.203.$net.0/24" \
    -x OPENBLAS_NUM_THREADS=1 $asan \
    "$prog" hosts
rc=$?
echo "netns_two_hosts: mpirun exited with $rc after $(($(date +%s) - start)) s"
exit $rc
