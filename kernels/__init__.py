"""Kernels: implementations that plans bind nodes to (torch, and Triton under ``triton/``)."""
