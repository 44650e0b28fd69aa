"""Data for the proof-obligation tests: small kernels (``kernels.py``) and the
mutation corpus of (wrong, right) pairs (``cases.py``)."""
