"""``python -m bench.soak``."""

import signal
import sys

from bench.soak.run import main

if __name__ == "__main__":
    # SIGTERM (timeout, a CI runner) stops the stack too, as Ctrl-C does.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    raise SystemExit(main())
