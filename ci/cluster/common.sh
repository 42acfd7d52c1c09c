# shellcheck shell=bash
# Shared by ci/cluster/up.sh, down.sh and twin.sh (sourced, not run).
# shellcheck disable=SC2034  # the variables are used by the scripts that source this file

CLUSTER_NAME=${HPC_CLUSTER_NAME:-hpcserve}
NODES=(node1 node2)
# CPUs of each emulated node (slurm.conf.in's @NODE_CPUS@; both share this host's cores, config_overrides). 16, not 8:
# scripts/test.sh runs two pytests side by side, and one test in front (2 replicas x tp 2, four jobs) takes 8 of
# a node, so a job of the tests beside it (a gateway's successor, due before its predecessor's limit) never waits
# on Resources for one of them. Jobs use what they ask for; more CPUs only let them start.
NODE_CPUS=16
SLURM_ETC=/etc/slurm                     # controller + clients (default SLURM_CONF of Debian's slurm)
RUN_DIR=/run/slurm
LOG_DIR=/var/log/slurm
MUNGE_PID=/run/munge/munged.pid
MYSQL_PID=/run/mysqld/mysqld.pid
MYSQL_SOCK=/run/mysqld/mysqld.sock
MARIADB_LOG=$LOG_DIR/mariadb.log
SLURMDBD_PID=$RUN_DIR/slurmdbd.pid
SLURMCTLD_PID=$RUN_DIR/slurmctld.pid
SLURMCTLD_PORT=6817
SLURMDBD_PORT=6819                       # every cluster of this machine registers in the one slurmdbd (twin.sh)

_T0_US=${EPOCHREALTIME/./}
elapsed() { local d=$(( ${EPOCHREALTIME/./} - _T0_US )); printf '%d.%01d' $((d / 1000000)) $((d % 1000000 / 100000)); }
log() { printf '[%s +%ss] %s\n' "${0##*/}" "$(elapsed)" "$*" >&2; }
die() { printf '[%s] ERROR: %s\n' "${0##*/}" "$*" >&2; exit 1; }

node_etc() { echo "/etc/slurm-$1"; }
slurmd_pidfile() { echo "$RUN_DIR/slurmd-$1.pid"; }

# pid_alive PIDFILE COMM -> prints the pid and returns 0 if PIDFILE names a live process called COMM.
pid_alive() {
    local pidfile=$1 comm=$2 pid
    [[ -r $pidfile ]] || return 1
    pid=$(tr -dc '0-9' <"$pidfile")
    [[ -n $pid ]] || return 1
    [[ -r /proc/$pid/comm && "$(cat "/proc/$pid/comm" 2>/dev/null)" == "$comm" ]] || return 1
    echo "$pid"
}

# stop_daemon NAME PIDFILE COMM: SIGTERM the one process named in PIDFILE, wait, SIGKILL after 20 s.
stop_daemon() {
    local name=$1 pidfile=$2 comm=$3 pid i
    if ! pid=$(pid_alive "$pidfile" "$comm"); then
        log "$name: not running"
        rm -f "$pidfile"
        return 0
    fi
    log "$name: stopping pid $pid"
    kill -TERM "$pid" 2>/dev/null || true
    for ((i = 0; i < 200; i++)); do
        [[ -d /proc/$pid ]] || { rm -f "$pidfile"; return 0; }
        sleep 0.1
    done
    log "$name: pid $pid ignored SIGTERM for 20 s, sending SIGKILL"
    kill -KILL "$pid" 2>/dev/null || true
    sleep 0.5
    rm -f "$pidfile"
}
