"""The soak's engine command (tests/soak/driver.py): runs llama-server unchanged, or with one armed fault
at its start. FAULT-INJECTION FIXTURE: the real llama-server still runs in every case.

    python tests/soak/engine.py FAULT_DIR LLAMA_SERVER [ARGS...]

The soak arms a fault by creating FAULT_DIR/oom or FAULT_DIR/port. The first start that finds one
takes it (a rename to <name>.taken.<pid>, so exactly one start gets each, and the soak sees which
process did: exec keeps the PID) and injects it the way tests/harness/test_faults.py does:
- oom: the KV cache of a 1M-token context (-c 1000000, ~23 GB) under a 2 GB address-space limit
  (prlimit) with `--fit off`, so llama.cpp fails to allocate instead of growing for minutes.
- port: a socket listens on the server's port before llama-server binds it (another program took
  the port between the tool's check and the engine's bind); llama-server's own log says so.
Otherwise the wrapper simply execs llama-server. Standard library only: it runs at every start.
"""

from __future__ import annotations

import os
import socket
import sys

OOM_ARGS = ["-c", "1000000", "--fit", "off"]  # a later -c wins over the space's ctx_size
ADDRESS_LIMIT = "--as=2000000000"


def take(fault_dir: str, name: str) -> bool:
    try:
        os.rename(os.path.join(fault_dir, name), os.path.join(fault_dir, f"{name}.taken.{os.getpid()}"))
        return True
    except FileNotFoundError:
        return False


def value_after(args: list[str], flag: str, default: str) -> str:
    return args[args.index(flag) + 1] if flag in args and args.index(flag) + 1 < len(args) else default


def main() -> None:
    fault_dir, binary, args = sys.argv[1], sys.argv[2], sys.argv[3:]
    if take(fault_dir, "oom"):
        os.execvp("prlimit", ["prlimit", ADDRESS_LIMIT, binary, *args, *OOM_ARGS])
    if take(fault_dir, "port"):
        holder = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        holder.bind((value_after(args, "--host", "127.0.0.1"), int(value_after(args, "--port", "8080"))))
        holder.listen()
        os.set_inheritable(holder.fileno(), True)  # held by the engine process itself, gone with it
    os.execv(binary, [binary, *args])


if __name__ == "__main__":
    main()
