"""Load scenarios (docs/benchmarking.md, "Load scenarios"): MLPerf LoadGen drives each candidate through a dynamic
batcher with Poisson arrivals of the recipe's own samples (requests.py, batcher.py, loadgen_run.py), and a search
finds the highest rate whose p99 meets the recipe's target (search.py)."""
