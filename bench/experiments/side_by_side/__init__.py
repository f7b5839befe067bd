"""The side-by-side design against fresh starts in turns: python -m bench.experiments.side_by_side.run."""
