#!/usr/bin/env bash
# Stop the hpc-serve test cluster's daemons (by the pids in their pid files): slurmd x2, slurmctld, slurmdbd,
# mariadb, munged. Config, state and the database are kept; ci/cluster/up.sh starts everything again.
#   ci/cluster/down.sh            # all daemons
#   ci/cluster/down.sh --slurm    # only the Slurm daemons (keep munged and mariadb)
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=common.sh
source "$HERE/common.sh"
[[ $(id -u) -eq 0 ]] || die "must run as root"

# Stop in parallel where order does not matter; slurmdbd after slurmctld (pending accounting records), then
# mariadb and munged last.
for n in "${NODES[@]}"; do stop_daemon "slurmd $n" "$(slurmd_pidfile "$n")" slurmd & done
stop_daemon slurmctld "$SLURMCTLD_PID" slurmctld &
wait
stop_daemon slurmdbd "$SLURMDBD_PID" slurmdbd
if [[ ${1:-} != --slurm ]]; then
    stop_daemon mariadb "$MYSQL_PID" mariadbd &
    stop_daemon munged "$MUNGE_PID" munged &
    wait
fi
log "stopped"
