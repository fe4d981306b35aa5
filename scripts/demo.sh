#!/usr/bin/env bash
# The main job of libgpumem on the sim backend, from a fresh clone:
# build, run the basic example (two simulated devices: allocate, free, trim,
# reset, stats), then replay a real PyTorch training trace (fragmentation, speed).
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/deps.sh
cmake -S . -B build/demo -G Ninja -DCMAKE_BUILD_TYPE=Release -DGPUMEM_BUILD_TESTS=OFF >/dev/null
ninja -C build/demo
echo
echo "==== examples/basic.c on two simulated devices ===="
GPUMEM_BACKEND=sim GPUMEM_SIM_DEVICES=${GPUMEM_SIM_DEVICES:-2x16GiB} ./build/demo/examples/example_basic
echo
echo "==== gpumem-replay examples/traces/resnet50.txt.gz (sim backend) ===="
./build/demo/tools/gpumem-replay --repeat 3 examples/traces/resnet50.txt.gz
