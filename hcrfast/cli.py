"""The ``hcrfast`` command line.

Each family of subcommands lives in its own module with an ``add_subparser``
function that registers it and sets ``func`` (a callable taking the parsed
arguments and returning an exit code).
"""
from __future__ import annotations

import argparse
import sys
import warnings


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="hcrfast",
        description="Hammersley-Chapman-Robbins confidentiality bounds for neural-network features.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    from hcrfast import _bound_cli, _dp_cli, _repro_cli, train

    train.add_subparser(sub)
    _repro_cli.add_subparser(sub)
    _bound_cli.add_subparser(sub)
    _dp_cli.add_subparser(sub)
    return parser


def _format_warning(message, category, filename, lineno, line=None) -> str:
    """Warnings on the command line: one line, without the source line Python would print."""
    return f"hcrfast: warning: {message}\n"


def main(argv=None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    saved_format = warnings.formatwarning
    warnings.formatwarning = _format_warning
    try:
        return int(args.func(args) or 0)
    except (ValueError, TypeError, OSError, NotImplementedError) as exc:  # OSError: files and folders
        print(f"hcrfast: error: {exc}", file=sys.stderr)
        return 2
    except RuntimeError as exc:
        from hcrfast.data import DownloadError  # imported here: --help stays fast
        from hcrfast.distributed import ShardError

        if not isinstance(exc, (DownloadError, ShardError)):
            raise
        # No network, or another torchrun process's failure: the message says what to do.
        print(f"hcrfast: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        resume = ("; the chunks that finished are kept, and the same command resumes"
                  if args.command in ("reproduce", "bound") else "")
        print(f"hcrfast: interrupted{resume}", file=sys.stderr)
        return 130
    finally:
        warnings.formatwarning = saved_format


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
