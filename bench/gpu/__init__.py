"""The GPU runs: bench/gpu/run.sh on the device machine, its helpers as `python -m bench.gpu`."""
