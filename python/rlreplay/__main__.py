"""The ``rlreplay`` command (``python -m rlreplay``): the command-line tool of the cargo build,
linked into the module, with its arguments, output and exit codes."""

import os
import signal
import sys
import threading

from . import _rlreplay


def main() -> int:
    """Runs ``rlreplay`` with ``sys.argv[1:]`` and returns its exit code."""
    cli = getattr(_rlreplay, "cli_main", None)
    if cli is None:
        print(
            "rlreplay: this build of the module has no command line (built without the "
            "`cli` feature of crates/rlreplay-py)",
            file=sys.stderr,
        )
        return 2
    # As the binary does: candle's elementwise CPU ops on the calling thread, and Ctrl-C ends
    # the process (Python's handler would wait for the command to return).
    os.environ.setdefault("CANDLE_NUM_THREADS", "1")
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGINT, signal.SIG_DFL)
    sys.stdout.flush()
    sys.stderr.flush()
    return cli(["rlreplay", *sys.argv[1:]])


if __name__ == "__main__":
    sys.exit(main())
