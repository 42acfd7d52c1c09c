#!/usr/bin/env bash
# Install (if needed) and start the hpc-serve one-machine Slurm test cluster. Idempotent: on a machine where
# it is already up it only checks and returns; daemons that are not running (or whose config changed) are
# (re)started. Run as root on Debian 12. See ci/cluster/README.md.
#
#   sudo ci/cluster/up.sh            # then: source ci/cluster/env.sh
#
# Env: PYTHON (interpreter that gets mpi4py, default python3), HPC_CLUSTER_NAME (default hpcserve),
#      HPC_CLUSTER_ADDR (address the daemons use, default 127.0.0.1), HPC_CLUSTER_TIMEOUT (per daemon, s, 60).
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=common.sh
source "$HERE/common.sh"

HOST=$(hostname -s)
ADDR=${HPC_CLUSTER_ADDR:-127.0.0.1}
PYTHON=${PYTHON:-python3}
TIMEOUT=${HPC_CLUSTER_TIMEOUT:-60}
declare -A NODE_PORT=([node1]=17001 [node2]=17002)
declare -A NODE_GPUS=([node1]="0 1 2 3" [node2]="4 5 6 7")
DB_NAME=slurm_acct_db
DB_USER=slurm
DB_PASS=${HPC_CLUSTER_DB_PASS:-slurm-ci-only}   # MariaDB listens on 127.0.0.1 only; test cluster

APT_PACKAGES=(slurmctld slurmd slurm-client slurmdbd munge mariadb-server openmpi-bin libopenmpi-dev libpmix2 libpmix-dev)
REQUIRED_BINS=(slurmctld slurmd slurmdbd sinfo srun sbatch sacct sacctmgr scontrol munged munge unmunge
               mariadbd mariadb mariadb-admin mpirun mpicc)

[[ $(id -u) -eq 0 ]] || die "must run as root (it installs packages and starts daemons)"
export SLURM_CONF=$SLURM_ETC/slurm.conf   # the clients this script runs (sacctmgr, scontrol, sinfo)

# tail_logs FILE...: print the tail of each existing file (used on failure).
tail_logs() {
    local f
    for f in "$@"; do
        [[ -s $f ]] || continue
        printf '\n---- last 40 lines of %s ----\n' "$f" >&2
        tail -n 40 "$f" >&2
    done
}

# wait_until DESC TIMEOUT LOGFILES(space separated) CMD...: poll CMD every 0.2 s; on timeout print logs and die.
wait_until() {
    local desc=$1 timeout=$2 logs=$3 i n
    shift 3
    n=$((timeout * 5))
    for ((i = 0; i < n; i++)); do
        if "$@" >/dev/null 2>&1; then return 0; fi
        sleep 0.2
    done
    # shellcheck disable=SC2086
    tail_logs $logs
    die "timed out after ${timeout}s waiting for $desc (logs above)"
}

# ---------------------------------------------------------------------------------------------------------
# 1. Packages: apt only when something is missing (a fresh machine); mpi4py against the system Open MPI.
# ---------------------------------------------------------------------------------------------------------
PATH=$PATH:/usr/sbin:/sbin
missing=()
for b in "${REQUIRED_BINS[@]}"; do command -v "$b" >/dev/null 2>&1 || missing+=("$b"); done
[[ -e /usr/lib/x86_64-linux-gnu/slurm-wlm/mpi_pmix_v4.so || -e /usr/lib/$(uname -m)-linux-gnu/slurm-wlm/mpi_pmix_v4.so ]] \
    || missing+=(mpi_pmix_v4.so)
