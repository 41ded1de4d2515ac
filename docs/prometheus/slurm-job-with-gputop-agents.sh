#!/bin/bash
# A Slurm batch script with one gputop agent per node of the allocation, as the job's own user, gone
# with the job: each node's ranks report to their node's agent on the per-user socket (nothing to set),
# and the cluster's Prometheus scrapes every GPU node's :9465 (docs/prometheus.md, "One exporter per
# node"; the nodes from file_sd or a static list of the partition's).
#SBATCH --job-name=train
#SBATCH --nodes=4
#SBATCH --ntasks-per-node=1
#SBATCH --gpus-per-node=8
set -euo pipefail

# One agent a node, in a job step of its own that shares the allocation's CPUs and GPUs (--overlap): it
# reads the GPUs through NVML, which the cgroup only allows a step that was given them, and makes no CUDA
# context on any.
srun --overlap --ntasks-per-node=1 --gpus-per-node=8 \
    gputop agent --prometheus :9465 --hostname "$(hostname -s)" &
agents=$!

head=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)
srun torchrun --nnodes="$SLURM_NNODES" --nproc-per-node=8 --rdzv-backend=c10d \
    --rdzv-endpoint="$head:29500" train.py   # train.py calls gputop.watch(model) and gputop.track(loader)

kill "$agents"  # SIGTERM: each agent stops serving and leaves (0)
wait "$agents" || true
