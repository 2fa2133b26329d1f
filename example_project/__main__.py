"""``python -m example_project demo [options]``: see ``python -m example_project demo --help``."""

from __future__ import annotations

import sys

USAGE = """usage: python -m example_project demo [--redis-url URL] [--pool POOL] [--ttl SECONDS]
                                     [--scene NAME] [--json PATH]

commands:
  demo    real Celery workers and a real Redis: duplicates, a SIGKILLed holder, a long
          renewed run, and a pause that outlives the lease (see demo --help)
  compare celery-lease, celery-once and celery-singleton on the same faults (needs
          pip install celery-once celery-singleton; see compare --help)
  chaos   random faults against many workers and keys for minutes, then a checker proves
          the lease's promises held over the whole history (see chaos --help)
"""


def main(argv: list[str] | None = None) -> int:
    """Dispatch the command line; returns the exit status."""
    args = sys.argv[1:] if argv is None else argv
    if not args or args[0] in ("-h", "--help"):
        sys.stdout.write(USAGE)
        return 0 if args else 2
    command, rest = args[0], args[1:]
    if command == "demo":
        from example_project.demo.cli import main as demo

        return demo(rest)
    if command == "compare":
        from example_project.compare.run import main as compare

        return compare(rest)
    if command == "chaos":
        from example_project.chaos.run import main as chaos

        return chaos(rest)
    sys.stderr.write(f"unknown command {command!r}\n{USAGE}")
    return 2


if __name__ == "__main__":
    sys.exit(main())
