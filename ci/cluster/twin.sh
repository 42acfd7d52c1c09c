#!/usr/bin/env bash
# A second, one-node Slurm cluster on this machine, beside the test cluster of up.sh and registered in the same
# slurmdbd, so that `sacct -M` / `squeue -M` / `scancel -M` reach it from the first: clusters that share $HOME
# and whose job ids collide (tests/test_two_clusters.py starts and stops it). It touches nothing of the first
# cluster: its own ClusterName, ports, config dir, state and spool dirs, pid and log files.
#
#   ci/cluster/twin.sh up [FIRST_JOB_ID]   # fresh state: its first job gets FIRST_JOB_ID (default 1)
#   ci/cluster/twin.sh down                # stop its daemons, drop it from slurmdbd
#   SLURM_CONF=/etc/slurm-twin/slurm.conf sbatch ...
#
# Its slurm.conf is up.sh's template with the controller's own state, pid, log, port and node (twin1, slurmd
# port 17011) put in, so both clusters run the same settings. Needs up.sh's cluster up (munged, slurmdbd).
# Env: HPC_TWIN_NAME (default twin), HPC_TWIN_CTLD_PORT (6827), HPC_TWIN_NODE_PORT (17011),
#      HPC_CLUSTER_ADDR, HPC_CLUSTER_TIMEOUT (as up.sh).
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=common.sh
source "$HERE/common.sh"

TWIN=${HPC_TWIN_NAME:-twin}
NODE=${TWIN}1
HOST=$(hostname -s)
ADDR=${HPC_CLUSTER_ADDR:-127.0.0.1}
TIMEOUT=${HPC_CLUSTER_TIMEOUT:-60}
CTLD_PORT=${HPC_TWIN_CTLD_PORT:-6827}
NODE_PORT=${HPC_TWIN_NODE_PORT:-17011}
TWIN_ETC=/etc/slurm-$TWIN
TWIN_CONF=$TWIN_ETC/slurm.conf
TWIN_STATE=/var/spool/slurmctld-$TWIN
CTLD_PID=$RUN_DIR/slurmctld-$TWIN.pid
CTLD_LOG=$LOG_DIR/slurmctld-$TWIN.log
PATH=$PATH:/usr/sbin:/sbin

[[ $(id -u) -eq 0 ]] || die "must run as root (it starts daemons)"

# until DESC CMD...: poll CMD every 0.2 s for TIMEOUT s; on timeout print the twin's logs and die.
until_ok() {
    local desc=$1 i
    shift
    for ((i = 0; i < TIMEOUT * 5; i++)); do
        if "$@" >/dev/null 2>&1; then return 0; fi
        sleep 0.2
    done
    tail -n 30 "$CTLD_LOG" "$LOG_DIR/slurmd-$NODE.log" >&2 2>/dev/null || true
    die "timed out after ${TIMEOUT}s waiting for $desc (logs above)"
}

stop_twin() {
    stop_daemon "slurmd $NODE" "$(slurmd_pidfile "$NODE")" slurmd
    stop_daemon "slurmctld $TWIN" "$CTLD_PID" slurmctld
}

registered() { sacctmgr -n -P list cluster "$TWIN" format=cluster | grep -qx "$TWIN"; }

