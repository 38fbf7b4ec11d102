"""The ``hcrfast`` command line.

Each family of subcommands lives in its own module with an ``add_subparser``
function that registers it and sets ``func`` (a callable taking the parsed
arguments and returning an exit code).
"""
from __future__ import annotations

import argparse
import functools
import os
import re
import sys
import threading
import time
import warnings


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="hcrfast",
        description="Hammersley-Chapman-Robbins confidentiality bounds for neural-network features.",
    )
    parser.add_argument("--version", action=_Version, nargs=0,
                        help="print hcrfast's version and those of the packages it runs on, then exit")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    from hcrfast import _bound_cli, _dp_cli, _repro_cli, train

    train.add_subparser(sub)
    _repro_cli.add_subparser(sub)
    _bound_cli.add_subparser(sub)
    _dp_cli.add_subparser(sub)
    return parser


#: Distributions whose versions ``hcrfast --version`` names (what a bug report needs), in this order.
_VERSIONED = ("torch", "numpy", "scipy", "numba", "numba-cuda", "cupy-cuda12x", "cupy-cuda13x", "nvtx")


def version_line() -> str:
    """hcrfast's version, then Python's and the installed dependencies' (from the installed metadata,
    without importing them: ``--version`` stays instant). Absent optional ones are marked."""
    import platform
    from importlib import metadata

    def version(name):
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            return None

    from hcrfast import __version__

    parts = [f"Python {platform.python_version()}"]
    for name in _VERSIONED:
        v = version(name)
        if v is not None:
            parts.append(f"{name} {v}")
        elif name in ("torch", "numpy", "scipy", "numba"):
            parts.append(f"{name} not installed")
    if not any(version(name) for name in ("cupy-cuda12x", "cupy-cuda13x", "cupy")):
        parts.append('no CuPy (CPU only; GPU: pip install "hcrfast[cuda12]" or "hcrfast[cuda13]")')
    return f"hcrfast {__version__} ({', '.join(parts)})"


class _Version(argparse.Action):
    """``--version``: :func:`version_line` on one line (argparse's own action would wrap it)."""

    def __call__(self, parser, namespace, values, option_string=None):
        print(version_line())
        parser.exit()


def _format_warning(message, category, filename, lineno, line=None, args=None) -> str:
    """Warnings on the command line: one line, without the source line Python would print. hcrfast's own
    (:class:`hcrfast.HcrfastWarning`) are said in the command's flags (:func:`shell_text`; ``args``: the parsed
    command line, None before it is parsed); another's (the user's model's, a library's) is printed as it was
    written, with its category: its keywords are not hcrfast's."""
    from hcrfast.validation import HcrfastWarning

    if isinstance(category, type) and issubclass(category, HcrfastWarning):
        return f"hcrfast: warning: {shell_text(str(message), args)}\n"
    return f"hcrfast: warning: {getattr(category, '__name__', 'Warning')}: {message}\n"


def float_literal(text: str) -> float:
    """A float flag's value, refused where float64 would silently change a nonzero number.

    ``float("1e-400")`` is 0.0, ``float("1e400")`` inf and ``float("1e-320")`` a subnormal with five correct
    digits: the library would then reject 0 or inf as if the user had typed them, or compute with another number.
    The value returned remembers the text typed (:func:`as_typed`), so that a refusal echoes ``--sigma-scale 0``
    as the user wrote it, not ``0.0``.
    """
    import decimal
    import math

    try:
        value = float(text)
        exact = decimal.Decimal(text.strip().replace("_", ""))
    except (ValueError, decimal.InvalidOperation):
        raise argparse.ArgumentTypeError(f"invalid float value: {text!r}") from None
    if exact.is_finite() and exact != 0 and not (sys.float_info.min <= abs(value) < math.inf):
        raise argparse.ArgumentTypeError(
            f"{text} is outside float64's normal range [2.2251e-308, 1.7976e+308] (it would be read as "
            f"{value:.6g}); pass a value in that range"
        )
    return _TypedFloat(value, text)


