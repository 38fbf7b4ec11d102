"""The README's examples, run as a user copies them.

Every ```python block of README.md runs, in order, in one namespace, with the ``...`` the README leaves to
the user (``model = ...``, ``batch = ...``) filled by a small MLP and inputs of the test's; a line whose
comment says what it gives (``# True: ...``) is checked to give it. The shell lines of "Your own model from
the shell" and "Other commands" that need no download run through ``hcrfast.cli.main`` as they are written,
with the files they name made here. A renamed keyword, field or flag, or an example that no longer runs, fails
here rather than on a reader's machine.
"""
from __future__ import annotations

import ast
import pathlib
import re
import shlex
import textwrap

import numpy as np
import torch

import hcrfast
from hcrfast import cli

README = pathlib.Path(__file__).resolve().parents[1] / "README.md"


def _blocks(text: str, lang: str) -> list[tuple[int, str]]:
    """(first line number, source) of each fenced block of ``lang`` ("" for a bare fence)."""
    out, lines, i = [], text.splitlines(), 0
    while i < len(lines):
        if lines[i].strip() == "```" + lang:
            j = lines.index("```", i + 1)
            out.append((i + 2, "\n".join(lines[i + 1:j])))
            i = j
        i += 1
    return out


def _section(text: str, heading: str) -> str:
    """The text under ``heading`` (a line of the README) up to the next heading of its level or higher."""
    level = heading.split(" ")[0]
    start = text.index("\n" + heading + "\n")
    rest = text[start + len(heading) + 2:]
    ends = [m.start() for m in re.finditer(r"(?m)^#{1,%d} " % len(level), rest)]
    return rest[:ends[0]] if ends else rest


class _Net(torch.nn.Module):
    """A small tanh MLP on 1×6×6 inputs, 20 features: what ``model = ...`` stands for."""

    def __init__(self):
        super().__init__()
        g = torch.Generator().manual_seed(3)
        self.a = torch.nn.Parameter(torch.randn(28, 36, generator=g) / 6)
        self.b = torch.nn.Parameter(torch.randn(20, 28, generator=g) / 5)

    def forward(self, x):
        return torch.tanh(x.flatten(1) @ self.a.T) @ self.b.T


def _namespace() -> dict:
    torch.manual_seed(0)
    model = _Net().eval()
    batch = torch.randn(4, 1, 6, 6)
    head = torch.nn.Linear(20, 10).eval()   # (top-5 needs more than 5 classes)
    reg_head = torch.nn.Linear(20, 1).eval()
    with torch.no_grad():
        labels = head(model(batch)).argmax(1)   # clean accuracy 1: every accuracy target is reachable
        y = reg_head(model(batch)).flatten()
    return {"__name__": "readme", "torch": torch, "hcrfast": hcrfast, "model": model, "batch": batch, "head": head, "labels": labels,
            "reg_head": reg_head, "y": y}


def _filled(source: str, ns: dict) -> str:
    """``source`` with each ``NAME = ...`` the README leaves to the user dropped where the test gives NAME."""
    keep = []
    for line in source.splitlines():
        m = re.match(r"\s*(\w+)\s*=\s*\.\.\.\s*(#.*)?$", line)
        if m and m.group(1) in ns:
            continue
        keep.append(line)
    return "\n".join(keep)


def _claims(source: str) -> list[tuple[str, str]]:
    """(expression, claim) of each line ``EXPR   # True...`` / ``# False...``: what the README says it gives."""
    out = []
    for line in source.splitlines():
        m = re.match(r"^(?P<expr>[^#]+?)\s+#\s*(?P<claim>True|False)\b", line)
        if m:
            try:
                ast.parse(m.group("expr").strip(), mode="eval")
            except SyntaxError:
                continue
            out.append((m.group("expr").strip(), m.group("claim")))
    return out


def test_the_readme_has_the_examples_this_file_runs():
    text = README.read_text()
    python = _blocks(text, "python")
    assert len(python) >= 6, f"README.md's ```python blocks: {len(python)}"
    assert any("hcrfast.bound(model, batch, sigma)" in src for _, src in python)


