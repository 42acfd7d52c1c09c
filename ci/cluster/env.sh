# shellcheck shell=bash
# Source before running MPI over the hpc-serve test cluster (ci/cluster/up.sh):   source ci/cluster/env.sh
# srun propagates the caller's environment to the ranks (--export=ALL is the default).
export OMPI_MCA_btl=self,tcp            # node1 and node2 are the same host: no shared-memory/openib btl across "nodes"
export PMIX_MCA_gds=hash                # PMIx 4 + Open MPI 4.1 under slurm's pmix plugin
export OMPI_ALLOW_RUN_AS_ROOT=1         # CI runs as root (needed by mpirun, harmless under srun)
export OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
