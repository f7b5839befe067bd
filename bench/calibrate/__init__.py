"""The gate's calibration: how often `search ab`'s verdict is wrong (false alarms on A/A) and how
often it finds a known change (power), measured live and replayed on stored data.

    python -m bench.calibrate measure ...   # live: interleaved A/B repetitions through search.regress.ab
    python -m bench.calibrate analyze F...  # a measure file (or an older rounds file): rates, noise
    python -m bench.calibrate confirmations F...  # paired noise of stored `search run` confirmations
    python -m bench.calibrate gpu CSV       # the gate replayed on the H100 calibration rounds
    python -m bench.calibrate power ...     # H100 noise components and resampled/model power
    python -m bench.calibrate simulate ...  # the gate on simulated noise components
    python -m bench.calibrate errors        # the error-rate verdict on simulated counts
    python -m bench.calibrate bound ...     # starts any paired test needs at a measured noise (computed)

Every verdict is the product's: search.regress.ab's sequential stop rule and report (bench.calibrate.gate),
so a change to the gate reaches every rate these commands print. The noise components and the
Clopper-Pearson bounds are harness.measure.stats'.
"""
