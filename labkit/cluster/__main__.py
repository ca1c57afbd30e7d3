"""`python -m labkit.cluster --port 0 --policy prefix_affinity`: the router, one command (notebook 08, section 2;
labkit.cluster.launch starts it as a child process).

    python -m labkit.cluster --port 9000 --policy round_robin --heartbeat-timeout 1.0
    python -m labkit.serving --model data/tinylm --port 0 --register http://127.0.0.1:9000   # a replica joins
    curl localhost:9000/replicas                                                              # who is there

It listens at once and prints one line to stdout, "routing on http://HOST:PORT/v1" (port 0: a free port, read it
from that line), then serves until SIGTERM or SIGINT (exit code 0). /health answers 503 until a replica has
registered. A bad option exits with code 2 and a message; a port that cannot be bound too.
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading

from ..serving import ServerThread
from .policies import ROUTING_POLICIES, make_policy
from .registry import Registry
from .router import Router, make_router_app


def _number(kind, low: float, what: str):
    """An argparse type: `kind` (int or float) of at least `low` (a float: strictly above it)."""
    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be {what}, got {text!r}") from None
        if value < low or (kind is float and value == low) or value != value or value == float("inf"):
            raise argparse.ArgumentTypeError(f"must be {what}, got {text}")
        return value
    return parse


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m labkit.cluster", description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    seconds = _number(float, 0.0, "a positive number of seconds")
    parser.add_argument("--port", type=int, default=9000, help="TCP port (0: pick a free one)")
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    parser.add_argument("--log-level", default="warning", choices=("debug", "info", "warning", "error"))
    parser.add_argument("--policy", choices=ROUTING_POLICIES, default="prefix_affinity", help="how a replica is chosen")
    parser.add_argument("--prefix-chars", type=_number(int, 1, "a positive int"), default=64,
                        help="prompt characters prefix affinity hashes (default 64)")
    parser.add_argument("--heartbeat-timeout", type=seconds, default=1.0, metavar="S",
                        help="a replica silent this long is removed (default 1.0 s)")
    parser.add_argument("--retries", type=_number(int, 0, "a non-negative int"), default=2,
                        help="re-sends to other replicas before the first byte (default 2)")
    parser.add_argument("--connect-timeout", type=seconds, default=1.0, metavar="S", help="upstream connect timeout")
    parser.add_argument("--read-timeout", type=seconds, default=30.0, metavar="S",
                        help="upstream timeout between two reads (default 30 s)")
    args = parser.parse_args(argv)
    if not 0 <= args.port <= 65535:
        parser.error(f"--port must be in [0, 65535], got {args.port}")
    return args


def build_router(args: argparse.Namespace) -> Router:
    """The Router the options describe."""
    options = {"chars": args.prefix_chars} if args.policy == "prefix_affinity" else {}
    return Router(Registry(heartbeat_timeout=args.heartbeat_timeout), make_policy(args.policy, **options),
                  retries=args.retries, connect_timeout=args.connect_timeout, read_timeout=args.read_timeout)


def main(argv=None) -> int:
    args = parse_args(argv)
    app = make_router_app(build_router(args))
    try:  # listening at once: /health says 503 until a replica registers
        server = ServerThread(app, args.host, args.port, args.log_level).start()
    except OSError as e:
        print(f"cannot listen on {args.host}:{args.port}: {e}", file=sys.stderr)
        return 2
    stopped = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stopped.set())
    signal.signal(signal.SIGINT, lambda *_: stopped.set())
    print(f"routing on {server.url}/v1", flush=True)  # launchers signal only after this line
    while not stopped.wait(0.5):
        pass
    server.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