def int_literal(text: str) -> int:
    """An integer flag's value: its digits, or a whole number written as a float up to 2**53 (``--T 1e5``, which
    ``type=int`` refused as "invalid int value: '1e5'", naming no fix)."""
    import decimal

    plain = text.strip().replace("_", "")
    try:
        return int(plain)
    except ValueError:
        pass
    try:
        exact = decimal.Decimal(plain)
    except decimal.InvalidOperation:
        raise argparse.ArgumentTypeError(f"invalid integer value: {text!r}; pass a whole number (1000, or 1e3)") \
            from None
    if not exact.is_finite() or exact != exact.to_integral_value() or abs(exact) > 2**53:
        raise argparse.ArgumentTypeError(f"{text} is not a whole number up to 2**53; pass one (1000, or 1e3)")
    return int(exact)


class _TypedFloat(float):
    """A float that keeps the text it was parsed from (``typed``), for messages only: arithmetic gives plain
    floats, and pickling stores a plain float."""

    __slots__ = ("typed",)

    def __new__(cls, value: float, typed: str):
        self = super().__new__(cls, value)
        self.typed = typed.strip()
        return self

    def __reduce__(self):
        return float, (float(self),)


def as_typed(value) -> str:
    """A flag's value as the user typed it (a :func:`float_literal`'s text), else its repr (a default)."""
    return getattr(value, "typed", None) or repr(value)


# The Python layer's messages name its keywords (``solver='dense'``, ``rtol must be ...``); on the command line
# they are said again in the flags that set them (``--solver dense``), by one table per command. A value maps to
# what the command line says for it where the flag takes none (``warm_start=False``: ``--cold-start``).
_SHARED_FLAGS = {
    "seed": "--seed", "solver": "--solver", "linearize_at": "--linearize-at", "singular_steps": "--singular-steps",
    "targets": "--targets", "restarts": "--restarts", "iterations": "--iterations", "size": "--size",
    "sigma_scale": "--sigma-scale", "krylov_pilots": "--krylov-pilots",
    "warm_start": {"False": "--cold-start", "True": "no --cold-start"},
    "iterates": {"'last'": "--last-iterate", "'all'": "no --last-iterate"},
}
_FLAGS = {
    "bound": {**_SHARED_FLAGS, "basis": "--basis", "jacobian": "--jacobian", "chunk_size": "--chunk-size",
              "tf32": {"True": "--tf32", "False": "no --tf32"}, "quantile": "--quantile", "rtol": "--rtol",
              "max_calls": "--max-calls", "statistic": "--statistic", "modes": "--target-modes",
              "metric": "--metric", "sigma": "--sigma", "sigma0": "--sigma",
              "null_probes": {"True": "--null-probes", "False": "no --null-probes"}},
    "reproduce": {**_SHARED_FLAGS, "examples": "--examples", "chunk_examples": "--chunk-examples",
                  "lsqr_iter_lim": "--lsqr-iter-lim", "iter_lim": "--lsqr-iter-lim", "atol": "--lsqr-atol",
                  "btol": "--lsqr-btol", "weights": "--weights", "device": "--device"},
    "train": {"seed": "--seed", "epochs": "--epochs", "batch_size": "--batch-size", "lr": "--lr", "limit": "--limit",
              "device": "--device"},
    "dp": {"sigma": "--sigma", "C": "--C", "N": "--N", "T": "--T", "kappa": "--kappa", "data_range": "--data-range"},
}
#: hcrfast.bound's keywords that a command has no flag for: a message suggesting one says it is Python's.
_PYTHON_ONLY = {
    "bound": ("certify", "targeted_method", "keep_targeted_eps", "example_ids", "noise", "lsqr", "damp", "iter_lim"),
    "reproduce": ("certify", "targeted_method", "keep_targeted_eps", "example_ids", "null_probes", "noise", "damp"),
}
#: A keyword's value as the Python layer prints it (repr: a quoted string, a number, True/False/None), ending where
#: a value ends: ``seed=np.random.SeedSequence(1)``, ``targets=[0, 1]`` or ``size=3x32x32`` are not one.
_QUOTES = "'\""
_VALUE = (r"""(?:'[^']*'|"[^"]*"|[-+]?(?:(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?|inf|nan)(?![\w.(\[/])"""
          r"""|True|False|None)(?![\w.(\[])""")
