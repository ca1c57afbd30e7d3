"""Inside a grading kernel: no network, and every exercise check recorded where the grader can read it.

labkit.course.submission starts each submitted notebook's kernel as

    [unshare --net] python -m labkit.course.sandbox -f CONNECTION_FILE

(the kernel gets a network namespace of its own when `unshare` works on this machine: only its own loopback,
brought up here so that local sockets keep working), and runs install() before the first cell:

- an audit hook refuses every socket connection, lookup or datagram to a host other than this machine's
  loopback, so even without `unshare` a notebook cannot reach the network from Python;
- labkit.course.check.exercise is wrapped: each call still prints its verdict as before, and also shows a
  record of it, {"nonce", "exercise", "verdict", "message"}, as a display output of type MIME. The grader
  keeps only records that carry the nonce it handed to this kernel, from the cells it knows as check cells.
  "exercise" is the stable id of the Exercise object the check ran on, "?" when that object is not the
  course's own (replaced or changed after the kernel started), None for a check against a plain function.

This stops the ordinary ways a check can be faked (a check cell edited to print "[PASS]", check.exercise
or an Exercise replaced in an earlier cell); it is not a sandbox against code written to defeat the grader.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import io
import json
import os
import sys

MIME = "application/vnd.labkit.check+json"
ENV_NONCE = "LABKIT_GRADER_NONCE"
ENV_EXERCISES = "LABKIT_GRADER_EXERCISES"  # JSON [[id, module, attribute], ...] (labkit.course.labs.Lab.modules)
ENV_NETNS = "LABKIT_GRADER_NETNS"  # "1" when the kernel was started in a network namespace of its own
LOOPBACK = ("localhost", "127.0.0.1", "::1", "")


def is_local(host) -> bool:
    """True for this machine's loopback (names, 127.0.0.0/8, ::1), a Unix socket path, or no host at all."""
    if isinstance(host, (bytes, bytearray)):
        host = host.decode(errors="replace")
    return host is None or not isinstance(host, str) or host in LOOPBACK or host.startswith("127.")


def network_guard(event: str, args: tuple) -> None:
    """An audit hook (sys.addaudithook): PermissionError for any socket use that leaves this machine."""
    if event in ("socket.connect", "socket.sendto", "socket.sendmsg") and len(args) > 1:
        address = args[1]
        host = address[0] if isinstance(address, tuple) and address else None
    elif event in ("socket.getaddrinfo", "socket.gethostbyname", "socket.gethostbyname_ex"):
        host = args[0] if args else None
    else:
        return
    if not is_local(host):
        raise PermissionError(f"network access is off while grading (tried to reach {host!r})")


def loopback_up() -> bool:
    """Bring up the `lo` interface (it starts down in a new network namespace); False when that is refused."""
    import fcntl
    import socket
    import struct

    siocgifflags, siocsifflags, iff_up = 0x8913, 0x8914, 0x1
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            flags = struct.unpack("16sH14x", fcntl.ioctl(s, siocgifflags, struct.pack("16sH14x", b"lo", 0)))[1]
            fcntl.ioctl(s, siocsifflags, struct.pack("16sH14x", b"lo", flags | iff_up))
        return True
    except OSError:
        return False


def _fields(ex) -> tuple:
    return tuple(getattr(ex, f.name) for f in dataclasses.fields(ex))


def verdict_of(printed: str) -> tuple[str, str]:
    """(PASS | FAIL | TODO | ERROR, message) from what a check printed: its verdict line is the last thing it
    prints, after anything the learner's function printed while it ran, so the last tag found counts."""
    found = max((printed.rfind(f"[{tag}] "), tag) for tag in ("PASS", "FAIL", "TODO"))
    if found[0] < 0:
        return "ERROR", printed.strip()
    return found[1], printed[found[0] + len(found[1]) + 3:].split("\n")[0].strip()


def install() -> None:
    """Turn the network off (audit hook) and record every check; reads and removes ENV_NONCE and
    ENV_EXERCISES from the environment, so the notebook's code does not see them."""
    from IPython.display import display

    from . import check

    sys.addaudithook(network_guard)
    nonce = os.environ.pop(ENV_NONCE, "")
    known = {}
    for ident, module, attr in json.loads(os.environ.pop(ENV_EXERCISES, "[]")):
        ex = getattr(importlib.import_module(module), attr)
        known[id(ex)] = (ident, ex, _fields(ex))
    pristine = check.exercise

    def exercise(fn, reference, *args, **kwargs):
        record = {"nonce": nonce, "exercise": None, "verdict": "ERROR", "message": ""}
        if isinstance(reference, check.Exercise):
            ident, ex, fields = known.get(id(reference), ("?", None, ()))
            same = ex is reference and all(a is b for a, b in zip(_fields(reference), fields))
            record["exercise"] = ident if same else "?"
        out = io.StringIO()
        try:
            with contextlib.redirect_stdout(out):
                result = pristine(fn, reference, *args, **kwargs)
            record["verdict"], record["message"] = verdict_of(out.getvalue())
            if record["verdict"] == "PASS" and (result is not fn or fn is reference):
                record["verdict"] = "ERROR"  # a PASS line, but the check did not hand back the learner's function
            return result
        except BaseException as e:
            record["message"] = f"the check raised {type(e).__name__}: {e}"
            raise
        finally:
            sys.stdout.write(out.getvalue())
            display({MIME: record}, raw=True)

    check.exercise = exercise


def main() -> None:
    """The kernel: loopback up (inside its own network namespace), then ipykernel as ipykernel_launcher does."""
    if sys.path and sys.path[0] in ("", os.getcwd()):
        del sys.path[0]
    if os.environ.pop(ENV_NETNS, "") == "1":
        loopback_up()
    from ipykernel import kernelapp

    kernelapp.launch_new_instance()


if __name__ == "__main__":
    main()
