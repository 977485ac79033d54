"""Graph passes between tracing and a backend: simplify, then (per backend) fuse and plan memory."""