#: Characters that, just before a name, make it part of a path or of another's name (``runs/size=0.01,seed=1``,
#: ``--size``, ``x=size=1``), not a keyword of hcrfast's.
_NOT_BEFORE = r"(?<![\w.\[/\\,=\-~:@'\"])(?<!\w\()"
#: Where a message says ``name must ...`` of a keyword: at its start (or a note's), or after ": " or "; ".
_MUST_AT = r"(?:^|(?<=^  )|(?<=: )|(?<=; ))"
#: The Python layer's advice on sigma, in its words (hcrfast.rms_sigma), and on float64 (model.double()): the command
#: lines' flags do the same (:func:`_said_in_flags`).
_RMS_SIGMA = r"hcrfast\.rms_sigma\(features, scale\)"
_DOUBLE = r"a float64 model and batch(?: \(model\.double\(\), batch\.double\(\)\))?"
_IN_FLOAT64 = r"run the model and batch in float64 \(model\.double\(\), batch\.double\(\)\)"
#: Fixes the Python layer names that a command has no flag for (said so, as its keywords are: :data:`_PYTHON_ONLY`).
_PYTHON_ONLY_FIXES = {"bound": ("hcrfast.Laplace(b)",),
                      "reproduce": ("hcrfast.Laplace(b)", "a float64 model and batch",
                                    "run the model and batch in float64 (model.double(), batch.double())")}
#: The parsed command line's paths and names (the user's words: never rewritten).
_PATH_DESTS = ("out", "model", "inputs", "weights", "sigma_file", "labels", "head_weights", "data", "data_root")
#: The command line's other free words (an entry's key in a file, the head's name): never rewritten either, where
#: they are long enough not to be a word of the messages' own (``--key b`` is also Laplace(b)'s b).
_WORD_DESTS = ("key", "labels_key", "head")


