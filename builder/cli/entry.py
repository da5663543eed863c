"""Console entry point: runs the CLI and turns any escaped exception into exit 101,
with its traceback under ``tilekiln --debug`` or ``TILEKILN_DEBUG=1``.

Kept free of third-party imports so that an environment missing one of the
build tool's dependencies (installed with ``--no-deps``, or damaged) gets a
one-line explanation instead of an ImportError traceback.
"""

from __future__ import annotations

import sys
import traceback


def main() -> None:
    try:
        from builder.cli.commands import main as cli
        from builder.cli.commands import wants_traceback
    except ImportError as exc:
        print(f"tilekiln: the command line needs the build tool's dependencies ({exc.name} is missing); "
              "install them with: pip install tilekiln-build", file=sys.stderr)
        sys.exit(2)
    try:
        cli(prog_name="tilekiln")
    except KeyboardInterrupt:
        print("tilekiln: interrupted", file=sys.stderr)
        sys.exit(130)
    except Exception as exc:  # noqa: BLE001 - last line of defence, reported as a bug
        if wants_traceback(sys.argv[1:]):
            traceback.print_exc()
            report = "please report it with the command you ran and the traceback above"
        else:
            report = "rerun with --debug for the traceback, and report it with the command you ran"
        print(f"tilekiln: internal error: {type(exc).__name__}: {exc}\nthis is a bug in tilekiln; {report}",
              file=sys.stderr)
        sys.exit(101)
