"""Measure the product implementations on the GPT's shapes (see gemm_shapes.c); prints a table.

    .venv/bin/pip install scipy-openblas32 mkl-devel   # the two libraries compared
    .venv/bin/python benchmarks/gemm.py [rounds]
"""
import glob
import os
import subprocess
import sys
import sysconfig

here = os.path.dirname(os.path.abspath(__file__))
runtime = os.path.join(here, "..", "mica", "backends", "c")
site = sysconfig.get_paths()["purelib"]
exe = os.path.join(here, "gemm_shapes")
subprocess.run(["gcc", "-O3", "-march=native", "-fopenmp", "-ffp-contract=off", "-I", runtime,
                os.path.join(here, "gemm_shapes.c"), "-o", exe, "-ldl", "-lm"], check=True)
env = dict(os.environ, OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "2"),
           OPENBLAS_NUM_THREADS="1", MKL_NUM_THREADS="1")
openblas = glob.glob(os.path.join(site, "scipy_openblas32", "lib", "libscipy_openblas*.so"))
mkl = glob.glob(os.path.join(sys.prefix, "lib", "libmkl_rt.so*"))
if openblas:
    env["OPENBLAS_LIB"] = openblas[0]
if mkl:
    env["MKL_LIB"] = mkl[0]
rows = subprocess.run([exe] + sys.argv[1:], env=env, capture_output=True, text=True, check=True).stdout.strip()
lines = rows.splitlines()
print("| " + " | ".join(lines[0].split(",")) + " |")
print("|" + "---|" * len(lines[0].split(",")))
for line in lines[1:]:
    print("| " + " | ".join(line.split(",")) + " |")