def shell_text(text: str, args) -> str:
    """``text`` (an error's or a warning's, from hcrfast's Python layer) in the words of the command line that
    ``args`` parsed: ``name=value`` and ``name must`` of a keyword it has a flag for become ``--flag value`` and
    ``--flag must`` (``sigma has`` / ``sigma must``: the flag that gave sigma); the advice to take sigma from
    the features' scale or to run in float64 becomes ``--sigma-scale K`` or ``--double`` (:func:`_said_in_flags`);
    a keyword or a fix it has no flag for is left as Python's, with a note saying so. Python callers see the
    messages unchanged: only :func:`main` calls this.

    The user's words are left as they are: the paths and names the command line was given (a Hydra-style
    ``--out runs/size=0.01,seed=1``), a name inside a path or another word, and a ``name=`` whose value is not
    one the Python layer prints (``targets=[0, 1]``)."""
    command = getattr(args, "command", None)
    flags = dict(_FLAGS.get(command, {}))
    if not flags:
        return text
    # the user's paths, hidden behind tokens no rule matches, and put back at the end
    hidden = {}

    def hide(word: str) -> str:
        token = f"\0{len(hidden)}\0"
        hidden[token] = word
        return token

    words = {os.fspath(v) for v in (getattr(args, d, None) for d in _PATH_DESTS) if isinstance(v, (str, os.PathLike))}
    words |= {v for v in (getattr(args, d, None) for d in _WORD_DESTS) if isinstance(v, str) and len(v) >= 3}
    for word in sorted((w for w in words if w.strip()), key=len, reverse=True):
        text = re.sub(rf"(?<!\w){re.escape(word)}(?!\w)", lambda m: hide(m.group(0)), text)
    subjects = {}   # a message's subject said otherwise than its name=value (``sigma must``, ``sigma has``)
    if command == "dp" and getattr(args, "dp_command", None) == "figure":
        flags["sigma"] = "--sigmas"
    if command == "bound":
        if getattr(args, "sigma_file", None) is not None:   # the stds of --sigma-file, or the one number of --sigma
            sigma_file = f"--sigma-file {hide(os.fspath(args.sigma_file))}"
            flags["sigma"] = flags["sigma0"] = sigma_file
            text = re.sub(rf"{_NOT_BEFORE}sigma0? holds (.*?)or one number",
                          lambda m: f"{sigma_file} holds {m.group(1)}or one number (--sigma)", text)
        elif getattr(args, "sweep", None) is not None:   # sigma = K x sigma0 for one of the sweep's K
            unit = "--sigma" if getattr(args, "sigma", None) is not None else "the features' RMS"
            subjects["sigma"] = f"sigma (a --sweep level K × {unit})"
            subjects["sigma0"] = f"sigma0 ({unit})"
        elif getattr(args, "sigma", None) is None:   # sigma = K x RMS, K --sigma-scale's (1 by default)
            scale = getattr(args, "sigma_scale", None)
            subjects["sigma"] = subjects["sigma0"] = (
                "sigma (the features' RMS: --sigma-scale 1, its default)" if scale is None
                else f"sigma (--sigma-scale {as_typed(scale)} × the features' RMS)")
        if getattr(args, "min_accuracy", None) is not None:
            flags["target"] = getattr(args, "min_accuracy_flag", None) or "--min-accuracy"
        elif getattr(args, "target_std", None) is not None:
            flags["target"] = "--target-std"
        # advice to call targeted_bound(..., null_probes=True): the command's own flags do it, and the call's
        # keyword is Python's (a review: it read "hcrfast.targeted_bound(..., --null-probes)")
        # (also the call spelled out, sigma_for's note, and targeted_bound's own method='dense' with null_probes=True)
        text = re.sub(r"(?:hcrfast\.)?targeted_bound\((?:\.\.\.|model, batch, sigma), null_probes=True\)",
                      lambda m: f"--targets all --null-probes ({hide(m.group(0))} in Python)", text)
        text = re.sub(r"method='dense' with null_probes=True",
                      lambda m: f"--solver dense with --null-probes ({hide(m.group(0))} in Python)", text)
        text = re.sub(rf"{_NOT_BEFORE}reuse_bytes=({_VALUE})",
                      lambda m: f"--reuse-gib {float(m.group(1)) / 2**30:g}" if m.group(1)[0].isdigit()
                      else m.group(0), text)
    else:   # reproduce: the Krylov basis' steps
        text = re.sub(r"lsqr=dataclasses\.replace\([\w.]+, iter_lim=([^)]*)\)", r"--lsqr-iter-lim \1", text)
    text = _said_in_flags(text, command, getattr(args, "sigma_file", None) is not None)

    def flag_of(m):
        if m.group(3) in subjects:
            return subjects[m.group(3)]
        flag = flags[m.group(1) or m.group(3)]
        value = m.group(2)
        if isinstance(flag, dict):   # repr's quotes or another's: 'last' and "last" say the same
            return flag.get("'" + value[1:-1] + "'" if value and value[0] in _QUOTES else value or "", m.group(0))
        if value is None:
            return flag
        if value == "None":
            return f"no {flag}"
        return f"{flag} {value[1:-1] if value[0] in _QUOTES else value}"

    names = "|".join(sorted(map(re.escape, flags), key=len, reverse=True))
    # sigma's own (``sigma has the shape ...``): "has" of any other name is no subject of hcrfast's (``size has to be
    # even``, a model's own words)
    has = "|".join(n for n in ("sigma0", "sigma") if n in flags or n in subjects) or "(?!)"
    # name=value, a bare name= (``pass sigma= or noise=``), or a message's subject: ``rtol must be ...``,
    # ``sigma has the shape ...``
    text = re.sub(rf"{_NOT_BEFORE}({names})=(?:({_VALUE})|(?=[\s,;:)]|$))"
                  rf"|{_MUST_AT}((?:{names})(?= must\b)|(?:{has})(?= has\b))",
                  flag_of, text, flags=re.M)
    text = re.sub(rf"\bleave ({names}) at its default", lambda m: f"leave {flags[m.group(1)]} at its default"
                  if isinstance(flags[m.group(1)], str) else m.group(0), text)
    # "--seed must be ..., got -1 (--seed)": the flag said once
    text = re.sub(r" \((--[\w-]+)\)", lambda m: "" if len(re.findall(re.escape(m.group(1)) + r"(?![\w-])", text)) > 1
                  else m.group(0), text)
    python = [k + "=" for k in _PYTHON_ONLY.get(command, ()) if re.search(rf"{_NOT_BEFORE}{k}=", text)]
    python += [fix for fix in _PYTHON_ONLY_FIXES.get(command, ()) if fix in text]
    if python:
        text += (f" ({', '.join(python)}: from Python only; hcrfast {command} has no flag for "
                 f"{'them' if len(python) > 1 else 'it'})")
    for token, word in hidden.items():
        text = text.replace(token, word)
    return text


