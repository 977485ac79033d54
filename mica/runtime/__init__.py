"""The native trainer's C runtime (package data; see runtime.h for its modules)."""
