"""Tests of the fused operators, one file per operator, sharing `harness.py`."""