def _said_in_flags(text: str, command: str, sigma_file: bool) -> str:
    """The Python layer's advice on sigma and on float64 said in ``command``'s flags: σ from the features' scale
    (``hcrfast.rms_sigma(features, scale)``) is ``--sigma-scale K``, a float64 model and batch ``--double`` (bound's
    alone: reproduce has no flag for it, and the note of :func:`shell_text` says so). ``sigma_file``: the command
    line gave ``--sigma-file`` (its stds, not ``--sigma``, are what to bring nearer the features' scale)."""
    if command == "bound":
        rms = "--sigma-scale K (σ = K × the features' RMS)"
        sigma = "--sigma-file stds" if sigma_file else "a --sigma"
        text = re.sub(rf"a sigma nearer the features' scale(?: \({_RMS_SIGMA}\)|, {_RMS_SIGMA})",
                      f"{rms} or {sigma} nearer the features' scale", text)
        text = re.sub(rf"a sigma far from the features' scale \({_RMS_SIGMA}\)",
                      f"{sigma} far from the features' scale ({rms})", text)
        text = re.sub(_IN_FLOAT64, "--double (the model and inputs in float64)", text)
        text = re.sub(_DOUBLE, "--double", text)
    elif command == "reproduce":   # sigma is --sigma-scale's K x RMS already
        rms = "a --sigma-scale K nearer 1 (σ = K × the features' RMS)"
        text = re.sub(rf"a sigma nearer the features' scale(?: \({_RMS_SIGMA}\)|, {_RMS_SIGMA})", rms, text)
        text = re.sub(rf"a sigma far from the features' scale \({_RMS_SIGMA}\)",
                      "a --sigma-scale K far from 1 (σ = K × the features' RMS)", text)
    else:
        return text
    text = text.replace("hcrfast.rms_sigma(features, 1.0)", "--sigma-scale 1 (σ = the features' RMS)")
    return re.sub(r"\b(a smaller|another) size\b", r"\1 --size", text)


class _Terminated(KeyboardInterrupt):
    """SIGTERM (what a scheduler sends before SIGKILL), raised where the command runs as Ctrl-C is: the same
    clean-up, and a line that says what stopped it."""


#: Seconds a SIGTERM or Ctrl-C is given to reach the command's Python code (its handler runs between bytecodes):
#: past them the process is in a long C call (a wait for other processes to join, a big LAPACK call) that would
#: hold it until the scheduler's SIGKILL, and the watchdog ends it as the signal's default would, saying so.
_SIGNAL_GRACE = 10.0


class _Signals:
    """main()'s handling of SIGTERM and SIGINT: SIGTERM raises :class:`_Terminated` (and SIGINT, where its handler is
    Python's own, KeyboardInterrupt) in the main thread, each counted as heard; a watchdog thread reads the signal
    numbers Python's C handler writes to its wakeup fd at once, whatever the main thread is doing, and ends the
    process only where a signal it handles was not heard within :data:`_SIGNAL_GRACE` seconds: the main thread is
    in a long C call. A caller's own SIGINT handler (a notebook's, one that does not raise) is left to the caller,
    and a wakeup fd someone else set (asyncio's) leaves the watchdog out: its signal bytes are theirs."""

    def __init__(self):
        import signal

        self.handled = {signal.SIGTERM: 0, signal.SIGINT: 0}
        self.said = ""
        self.done = threading.Event()
        self.saved_term = signal.signal(signal.SIGTERM, self._raise)
        self.own_int = signal.getsignal(signal.SIGINT) is signal.default_int_handler
        if self.own_int:
            signal.signal(signal.SIGINT, self._raise)
        self.stop_watch = self._start_watchdog()

    def _raise(self, signum, frame):
        import signal

        self.handled[signum] += 1
        raise _Terminated("terminated by SIGTERM") if signum == signal.SIGTERM else KeyboardInterrupt

    def _start_watchdog(self):
        import signal
        import socket

        try:
            receive, send = socket.socketpair()
            send.setblocking(False)
            before = signal.set_wakeup_fd(send.fileno(), warn_on_full_buffer=False)
        except (OSError, ValueError):
            return None
        if before != -1:   # another's (asyncio's): its signal bytes are its own, read there
            signal.set_wakeup_fd(before)
            send.close()
            receive.close()
            return None
        thread = threading.Thread(target=self._watch, args=(receive,), name="hcrfast-signals", daemon=True)
        thread.start()

        def stop():
            signal.set_wakeup_fd(-1)
            send.close()   # the watchdog's recv returns b"": it ends
            thread.join(timeout=1.0)
            receive.close()

        return stop

    def _watch(self, receive) -> None:
        import signal

        received = {signal.SIGTERM: 0, signal.SIGINT: 0}
        while True:
            try:
                data = receive.recv(64)
            except OSError:
                return
            if not data:   # closed: main() returned
                return
            for signum in data:
                if signum == signal.SIGTERM or (signum == signal.SIGINT and self.own_int):
                    received[signum] += 1
            deadline = time.monotonic() + _SIGNAL_GRACE
            while any(self.handled[k] < received[k] for k in received) and not self.done.is_set():
                if time.monotonic() > deadline:
                    terminated = self.handled[signal.SIGTERM] < received[signal.SIGTERM]
                    try:
                        sys.stdout.flush()
                        sys.stderr.write(f"hcrfast: {'terminated (SIGTERM)' if terminated else 'interrupted'}"
                                         f"{self.said} (ended after {_SIGNAL_GRACE:g} s inside a call that does not "
                                         f"return to Python)\n")
                        sys.stderr.flush()
                    finally:
                        os._exit(128 + signal.SIGTERM if terminated else 130)
                time.sleep(0.05)
            if self.done.is_set():
                return

    def close(self) -> None:
        import signal

        self.done.set()
        if self.stop_watch is not None:
            self.stop_watch()
        # (signal.signal gives None for a handler installed from C: the default then)
        signal.signal(signal.SIGTERM, signal.SIG_DFL if self.saved_term is None else self.saved_term)
        if self.own_int:
            signal.signal(signal.SIGINT, signal.default_int_handler)


