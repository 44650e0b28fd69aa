"""What the CUDA and Metal backends share.

* ``prelude/tn_scalar.h``: the portable scalar semantics (C++14 valid in CUDA
  C++ and the Metal Shading Language), included by each dialect's prelude;
* ``shim/tn_runtime.h``: the emulator's dialect-free runtime (threads as
  fibers, interleaving policies, shared-memory poison, barrier and
  collective checks, TSan annotations), under one thin header per dialect
  (``shim/tn_cuda_shim.h``: CUDA's spelling and NVIDIA's instructions);
* ``emulator``: compiles a generated source as host C++ against a dialect's
  header and runs it under the target profile's limits."""

import os


def prelude_dir() -> str:
    """The folder of the portable scalar prelude (``tn_scalar.h``)."""
    return os.path.join(os.path.dirname(__file__), "prelude")
