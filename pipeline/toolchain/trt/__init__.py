"""TensorRT engine building (run in a child process per flavour) and flavour detection."""
