"""What importing a torchvision built for another torch does (a CUDA wheel beside the CPU torch here): its
C++ operators do not register, and the import fails with this error, which names neither package."""

raise RuntimeError("operator torchvision::nms does not exist")
