"""Triton kernels for the fused ops; each is checked against its reference term."""