def _refuse_empty_paths(args) -> None:
    """An empty path (``--out ""``, a variable left unset in a script) was read as the working directory: the
    results went there, among the user's files. Refused, naming the flag."""
    for dest in _PATH_DESTS:
        value = getattr(args, dest, None)
        if value == "":
            flag = (dest.upper() if dest in ("model", "inputs") else "--data" if dest == "data_root"
                    else "--" + dest.replace("_", "-"))
            folder = dest == "out" and getattr(args, "command", None) in ("bound", "reproduce")   # (train's is a file)
            raise ValueError(f"{flag} {value!r}: an empty path names no file or folder (Path('') is the working "
                             f"directory); pass one" + (" (--out . for the working directory)" if folder else ""))


def main(argv=None) -> int:
    # main may run in-process (tests, notebooks): the filters its commands set, and those the modules they import add
    # (SymPy's, at a training's first gradient), go when it returns
    restore = _lenient_stdout()
    try:
        with warnings.catch_warnings():
            return _main(argv)
    except BrokenPipeError:   # standard output's reader went away (| head): the results are written already
        _stdout_to_devnull()
        return 141   # (128 + SIGPIPE, as a shell reports a command that a closed pipe ended)
    finally:
        restore()
        loader = sys.modules.get("hcrfast._bound_cli")   # (not imported by --help and reproduce)
        if loader is not None:
            loader.forget_model_files()   # the model files' folders and neighbours, kept for the command's time


def _lenient_stdout():
    """Standard output set, for the command's time, to write what its encoding cannot hold as escapes: with
    PYTHONIOENCODING=ascii (or a C locale outside UTF-8 mode) the summary's σ, ×, · raised after the whole run,
    which then exited 2 with "hcrfast: error" and printed no summary. Returns what puts it back (main may run
    in-process)."""
    stream = sys.stdout
    reconfigure, errors = getattr(stream, "reconfigure", None), getattr(stream, "errors", None)
    encoding = (getattr(stream, "encoding", None) or "").lower().replace("-", "").replace("_", "")
    if reconfigure is None or not (errors == "strict" or (errors == "surrogateescape" and encoding != "utf8")):
        return lambda: None
    try:
        reconfigure(errors="backslashreplace")
    except (ValueError, OSError, TypeError):
        return lambda: None

    def restore():
        try:
            if sys.stdout is stream:
                reconfigure(errors=errors)
        except (ValueError, OSError, TypeError):
            pass

    return restore