case ${1:-} in
up)
    FIRST_JOB_ID=${2:-1}
    [[ $FIRST_JOB_ID =~ ^[1-9][0-9]*$ ]] || die "FIRST_JOB_ID must be a positive integer, not '$FIRST_JOB_ID'"
    pid_alive "$SLURMDBD_PID" slurmdbd >/dev/null || die "slurmdbd is not running: start the test cluster (ci/cluster/up.sh) first"
    [[ $TWIN != "$CLUSTER_NAME" ]] || die "HPC_TWIN_NAME must differ from the test cluster's name ($CLUSTER_NAME)"
    stop_twin
    mkdir -p "$TWIN_ETC" "$RUN_DIR" "$LOG_DIR" "/var/spool/slurmd/$NODE/pmix"
    # Fresh controller state, so FirstJobId holds (a controller with state goes on from its last id).
    rm -rf "$TWIN_STATE" && mkdir -p "$TWIN_STATE"
    sed -e "s|@CLUSTER@|$TWIN|g" -e "s|@HOST@|$HOST|g" -e "s|@ADDR@|$ADDR|g" \
        -e "s|@SLURMCTLD_PORT@|$CTLD_PORT|g" -e "s|@SLURMDBD_PORT@|$SLURMDBD_PORT|g" \
        -e "s|^StateSaveLocation=.*|StateSaveLocation=$TWIN_STATE|" \
        -e "s|^SlurmctldPidFile=.*|SlurmctldPidFile=$CTLD_PID|" \
        -e "s|^SlurmctldLogFile=.*|SlurmctldLogFile=$CTLD_LOG|" \
        -e '/^NodeName=/d' -e '/^PartitionName=/d' -e '/^GresTypes=/d' -e '/^AccountingStorageTRES=/d' \
        -e '/^# Placeholders:/d' -e 's|rendered by ci/cluster/up.sh|rendered by ci/cluster/twin.sh from up.sh'"'"'s template|' \
        "$HERE/slurm.conf.in" >"$TWIN_CONF"
    cat >>"$TWIN_CONF" <<EOF
# ci/cluster/twin.sh: the second cluster's own job ids, node and partition
FirstJobId=$FIRST_JOB_ID
NodeName=$NODE NodeHostname=$HOST NodeAddr=$ADDR Port=$NODE_PORT CPUs=4 Sockets=1 CoresPerSocket=4 ThreadsPerCore=1 RealMemory=4000 State=UNKNOWN
PartitionName=debug Nodes=$NODE Default=YES MaxTime=INFINITE State=UP OverSubscribe=NO
EOF
    if grep -q '@[A-Z0-9_]*@' "$TWIN_CONF"; then die "unrendered placeholder in $TWIN_CONF"; fi
    sed -e "s|@PMIX_TMPDIR@|/var/spool/slurmd/$NODE/pmix|g" "$HERE/mpi.conf.in" >"$TWIN_ETC/mpi.conf"
    export SLURM_CONF=$TWIN_CONF
    if ! registered; then
        log "sacctmgr: adding cluster $TWIN"
        sacctmgr -i add cluster "$TWIN" >/dev/null
    fi
    log "slurmctld $TWIN: starting (port $CTLD_PORT, first job id $FIRST_JOB_ID)"
    slurmctld >>"$LOG_DIR/slurmctld-$TWIN.start.log" 2>&1 || die "slurmctld $TWIN failed to start: $(tail -n 5 "$CTLD_LOG")"
    ctld_up() { scontrol ping | grep -q 'is UP'; }
    until_ok "slurmctld $TWIN (scontrol ping)" ctld_up
    log "slurmd $NODE: starting (port $NODE_PORT)"
    slurmd -N "$NODE" >>"$LOG_DIR/slurmd-$NODE.start.log" 2>&1 || die "slurmd $NODE failed to start"
    node_idle() { [[ $(sinfo -h -N -n "$NODE" -o '%T') == idle ]]; }
    until_ok "$NODE idle" node_idle
    # sacct/squeue/scancel -M find a cluster's controller through slurmdbd: wait until it has registered there.
    dbd_knows() { [[ $(sacctmgr -n -P list cluster "$TWIN" format=controlport) == "$CTLD_PORT" ]]; }
    until_ok "slurmdbd to know $TWIN's controller" dbd_knows
    log "cluster '$TWIN' is up: SLURM_CONF=$TWIN_CONF, node $NODE, first job id $FIRST_JOB_ID"
    ;;
down)
    stop_twin
    if registered; then
        sacctmgr -i delete cluster "$TWIN" >/dev/null || log "sacctmgr could not delete cluster $TWIN (left registered)"
    fi
    log "cluster '$TWIN' stopped"
    ;;
*)
    die "usage: ${0##*/} up [FIRST_JOB_ID] | down"
    ;;
esac
