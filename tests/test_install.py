"""What an install brings: `pip install -e .` alone trains LeNet (no torch, no pytest, no
CuPy), the cuda12/cuda13 extras bring every library a GPU run loads (CuPy's CUDA toolkit
wheels and cuDNN itself, not only its frontend) at the versions tested, and sn-train says which
convolution kernels run, and why when cuDNN is not among them."""

import ast
import configparser
import pathlib
import subprocess
import sys
import types

import pytest
from packaging.requirements import Requirement

ROOT = pathlib.Path(__file__).resolve().parent.parent
# import name → distribution, where they differ
DISTRIBUTION = {"yaml": "pyyaml", "PIL": "pillow", "sklearn": "scikit-learn", "google": "protobuf"}
GPU_ONLY = {"cupy", "cupyx", "cudnn"}  # from the cuda12/cuda13 extras, imported only for --device gpu
TEST_ONLY = ("torch", "pytest", "_pytest", "xdist")
MPI_ONLY = {"mpi4py"}  # from the mpi extra, imported only when mpiexec launched several ranks
HDF5_ONLY = {"h5py"}  # from the hdf5 extra, imported only by a net with an HDF5Data layer


def requirements(section, key):
    cfg = configparser.ConfigParser()
    cfg.read(ROOT / "setup.cfg")
    return [Requirement(line) for line in cfg[section][key].strip().splitlines() if line.strip()]


def imported_modules():
    """Top-level names of every module the package's files import (at any depth of the code)."""
    names = set()
    for path in (ROOT / "superneuron").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                names |= {a.name.split(".")[0] for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.level == 0:
                names.add(node.module.split(".")[0])
    return names - {"superneuron"}


def test_the_package_imports_only_the_standard_library_and_its_base_requirements():
    base = {r.name.lower() for r in requirements("options", "install_requires")}
    optional = GPU_ONLY | MPI_ONLY | HDF5_ONLY
    outside = {m for m in imported_modules() if m not in sys.stdlib_module_names and m not in optional}
    assert {DISTRIBUTION.get(m, m).lower() for m in outside} <= base, outside
    assert not set(TEST_ONLY) & imported_modules()


BLOCKER = """
import sys
class Blocked:
    def find_spec(self, name, path=None, target=None):
        if name.split('.')[0] in {blocked!r}:
            raise ImportError('blocked for this test: ' + name)
sys.meta_path.insert(0, Blocked())
sys.argv = ['sn-train', 'nets/lenet.yaml', '--iters', '3', '--display', '1']
from superneuron.cli.train import main
code = main()
leaked = sorted(m for m in sys.modules if m.split('.')[0] in {blocked!r})
print('leaked:', leaked)
sys.exit(code)
"""


def test_lenet_trains_with_the_test_and_gpu_packages_blocked():
    """The README's first command after `pip install -e .`: nothing on sn-train's path to a
    LeNet run needs torch, pytest, CuPy or mpi4py (they are blocked from importing here)."""
    blocked = set(TEST_ONLY) | GPU_ONLY | MPI_ONLY
    run = subprocess.run([sys.executable, "-c", BLOCKER.format(blocked=blocked)], cwd=ROOT,
                         capture_output=True, text=True, timeout=300,
                         env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    assert run.returncode == 0, run.stderr[-2000:]
    assert "done: trained lenet for 3 iterations" in run.stdout and "leaked: []" in run.stdout


def test_the_hdf5_extra_brings_h5py_and_the_tests_install_it():
    for extra in ("hdf5", "test"):
        assert "h5py" in {r.name for r in requirements("options.extras_require", extra)}, extra


def test_the_mpi_extra_brings_mpi4py_and_an_mpiexec_and_the_tests_install_it():
    for extra in ("mpi", "test"):
        names = {r.name for r in requirements("options.extras_require", extra)}
        assert {"mpi4py", "mpich"} <= names, extra


@pytest.mark.parametrize("extra, cuda", [("cuda12", "cu12"), ("cuda13", "cu13")])
def test_cuda_extras_bring_cudnn_and_the_cuda_toolkit_at_the_tested_versions(extra, cuda):
    reqs = {r.name: r for r in requirements("options.extras_require", extra)}
    cupy = reqs[f"cupy-cuda{cuda[2:]}x"]
    assert "ctk" in cupy.extras  # CuPy 14's extra for the CUDA toolkit wheels it loads
    assert "14.0.0" in cupy.specifier and "13.6.0" not in cupy.specifier
    assert f"nvidia-cudnn-{cuda}" in reqs  # libcudnn itself: the frontend does not bring it
    assert "9.19.0" in reqs[f"nvidia-cudnn-{cuda}"].specifier
    frontend = reqs["nvidia-cudnn-frontend"].specifier
    assert "1.32.0" in frontend and "1.31.0" not in frontend


def fake_frontend(monkeypatch, create_handle, version=91900):
    module = types.ModuleType("cudnn")
    module.create_handle = create_handle
    module.backend_version = lambda: version
    module.__version__ = "1.32.0"
    monkeypatch.setitem(sys.modules, "cudnn", module)


def test_convolution_backend_is_named_with_the_reason_for_a_fallback(monkeypatch):
    from superneuron.backend import Backend, GPUBackend
    assert "NumPy (CPU)" in Backend().convolutions()

    monkeypatch.setitem(sys.modules, "cudnn", None)  # not installed
    gpu = GPUBackend(cupy=None)
    line = gpu.convolutions()
    assert gpu.kernels() is None and line.startswith("im2col + GEMM in CuPy (GPU), the fallback")
    assert "does not import (ModuleNotFoundError" in line and "superneuron[cuda12]" in line

    def no_library():
        raise RuntimeError("libcudnn.so.9: cannot open shared object file\nmore")
    fake_frontend(monkeypatch, no_library)
    line = GPUBackend(cupy=None).convolutions()
    assert "makes no handle (RuntimeError: libcudnn.so.9: cannot open shared object file)" in line
    assert "\n" not in line

    fake_frontend(monkeypatch, lambda: "handle")
    assert GPUBackend(cupy=None).convolutions() == "cuDNN 9.19.0 through the cuDNN Frontend 1.32.0 (GPU)"