def _stdout_to_devnull() -> None:
    """Point file descriptor 1 at the null device, so that the interpreter's last flush of standard output does
    not raise the broken pipe again (Python's documented way, "Note on SIGPIPE")."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError, AttributeError):   # (in-process: a stream without a descriptor)
        pass


def _main(argv) -> int:
    import signal

    saved_format = warnings.formatwarning
    warnings.formatwarning = _format_warning
    # SIGTERM as Ctrl-C, for this command's time (main may run in-process: the caller's handlers come back)
    signals = _Signals() if threading.current_thread() is threading.main_thread() else None
    command = args = None
    try:
        # inside the try: a Ctrl-C while the subcommands' modules load says what the others say
        args = build_parser().parse_args(argv)
        command = args.command
        _refuse_empty_paths(args)
        warnings.formatwarning = functools.partial(_format_warning, args=args)
        if signals is not None:
            signals.said = _resume_text(command)
        return int(args.func(args) or 0)
    except BrokenPipeError:   # standard output's reader gone: main's to end quietly
        raise
    except (ValueError, TypeError, OSError, NotImplementedError) as exc:  # OSError: files and folders
        if not isinstance(exc, OSError) and _raised_outside_hcrfast(exc):
            raise   # the user's model or file raised it: its traceback (and hcrfast's note) say where
        print(f"hcrfast: error: {shell_text(_error_text(exc), args)}", file=sys.stderr)
        return 2
    except (MemoryError, RuntimeError) as exc:
        from hcrfast.algorithm import _is_oom   # imported here: --help stays fast
        from hcrfast.data import DownloadError
        from hcrfast.distributed import ShardError

        notes = " ".join(str(n) for n in getattr(exc, "__notes__", None) or ())
        # hcrfast's own (its note on one example out of memory, or raised in its code); a MemoryError of the user's
        # model (its cache full), with no such note, keeps its traceback
        if _is_oom(exc) and ("one example alone" in notes or not _raised_outside_hcrfast(exc)):
            print(f"hcrfast: error: out of memory: {shell_text(_error_text(exc), args)}" + (
                "\n  On the command line: --restarts, --solver and --krylov-pilots" + (
                    " and --lsqr-iter-lim (the Krylov basis' steps)" if command == "reproduce" else "")
                if "one example alone" in notes else ""), file=sys.stderr)
            return 1
        if not isinstance(exc, (DownloadError, ShardError)):
            raise
        # No network, or another torchrun process's failure: the message says what to do.
        print(f"hcrfast: error: {shell_text(_error_text(exc), args)}", file=sys.stderr)
        return 1
    except KeyboardInterrupt as exc:
        terminated = isinstance(exc, _Terminated)
        print(f"hcrfast: {'terminated (SIGTERM)' if terminated else 'interrupted'}{_resume_text(command)}",
              file=sys.stderr)
        return 128 + signal.SIGTERM if terminated else 130
    finally:
        if signals is not None:
            signals.close()
        warnings.formatwarning = saved_format


def _resume_text(command) -> str:
    return ("; the chunks that finished are kept, and the same command resumes" if command in ("reproduce", "bound")
            else "; the epochs that finished are kept (OUT.resume), and the same command resumes"
            if command == "train" else "")


def _error_text(exc: BaseException) -> str:
    """The error's message and its notes, one per line below it: the notes say where it was raised (which
    --sweep scale, which sigma_for call), which the message alone does not."""
    notes = [str(n) for n in getattr(exc, "__notes__", None) or ()]
    return str(exc) + "".join(f"\n  {note}" for note in notes)


def _raised_outside_hcrfast(exc: BaseException) -> bool:
    """Whether ``exc`` was raised by code outside hcrfast's packages (a user's model or model file, or a
    library it calls): hcrfast's own refusals are raised in its files and say what to pass instead."""
    import importlib.util
    import os

    tb = exc.__traceback__
    if tb is None:
        return False
    while tb.tb_next is not None:
        tb = tb.tb_next
    roots = []
    for name in ("hcrfast", "hcrfast.kernels", "hcrfast.bindings"):
        spec = importlib.util.find_spec(name)
        roots += [os.path.realpath(r) for r in (spec.submodule_search_locations or [])] if spec else []
    where = os.path.realpath(tb.tb_frame.f_code.co_filename)
    return not any(where.startswith(root + os.sep) for root in roots)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
