"""The soak under random faults: a long study on a real llama-server with seeded faults, then an
audit of the study (driver.py; audit.py; engine.py is the engine command that injects start faults).
tests/search/test_soak.py runs a short one; the long one by hand, from the repository root:

    flock /tmp/flagsearch-measure.lock .venv/bin/python -m tests.soak --trials 40 --seed 44 --rate 0.5 \
        --postgres --max-tokens 32 --request-timeout 10 --out tests/soak/soak_40.json
"""