def test_every_python_example_of_the_readme_runs(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)   # (they save bounds.npz, runs/sweep)
    ns, text = _namespace(), README.read_text()
    checked = 0
    for line, source in _blocks(text, "python"):
        code = _filled(source, ns)
        try:
            exec(compile(code, f"README.md:{line}", "exec"), ns)
        except Exception as exc:
            raise AssertionError(f"the README's example at line {line} fails: {type(exc).__name__}: {exc}\n"
                                 f"{textwrap.indent(source, '    ')}") from exc
        for expr, claim in _claims(code):
            got = eval(expr, ns)
            assert bool(got) is (claim == "True"), f"README.md:{line}: `{expr}` gives {got!r}, the README says {claim}"
            checked += 1
    assert checked >= 1   # (the bounds file read back equals the result)
    # What the first example says of its fields, checked against the call itself
    res, batch = ns["res"], ns["batch"]
    assert res.std.shape == tuple(batch.shape)
    assert res.mse.shape == res.mse_from_modes.shape == (batch.shape[0],)
    assert res.divergence.shape == (batch.shape[0], 25)   # R = 25 by default
    first, second = res.summary().splitlines()[:2]   # "repr(res) is its first two lines, not the arrays"
    assert repr(res) == f"<Bounds: {first}; {second.strip()}; .summary() for the rest>"
    found = ns["found"]
    assert isinstance(found, hcrfast.AccuracySearch)   # (the last `found` is sigma_for_accuracy's)
    assert found.sigma > 0 and ns["u"].dithered <= ns["u"].clean


def test_the_sigma_for_example_meets_its_comment(tmp_path, monkeypatch):
    """``sigma_for(model, batch, 0.3, quantile=0.05)``: "95% of the per-mode bounds >= 0.3", checked on the
    bounds it returns with NumPy."""
    monkeypatch.chdir(tmp_path)
    ns, text = _namespace(), README.read_text()
    source = next(src for _, src in _blocks(text, "python") if "hcrfast.sigma_for(" in src)
    call = next(line for line in source.splitlines() if "hcrfast.sigma_for(" in line).split("#")[0]
    exec(call, ns)
    found = ns["found"]
    std = np.asarray(found.bounds.std).ravel()
    assert found.met
    assert np.mean(std >= 0.3) >= 0.95


def _shell_lines(section: str) -> list[list[str]]:
    """The commands of a section's bare fenced blocks, split as a shell splits them (comments dropped)."""
    out = []
    for _, block in _blocks(section, ""):
        for line in block.splitlines():
            for command in line.split("#")[0].split("&&"):
                if command.strip():
                    out.append(shlex.split(command))
    return out


_MYNET = textwrap.dedent("""
    import torch

    def make():
        torch.manual_seed(1)
        return torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(36, 24), torch.nn.Tanh(),
                                   torch.nn.Linear(24, 12))
""")


def test_the_shell_examples_of_your_own_model_run_as_written(tmp_path, monkeypatch, capsys):
    """"Your own model from the shell": its first line, with the files it names made here (the second needs
    torchrun and a GPU)."""
    monkeypatch.chdir(tmp_path)
    commands = _shell_lines(_section(README.read_text(), "## Your own model from the shell: `hcrfast bound`"))
    first = commands[0]
    assert first[:2] == ["hcrfast", "bound"], first
    (tmp_path / "path" / "to").mkdir(parents=True)
    (tmp_path / "path" / "to" / "mynet.py").write_text(_MYNET)
    import importlib.util
    spec = importlib.util.spec_from_file_location("mynet_readme", tmp_path / "path" / "to" / "mynet.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    torch.save(module.make().state_dict(), tmp_path / "mynet.pt")
    torch.save(torch.randn(3, 1, 6, 6), tmp_path / "inputs.pt")
    assert cli.main(first[1:] + ["--restarts", "3"]) in (0, None)
    out = tmp_path / first[first.index("--out") + 1]
    saved = hcrfast.Bounds.load(out / "bounds.npz")
    assert saved.std.shape == (3, 1, 6, 6)
    assert np.all(saved.std >= 0)


def test_the_other_commands_run_as_written(tmp_path, monkeypatch, capsys):
    """"Other commands": the `hcrfast dp` lines as they are written (`hcrfast train` is timed elsewhere)."""
    monkeypatch.chdir(tmp_path)
    commands = [c for c in _shell_lines(_section(README.read_text(), "## Other commands")) if c[1] == "dp"]
    assert len(commands) == 2, commands
    for command in commands:
        assert cli.main(command[1:]) in (0, None), command
    assert (tmp_path / "dp.png").stat().st_size > 0
    table = capsys.readouterr().out
    assert "0.5" in table and "100" in table
