"""The floor: the guard's server + TLS + a bare ASGI callable answering a constant (see baseline.raw_app)."""

import sys

from bench.baseline import main, raw_app

if __name__ == "__main__":
    sys.exit(main(app_factory=raw_app))
