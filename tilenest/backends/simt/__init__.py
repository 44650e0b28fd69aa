"""What the CUDA and Metal backends share. ``emulator``: the host emulator that
compiles generated GPU source as host C++ against a shim and runs every GPU
thread as a fiber (interleaving policies, shared-memory poison, a TSan build)."""