if ((${#missing[@]})); then
    log "installing packages (missing: ${missing[*]})"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -q
    # policy-rc.d: no init scripts are started by the packages' postinst (up.sh starts the daemons itself).
    policy_created=0
    if [[ ! -e /usr/sbin/policy-rc.d ]]; then
        printf '#!/bin/sh\nexit 101\n' >/usr/sbin/policy-rc.d && chmod 755 /usr/sbin/policy-rc.d && policy_created=1
    fi
    apt-get install -y -q "${APT_PACKAGES[@]}" || {
        ((policy_created)) && rm -f /usr/sbin/policy-rc.d
        die "apt-get install failed"
    }
    ((policy_created)) && rm -f /usr/sbin/policy-rc.d
    hash -r
    for b in "${REQUIRED_BINS[@]}"; do command -v "$b" >/dev/null 2>&1 || die "$b still missing after apt-get install"; done
else
    log "packages: present"
fi

mpi4py_ok() { "$PYTHON" -c 'from mpi4py import MPI; import sys; sys.exit("Open MPI" not in MPI.Get_library_version())'; }
if ! mpi4py_ok 2>/dev/null; then
    command -v "$PYTHON" >/dev/null 2>&1 || die "PYTHON=$PYTHON not found (set PYTHON to the interpreter the tests use)"
    pip_args=()
    if "$PYTHON" -c 'import os,sys,sysconfig; sys.exit(not os.path.exists(os.path.join(sysconfig.get_path("stdlib"), "EXTERNALLY-MANAGED")))'; then
        pip_args+=(--break-system-packages)   # a Debian system python; CI normally uses its own python
    fi
    log "installing mpi4py for $PYTHON"
    "$PYTHON" -m pip install -q "${pip_args[@]}" mpi4py || true
    if ! mpi4py_ok; then
        log "mpi4py wheel does not load Open MPI; building it from source with mpicc"
        env MPICC=mpicc "$PYTHON" -m pip install -q "${pip_args[@]}" --force-reinstall --no-cache-dir --no-binary=mpi4py mpi4py
        mpi4py_ok || die "mpi4py does not load the system Open MPI: $("$PYTHON" -c 'from mpi4py import MPI; print(MPI.Get_library_version())' 2>&1 | tail -1)"
    fi
fi
log "mpi4py: ok ($PYTHON)"

# ---------------------------------------------------------------------------------------------------------
# 2. Config: render the templates; remember which daemons must restart because their config changed.
# ---------------------------------------------------------------------------------------------------------
declare -A RESTART=()
render() {   # render TEMPLATE DEST MODE [extra sed expressions...]; sets CHANGED=1 when DEST changed
    local tmpl=$1 dest=$2 mode=$3 tmp
    shift 3
    tmp=$(mktemp)
    sed -e "s|@CLUSTER@|$CLUSTER_NAME|g" -e "s|@HOST@|$HOST|g" -e "s|@ADDR@|$ADDR|g" \
        -e "s|@SLURMCTLD_PORT@|$SLURMCTLD_PORT|g" -e "s|@SLURMDBD_PORT@|$SLURMDBD_PORT|g" \
        -e "s|@NODE1_PORT@|${NODE_PORT[node1]}|g" -e "s|@NODE2_PORT@|${NODE_PORT[node2]}|g" \
        -e "s|@NODE_CPUS@|$NODE_CPUS|g" -e "s|@DB_NAME@|$DB_NAME|g" -e "s|@DB_USER@|$DB_USER|g" -e "s|@DB_PASS@|$DB_PASS|g" \
        "$@" "$HERE/$tmpl" >"$tmp"
    if grep -q '@[A-Z0-9_]*@' "$tmp"; then die "unrendered placeholder in $tmpl: $(grep -o '@[A-Z0-9_]*@' "$tmp" | head -1)"; fi
    CHANGED=0
    if ! cmp -s "$tmp" "$dest"; then
        install -D -m "$mode" -o root -g root "$tmp" "$dest"
        CHANGED=1
    fi
    rm -f "$tmp"
}

mkdir -p "$SLURM_ETC" "$RUN_DIR" "$LOG_DIR" /var/spool/slurmctld
render slurm.conf.in "$SLURM_ETC/slurm.conf" 644
((CHANGED)) && RESTART[slurmctld]=1 && for n in "${NODES[@]}"; do RESTART[$n]=1; done
render gres.conf.in "$SLURM_ETC/gres.conf" 644
((CHANGED)) && RESTART[slurmctld]=1
render mpi.conf.in "$SLURM_ETC/mpi.conf" 644 -e "s|@PMIX_TMPDIR@|/var/spool/slurm-client/pmix|g"
render slurmdbd.conf.in "$SLURM_ETC/slurmdbd.conf" 600
((CHANGED)) && RESTART[slurmdbd]=1
mkdir -p /var/spool/slurm-client/pmix
for n in "${NODES[@]}"; do
    # Each slurmd reads its own SLURM_CONF dir: same slurm.conf/gres.conf, its own mpi.conf (PMIx tmp dir).
    d=$(node_etc "$n")
    render slurm.conf.in "$d/slurm.conf" 644
    ((CHANGED)) && RESTART[$n]=1
    render gres.conf.in "$d/gres.conf" 644
    ((CHANGED)) && RESTART[$n]=1
    render mpi.conf.in "$d/mpi.conf" 644 -e "s|@PMIX_TMPDIR@|/var/spool/slurmd/$n/pmix|g"
    ((CHANGED)) && RESTART[$n]=1
    [[ -e $SLURM_ETC/plugstack.conf && ! -e $d/plugstack.conf ]] && ln -s "$SLURM_ETC/plugstack.conf" "$d/plugstack.conf"
    mkdir -p "/var/spool/slurmd/$n/pmix"
    # Fake GPUs: character devices like /dev/null, distinct per node (gres.conf File=).
    for g in ${NODE_GPUS[$n]}; do
        [[ -c /dev/fakegpu$g ]] || { rm -f "/dev/fakegpu$g"; mknod -m 666 "/dev/fakegpu$g" c 1 3; RESTART[$n]=1; }
    done
done
if ((${#RESTART[@]})); then log "config: changed -> restart ${!RESTART[*]}"; else log "config: unchanged"; fi

# ---------------------------------------------------------------------------------------------------------
# 3. munge
# ---------------------------------------------------------------------------------------------------------
mkdir -p /etc/munge /var/lib/munge /var/log/munge /run/munge
chown munge:munge /etc/munge /var/lib/munge /var/log/munge /run/munge
chmod 0700 /etc/munge /var/log/munge
chmod 0711 /var/lib/munge
chmod 0755 /run/munge
if [[ ! -s /etc/munge/munge.key ]]; then
    log "munge: creating /etc/munge/munge.key"
    if command -v mungekey >/dev/null 2>&1; then
        runuser -u munge -- mungekey --create --keyfile=/etc/munge/munge.key
    elif command -v create-munge-key >/dev/null 2>&1; then
        create-munge-key -f
    else
        dd if=/dev/urandom of=/etc/munge/munge.key bs=1 count=1024 status=none
    fi
fi
chown munge:munge /etc/munge/munge.key
chmod 0400 /etc/munge/munge.key
munge_ok() { munge -n </dev/null | unmunge >/dev/null; }
if pid_alive "$MUNGE_PID" munged >/dev/null && munge_ok 2>/dev/null; then
    log "munged: running"
else
    stop_daemon munged "$MUNGE_PID" munged
    log "munged: starting"
    runuser -u munge -- munged >>/var/log/munge/munged.start.log 2>&1 \
        || { tail_logs /var/log/munge/munged.start.log /var/log/munge/munged.log; die "munged failed to start"; }
    wait_until "munge -n | unmunge" "$TIMEOUT" "/var/log/munge/munged.log /var/log/munge/munged.start.log" munge_ok
    log "munged: up"
fi

# ---------------------------------------------------------------------------------------------------------
# 4. MariaDB (slurmdbd's storage; sacct -- and so submitit -- needs it)
# ---------------------------------------------------------------------------------------------------------
mkdir -p /run/mysqld
chown mysql:mysql /run/mysqld
chmod 0755 /run/mysqld
mysql_ok() { mariadb-admin --protocol=socket --socket="$MYSQL_SOCK" ping; }
if pid_alive "$MYSQL_PID" mariadbd >/dev/null && mysql_ok >/dev/null 2>&1; then
    log "mariadb: running"
else
    stop_daemon mariadb "$MYSQL_PID" mariadbd
    if [[ ! -d /var/lib/mysql/mysql ]]; then
        log "mariadb: initialising /var/lib/mysql"
        mkdir -p /var/lib/mysql
        chown mysql:mysql /var/lib/mysql
        mariadb-install-db --user=mysql --datadir=/var/lib/mysql --auth-root-authentication-method=socket \
            --skip-test-db >>"$MARIADB_LOG" 2>&1 || { tail_logs "$MARIADB_LOG"; die "mariadb-install-db failed"; }
    fi
    log "mariadb: starting"
    setsid -f mariadbd --user=mysql --datadir=/var/lib/mysql --pid-file="$MYSQL_PID" --socket="$MYSQL_SOCK" \
        --bind-address=127.0.0.1 --log-error="$MARIADB_LOG" --innodb-lock-wait-timeout=900 \
        </dev/null >>"$MARIADB_LOG" 2>&1
    wait_until "mariadb (mariadb-admin ping)" "$TIMEOUT" "$MARIADB_LOG" mysql_ok
    log "mariadb: up"
fi
mariadb --protocol=socket --socket="$MYSQL_SOCK" -u root <<SQL || die "creating the slurm database user failed"
CREATE DATABASE IF NOT EXISTS \`$DB_NAME\`;
CREATE USER IF NOT EXISTS '$DB_USER'@'localhost' IDENTIFIED BY '$DB_PASS';
ALTER USER '$DB_USER'@'localhost' IDENTIFIED BY '$DB_PASS';
GRANT ALL PRIVILEGES ON \`$DB_NAME\`.* TO '$DB_USER'@'localhost';
SQL

# ---------------------------------------------------------------------------------------------------------
# 5. slurmdbd, then register the cluster
# ---------------------------------------------------------------------------------------------------------
dbd_ok() { sacctmgr -n -P list cluster format=cluster; }
if [[ -z ${RESTART[slurmdbd]:-} ]] && pid_alive "$SLURMDBD_PID" slurmdbd >/dev/null && dbd_ok >/dev/null 2>&1; then
    log "slurmdbd: running"
else
    stop_daemon slurmdbd "$SLURMDBD_PID" slurmdbd
    log "slurmdbd: starting"
    slurmdbd >>"$LOG_DIR/slurmdbd.start.log" 2>&1 \
        || { tail_logs "$LOG_DIR/slurmdbd.start.log" "$LOG_DIR/slurmdbd.log"; die "slurmdbd failed to start"; }
    wait_until "slurmdbd (sacctmgr list cluster)" "$TIMEOUT" "$LOG_DIR/slurmdbd.log $LOG_DIR/slurmdbd.start.log" dbd_ok
    log "slurmdbd: up"
fi
if ! sacctmgr -n -P list cluster format=cluster | grep -qx "$CLUSTER_NAME"; then
    log "sacctmgr: adding cluster $CLUSTER_NAME"
    sacctmgr -i add cluster "$CLUSTER_NAME" >/dev/null
    RESTART[slurmctld]=1   # a running slurmctld registered before the cluster existed; let it re-register
fi

# ---------------------------------------------------------------------------------------------------------
# 6. slurmctld
# ---------------------------------------------------------------------------------------------------------
ctld_ok() { scontrol ping | grep -q 'is UP'; }
if [[ -z ${RESTART[slurmctld]:-} ]] && pid_alive "$SLURMCTLD_PID" slurmctld >/dev/null && ctld_ok 2>/dev/null; then
    log "slurmctld: running"
else
    stop_daemon slurmctld "$SLURMCTLD_PID" slurmctld
    log "slurmctld: starting"
    SLURM_CONF=$SLURM_ETC/slurm.conf slurmctld >>"$LOG_DIR/slurmctld.start.log" 2>&1 \
        || { tail_logs "$LOG_DIR/slurmctld.start.log" "$LOG_DIR/slurmctld.log"; die "slurmctld failed to start"; }
    wait_until "slurmctld (scontrol ping)" "$TIMEOUT" "$LOG_DIR/slurmctld.log $LOG_DIR/slurmctld.start.log" ctld_ok
    log "slurmctld: up"
fi

# ---------------------------------------------------------------------------------------------------------
# 7. slurmd x2 (node1, node2 on this host; distinct ports, spool dirs, pid/log files, mpi.conf)
# ---------------------------------------------------------------------------------------------------------
declare -A STARTED_AT=()
to_start=()
for n in "${NODES[@]}"; do
    if [[ -z ${RESTART[$n]:-} ]] && pid_alive "$(slurmd_pidfile "$n")" slurmd >/dev/null; then
        log "slurmd $n: running"
    else
        to_start+=("$n")
    fi
done
for n in "${to_start[@]}"; do stop_daemon "slurmd $n" "$(slurmd_pidfile "$n")" slurmd & done
wait
for n in "${to_start[@]}"; do
    log "slurmd $n: starting"
    STARTED_AT[$n]=$(($(date +%s) - 1))
    SLURM_CONF=$(node_etc "$n")/slurm.conf slurmd -N "$n" >>"$LOG_DIR/slurmd-$n.start.log" 2>&1 \
        || { tail_logs "$LOG_DIR/slurmd-$n.start.log" "$LOG_DIR/slurmd-$n.log"; die "slurmd $n failed to start"; }
done

# ---------------------------------------------------------------------------------------------------------
# 8. Nodes idle (resume DOWN/DRAIN), accounting reachable
# ---------------------------------------------------------------------------------------------------------
# registered N: the slurmd (re)started by this run has registered with slurmctld (SlurmdStartTime is its start).
registered() {
    local t
    [[ -n ${STARTED_AT[$1]:-} ]] || return 0
    t=$(scontrol show node "$1" -o | grep -o 'SlurmdStartTime=[^ ]*' | cut -d= -f2)
    [[ -n $t && $t != None && $t != Unknown ]] && (($(date -d "$t" +%s) >= STARTED_AT[$1]))
}
nodes_ready() {
    local states bad n
    for n in "${NODES[@]}"; do registered "$n" || return 1; done
    states=$(sinfo -h -N -p debug -o '%N %T' 2>/dev/null) || return 1
    [[ $(wc -l <<<"$states") -eq ${#NODES[@]} ]] || return 1
    bad=$(awk '$2 !~ /^(idle|mixed|allocated|completing)$/ {print $1}' <<<"$states")
    if [[ -n $bad ]]; then
        if grep -Eq 'down|drain|fail' <<<"$(sinfo -h -N -o '%T' -n "$(paste -sd, <<<"$bad")")"; then
            scontrol update nodename="$(paste -sd, <<<"$bad")" state=resume >/dev/null 2>&1 || true
        fi
        return 1
    fi
}
node_logs="$LOG_DIR/slurmctld.log"
for n in "${NODES[@]}"; do
    wait_until "slurmd $n (pid file $(slurmd_pidfile "$n"))" 15 "$LOG_DIR/slurmd-$n.start.log $LOG_DIR/slurmd-$n.log" \
        pid_alive "$(slurmd_pidfile "$n")" slurmd
    node_logs+=" $LOG_DIR/slurmd-$n.log"
done
if ! nodes_ready; then
    wait_until "node1, node2 idle in sinfo" "$TIMEOUT" "$node_logs" nodes_ready
fi
log "nodes: $(sinfo -h -N -p debug -o '%N=%T' | paste -sd' ')"

elapsed_total=$(elapsed)
cat >&2 <<EOF
[up.sh] cluster '$CLUSTER_NAME' is up in ${elapsed_total}s: partitions debug (default) and short (MaxTime 5 min), nodes node1 node2 ($NODE_CPUS CPUs, 4 GPUs each) on $HOST.
[up.sh] before srun --mpi=pmix / mpirun:  source $HERE/env.sh
[up.sh]   (export OMPI_MCA_btl=self,tcp PMIX_MCA_gds=hash OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1)
[up.sh] logs: $LOG_DIR/{slurmctld,slurmdbd,slurmd-node1,slurmd-node2,mariadb}.log, /var/log/munge/munged.log
EOF
