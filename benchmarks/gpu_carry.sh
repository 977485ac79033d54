#!/usr/bin/env bash
# Fill .gpu-carry (git-ignored through .git/info/exclude) with what the lent GPU machine lacks and
# cannot fetch (it is offline): Debian's Boost.Context (the CUDA simulator's fibers, for the tests
# that compare the card's bits with the simulator's) and this venv's scipy_openblas32 (the CPU
# trainer the CUDA trainer's losses are compared with). ~36 MB; name it in the device tool's carry.
set -eu
cd "$(dirname "$0")/.."
mkdir -p .gpu-carry/debs .gpu-carry/site
grep -qx "/.gpu-carry/" .git/info/exclude 2>/dev/null || echo "/.gpu-carry/" >> .git/info/exclude
(cd .gpu-carry/debs && apt-get download libboost-context1.74.0 libboost-context1.74-dev libboost1.74-dev)
cp -r "$(.venv/bin/python -c 'import scipy_openblas32, os; print(os.path.dirname(scipy_openblas32.__file__))')" .gpu-carry/site/
du -sh .gpu-carry
