"""One-off experiments kept with their data (each folder has a README.md: what, when, how)."""
