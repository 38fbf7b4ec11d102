"""The wheel installs hcrfast.kernels and hcrfast.bindings, nothing named ``kernels`` at the top,
and CuPy only through the cuda12 / cuda13 extras."""
import email
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _setuptools_at_least(major: int) -> bool:
    try:
        from importlib.metadata import version

        return int(version("setuptools").split(".")[0]) >= major
    except Exception:   # not installed, or an unreadable version
        return False


@pytest.fixture(scope="module")
def wheel(tmp_path_factory):
    out = tmp_path_factory.mktemp("wheel")
    # this environment's setuptools where it builds pyproject.toml's license string (77+), else pip's own
    # isolated build, as `pip install .` does
    isolation = ["--no-build-isolation"] if _setuptools_at_least(77) else []
    proc = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", *isolation,
                           "-q", "-w", str(out), str(ROOT)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    (path,) = out.glob("hcrfast-*.whl")
    return path


def test_layout_maps_kernels_and_bindings_under_hcrfast(wheel):
    names = zipfile.ZipFile(wheel).namelist()
    tops = {n.split("/")[0] for n in names}
    assert tops == {"hcrfast", next(t for t in tops if t.endswith(".dist-info"))}
    for module in ("hcrfast/kernels/twins.py", "hcrfast/kernels/cuda.py", "hcrfast/bindings/jacobian.py"):
        assert module in names


def test_cuda_packages_only_in_extras(wheel):
    with zipfile.ZipFile(wheel) as zf:
        meta_name = next(n for n in zf.namelist() if n.endswith("METADATA"))
        meta = email.message_from_string(zf.read(meta_name).decode())
    requires = meta.get_all("Requires-Dist")
    core = [r for r in requires if "extra ==" not in r]
    assert not any("cupy" in r or "numba-cuda" in r for r in core)
    assert any("cupy-cuda12x" in r and 'extra == "cuda12"' in r for r in requires)
    assert any("cupy-cuda13x" in r and 'extra == "cuda13"' in r for r in requires)


def test_installed_wheel_imports(wheel, tmp_path):
    target = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target", str(target), str(wheel)],
                   check=True, timeout=300)
    code = ("import hcrfast, hcrfast.kernels, hcrfast.bindings, importlib.util as u; "
            "assert hcrfast.__file__.startswith(%r); assert u.find_spec('kernels') is None" % str(target))
    subprocess.run([sys.executable, "-c", code], check=True, cwd=tmp_path, timeout=120,
                   env={"PYTHONPATH": str(target), "PATH": "/usr/bin:/bin"})


def test_wheel_declares_its_license_and_python(wheel):
    """MIT as an SPDX string with the LICENSE text in the wheel (the TOML table form is deprecated, to stop
    building in 2027), and Python 3.11+, which scipy>=1.16 needs (3.10 was promised and could not install)."""
    with zipfile.ZipFile(wheel) as zf:
        names = zf.namelist()
        meta = email.message_from_string(zf.read(next(n for n in names if n.endswith("METADATA"))).decode())
    assert meta["License-Expression"] == "MIT"
    assert any(n.endswith(".dist-info/licenses/LICENSE") for n in names)
    assert meta["Requires-Python"] == ">=3.11"


def test_sdist_carries_what_its_tests_need(tmp_path):
    """The sdist's tests collect: their helper modules and data, the benchmark scripts they load, and the CI
    entry point are in it (setuptools took tests/test_*.py alone: 2 collection errors); the measured results
    are not."""
    import tarfile

    if not _setuptools_at_least(77):
        pytest.skip("this environment's setuptools cannot build pyproject.toml's license string (needs 77+)")
    code = f"from setuptools import build_meta as b; print(b.build_sdist({str(tmp_path)!r}))"
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    (sdist,) = tmp_path.glob("hcrfast-*.tar.gz")
    names = {n.split("/", 1)[1] for n in tarfile.open(sdist).getnames() if "/" in n}
    for need in ("tests/_cupy_emulator.py", "tests/_fakedata.py", "tests/_cudasim_check.py", "tests/cupy_api_names.json",
                 "benchmarks/race.py", "benchmarks/reference_method.py", ".ci/run", "LICENSE", "kernels/twins.py"):
        assert need in names, need
    assert not any(n.startswith("benchmarks/results") for n in names)
