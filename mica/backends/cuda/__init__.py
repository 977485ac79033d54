"""The NVIDIA target: CUDA C from the shared pipeline (render.py), built by nvcc or run on the CPU
simulator (mica_cudasim.h) that runs the very same source where there is no GPU."""
