# mpi_env.sh — sourced by the bench/run_*.sh scripts that launch mpirun on this machine: Open MPI as root,
# shared-memory transport without the single-copy mechanism (containers deny it), one thread per rank unless
# the caller set OMP_NUM_THREADS / OPENBLAS_NUM_THREADS, and run() to echo each command before running it.
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_btl_vader_single_copy_mechanism=none
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1} OPENBLAS_NUM_THREADS=${OPENBLAS_NUM_THREADS:-1}
run() { echo "\$ $*"; "$@"; echo; }
