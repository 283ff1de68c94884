"""The runtime: turns one host call into device_iterations x gradient_accumulation x replicas
micro-batch passes, applies the optimizer and assembles the outputs."""
