#!/usr/bin/env bash
# One measurement round, as docs/performance.md reports it: the nine commands, each launch in
# the same order, every row in JSON under $OUT/L<launch>/, then the ratios per launch
# (benchmarks/round_summary.py). About 5 minutes a launch on 2 cores.
#
#   LAUNCHES="1 2 3" OUT=/tmp/round bash benchmarks/round.sh
#
# Run it with nothing else on the machine: the figures are ratios against MPI and gloo measured
# in the same launch, but a busy machine still moves them.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:?set OUT to a folder for the rows}
LAUNCHES=${LAUNCHES:-"1 2 3"}
PY=${PY:-.venv/bin/python}
MPIRUN=${MPIRUN:-$(dirname "$PY")/mpirun}
COLLECTIVES=reduce_scatter,all_gather,broadcast,all_to_all,gather,scatter,sendrecv
perf() { "$MPIRUN" -n "$1" "$PY" benchmarks/allreduce_perf.py --no-progress "${@:2}"; }
ddp() { "$PY" benchmarks/ddp_scaling.py --ranks 2 "$@"; }   # it starts mpirun from $PY's folder

for launch in $LAUNCHES; do
    dir=$OUT/L$launch
    mkdir -p "$dir"
    echo "== launch $launch ($(date -u +%H:%M:%S) UTC, load $(cut -d' ' -f1-3 /proc/loadavg))"
    perf 2 -b 1K -e 256M -f 4 --backend ringcomm,mpi4py --tensor numpy,torch --algorithm auto,persistent \
        -w 10 -n 1000 --iter-bytes 1G --min-iters 5 -r 3 --empty-buffers --json "$dir/allreduce.json" > "$dir/allreduce.txt"
    perf 2 -b 1K -e 1M -f 1024 --backend ringcomm,mpi4py --tensor numpy,torch --algorithm auto \
        -w 3 -n 300 --iter-bytes 1G --min-iters 5 -r 3 --collective $COLLECTIVES --empty-buffers \
        --json "$dir/coll_small.json" > "$dir/coll_small.txt"
    perf 2 -b 64M -e 64M --backend ringcomm,mpi4py --tensor numpy,torch --algorithm auto \
        -w 2 -n 20 --iter-bytes 1G --min-iters 5 -r 3 --collective $COLLECTIVES --empty-buffers \
        --json "$dir/coll_64m.json" > "$dir/coll_64m.txt"
    perf 2 -b 1M -e 64M -f 4 --backend ringcomm,mpi4py --tensor numpy,torch --algorithm auto \
        -w 2 -n 50 --iter-bytes 512M --min-iters 5 -r 3 --collective all_to_all,sendrecv --empty-buffers \
        --json "$dir/a2a_sr.json" > "$dir/a2a_sr.txt"
    perf 4 -b 1K -e 32M -f 4 --backend ringcomm --tensor numpy --algorithm auto,all \
        -w 5 -n 200 --iter-bytes 256M --min-iters 3 -r 3 --json "$dir/n4.json" > "$dir/n4.txt"
    perf 2 -b 1K -e 1M -f 1024 --backend mpi,gloo,mpi4py --algorithm auto -n 500 -r 3 \
        --json "$dir/reference.json" > "$dir/reference.txt"
    ddp --impl ringcomm,torch,torch-ringcomm \
        --steps 10 --warmup 2 --json "$dir/ddp_mlp.json" > "$dir/ddp_mlp.txt"
    ddp --impl ringcomm,torch \
        --steps 10 --warmup 2 --no-local --bucket-view --json "$dir/ddp_views.json" > "$dir/ddp_views.txt"
    ddp --impl ringcomm,torch,torch-ringcomm \
        --model transformer --width 256 --depth 4 --steps 20 --warmup 3 --json "$dir/ddp_tf.json" > "$dir/ddp_tf.txt"
done
"$PY" benchmarks/round_summary.py "$OUT"
