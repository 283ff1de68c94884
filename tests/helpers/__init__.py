"""Code the tests share: plain-PyTorch oracles, small models, data and program runners.
Test modules import from here, never from each other."""
