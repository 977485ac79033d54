#!/usr/bin/env bash
# Fill .gpu-carry (git-ignored through .git/info/exclude) with what the lent GPU machine lacks and
# cannot fetch (it is offline): Debian's Boost.Context (the CUDA simulator's fibers, for the tests
# that compare the card's bits with the simulator's) and this venv's scipy_openblas32 (the CPU
# trainer the CUDA trainer's losses are compared with). ~36 MB; name it in the device tool's carry.
set -eu
cd "$(dirname "$0")/.."
mkdir -p .gpu-carry/debs .gpu-carry/site
grep -qx "/.gpu-carry/" .git/info/exclude 2>/dev/null || echo "/.gpu-carry/" >> .git/info/exclude
if ! .venv/bin/python -c 'import scipy_openblas32' 2>/dev/null; then
    echo "gpu_carry.sh: this checkout has no .venv with scipy_openblas32 (the CPU trainer's BLAS); run" \
         "'make .venv/.core' first, then this again" >&2
    exit 1
fi
debs="libboost-context1.74.0 libboost-context1.74-dev libboost1.74-dev"
(cd .gpu-carry/debs && { apt-get download $debs || { apt-get update -qq && apt-get download $debs; }; })
cp -r "$(.venv/bin/python -c 'import scipy_openblas32, os; print(os.path.dirname(scipy_openblas32.__file__))')" .gpu-carry/site/
du -sh .gpu-carry
