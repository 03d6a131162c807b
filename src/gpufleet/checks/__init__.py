"""Active validation checks (GEMM, HBM, PCIe, NCCL, SDC, soak) run with PyTorch on GPU or CPU."""
