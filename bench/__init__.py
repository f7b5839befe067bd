"""bench: a small toolbox on the product, run from the repository root as `python -m bench.<tool>`.

Entry points (each prints its own --help):
- bench.ground_truth    every config of a table space x its load levels, measured: a CSV (and `show`)
- bench.calibrate       the gate's false alarms and power: interleaved A/B repetitions, replays, simulations
- bench.replay          searches replayed over a ground-truth table (no engine)
- bench.client_ceiling  how fast the streaming client can go (a stand-in server, no engine)
- bench.external        the built-in client beside external benchmark tools, on one server
- bench.quality         what the quality suite catches (big) and what it costs (overhead)
- bench/gpu/run.sh      the device-side driver of the GPU runs (bench.gpu.kit: its helpers)

Everything that starts a server does it through the product's one door, harness.Session.run
(bench.common.run_config), so a change to the measurement reaches every number published here.
The raw data are in bench/data/; the table spaces in bench/tables/; one-off experiments, with
their data, in bench/experiments/.
"""
