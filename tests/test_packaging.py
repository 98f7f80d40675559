"""rayk as a user installs it: the sdist, a wheel built from that sdist, and the wheel in a
fresh environment without rayk's `spark` extra.

The build runs PyPA's `build` without isolation, with this environment's setuptools (the
test extra has it), so it downloads nothing; it builds from a copy of the checkout, so it
writes nothing into the working tree.

The fresh environment is a venv made without pip, so nothing but the standard library is
in it, and this environment's pip installs the wheel into it (--python, --no-deps,
--no-index). The dependencies come from this environment: what pip would install for the
wheel's Requires-Dist, without extras (Ray with its `default` and `data` extras, msgpack,
pandas, ... and theirs, found from the installed distributions' metadata), exposed to the
fresh one through a .pth file naming a directory of symlinks to those distributions'
entries in this site-packages. So pyspark, py4j and raydp are not there, nor anything else
that only the extras bring (the driver checks), and a module rayk imports without
declaring it would fail. Installing Ray from PyPI would take minutes and the network; what
is tested is rayk's packaging, with the same dependency versions. Ray starts its workers
with the driver's interpreter, whose site-packages has the .pth, so they see what the
driver sees; the driver checks that in a Ray task.

The driver in that environment (cwd: a directory without rayk in it) imports rayk from
the wheel, starts a 1-broker cluster on a Ray of its own, produces and consumes a record,
checks the compiled codec (and, where cargo is installed, the native produce path) loaded, and that `import rayk.spark` says how to get Spark.
"""

from __future__ import annotations

import email
import email.message
import json
from importlib import metadata
import os
import shutil
import subprocess
import sys
import sysconfig
import tarfile
import zipfile
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

REPO = Path(__file__).resolve().parent.parent
SPARK_EXTRA = ("pyspark", "py4j", "raydp")  # `rayk[spark]` and what it brings
CODEC = ("rayk/storage/_records.c", "rayk/storage/_columns.c", "rayk/storage/_varint.h", "rayk/storage/_murmur2.h",
         "rayk/client/_hand_out.c", "rayk/client/_send.c")
NATIVE = ("native/Cargo.toml", "native/Cargo.lock", *(f"native/src/{p.name}" for p in (REPO / "native" / "src").glob("*.rs")))
CARGO = shutil.which("cargo") is not None  # setup.py leaves rayk._native out without it
PY = f"python{sys.version_info.major}.{sys.version_info.minor}"


def _copy_checkout(dst: Path) -> Path:
    """What an sdist is made from: the files at the top of the checkout and the package,
    without what a local build leaves (compiled modules, bytecode, egg-info)."""
    dst.mkdir()
    for path in REPO.iterdir():
        if path.is_file():
            shutil.copy2(path, dst)
    shutil.copytree(REPO / "rayk", dst / "rayk", ignore=shutil.ignore_patterns("__pycache__", "*.so", "*.pyc"))
    shutil.copytree(REPO / "native", dst / "native", ignore=shutil.ignore_patterns("target"))
    return dst


def _build(*args: str | Path) -> None:
    # The crate compiles into the checkout's cargo target directory, which `make` filled:
    # its dependencies are not compiled again (nor fetched: cargo's registry cache has them).
    env = {**os.environ, "CARGO_TARGET_DIR": str(REPO / "native" / "target")}
    done = subprocess.run(
        [sys.executable, "-m", "build", "--no-isolation", *map(str, args)], capture_output=True, text=True, timeout=300,
        env=env,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]


def test_the_environment_make_installs_has_its_dependencies_bytecode():
    """Every Ray worker process, each partition replica among them, imports Ray at its start:
    where PYTHONDONTWRITEBYTECODE is set (CI's machines) and the install wrote no bytecode
    (uv's default), each compiled Ray's sources again, three times the CPU of its imports
    (benchmarks/bytecode_bench.py). `make` installs with `--compile-bytecode`."""
    if not (Path(sys.prefix) / ".installed").exists():
        pytest.skip(f"{sys.prefix} was not installed by `make`")
    site = Path(sysconfig.get_paths()["purelib"])
    tag = sys.implementation.cache_tag
    sources = list(site.rglob("*.py"))
    without = [s for s in sources if not (s.parent / "__pycache__" / f"{s.stem}.{tag}.pyc").exists()]
    assert len(sources) > 1000, f"{site} holds only {len(sources)} modules"
    assert not without, f"{len(without)} of {len(sources)} modules have no bytecode, e.g. {without[:5]}"


@pytest.fixture(scope="module")
def dists(tmp_path_factory) -> tuple[Path, Path]:
    """(sdist, wheel): the sdist built from the checkout, the wheel from the sdist alone."""
    work = tmp_path_factory.mktemp("packaging")
    out = work / "dist"
    _build("--sdist", "--outdir", out, _copy_checkout(work / "checkout"))
    (sdist,) = out.glob("rayk-*.tar.gz")
    with tarfile.open(sdist) as tar:
        tar.extractall(work / "unpacked", filter="data")
    (unpacked,) = (work / "unpacked").iterdir()
    _build("--wheel", "--outdir", out, unpacked)
    (wheel,) = out.glob("rayk-*.whl")
    return sdist, wheel


def _wheel_metadata(wheel: Path) -> email.message.Message:
    with zipfile.ZipFile(wheel) as zf:
        (name,) = [n for n in zf.namelist() if n.endswith(".dist-info/METADATA")]
        return email.message_from_bytes(zf.read(name))


def test_the_sdist_has_the_codecs_sources_and_the_package_data(dists):
    sdist, _ = dists
    with tarfile.open(sdist) as tar:
        names = {name.split("/", 1)[1] for name in tar.getnames() if "/" in name}
    assert {*CODEC, *NATIVE, "rayk/spark_log4j2.properties", "rayk/py.typed", "setup.py", "pyproject.toml",
            "MANIFEST.in"} <= names
    assert not [n for n in names if n.startswith("native/target")]
    assert not [n for n in names if n.endswith((".so", ".pyc")) or n.startswith("tests/")]


def test_the_wheel_has_the_compiled_codec_and_spark_only_as_an_extra(dists):
    _, wheel = dists
    assert "-cp311-" in wheel.name  # built for this interpreter: it holds compiled modules
    with zipfile.ZipFile(wheel) as zf:
        names = set(zf.namelist())
    meta = _wheel_metadata(wheel)
    for module in ("storage/_records", "storage/_columns", "client/_hand_out", "client/_send", *(["_native"] if CARGO else [])):
        assert [n for n in names if n.startswith(f"rayk/{module}.cpython-") and n.endswith(".so")], module
    assert {"rayk/py.typed", "rayk/spark_log4j2.properties", "rayk/__init__.py", "rayk/spark.py"} <= names
    assert not [n for n in names if n.endswith((".c", ".h", ".rs", ".pyc"))]

    requires = meta.get_all("Requires-Dist")
    core = [r for r in requires if "extra ==" not in r]
    spark = sorted(r.split(";")[0].strip() for r in requires if 'extra == "spark"' in r)
    assert spark == ["pyspark==3.5.7", "raydp==1.6.5"]
    assert any(r.startswith("ray[") for r in core)
    assert not [r for r in core if r.startswith(("pyspark", "raydp", "py4j"))]
    assert "spark" in meta.get_all("Provides-Extra")


def _installed_closure(requirements: list[str]) -> list[metadata.Distribution]:
    """The installed distributions that pip would install for `requirements` (no extras of
    the root; the extras each requirement names, and so on down)."""
    found: dict[str, metadata.Distribution] = {}
    asked: set[tuple[str, str]] = set()
    todo = [(Requirement(r), "") for r in requirements]
    while todo:
        req, extra = todo.pop()
        if req.marker is not None and not req.marker.evaluate({"extra": extra}):
            continue
        name = canonicalize_name(req.name)
        dist = found.setdefault(name, metadata.distribution(name))
        for wanted in ("", *req.extras):
            if (name, wanted) not in asked:
                asked.add((name, wanted))
                todo += [(Requirement(r), wanted) for r in dist.requires or []]
    return list(found.values())


def _fresh_environment(root: Path, requirements: list[str]) -> Path:
    """A venv with nothing in it, and the installed distributions that `requirements` need
    linked in through a .pth; returns its interpreter."""
    env = root / "env"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", env], check=True, timeout=60)
    deps = root / "deps"
    deps.mkdir()
    for dist in _installed_closure(requirements):
        for top in {f.parts[0] for f in dist.files or () if f.parts[0] != ".."}:
            if not (deps / top).exists():  # a namespace package (google/) is shared
                (deps / top).symlink_to(dist.locate_file(top))
    (env / "lib" / PY / "site-packages" / "rayk_test_dependencies.pth").write_text(f"{deps}\n")
    return env / "bin" / "python"


DRIVER = r"""
import importlib
import json
import sys
import types
from pathlib import Path

env, data_dir = Path(sys.prefix), Path(sys.argv[1])
seen = {"prefix": sys.prefix, "executable": sys.executable}
for name in ("pyspark", "py4j", "raydp"):
    try:
        importlib.import_module(name)
        seen[name] = "imported"
    except ImportError:
        seen[name] = "missing"

import rayk
from rayk.storage import records

seen["rayk"] = rayk.__file__
seen["codec"] = records._records.__file__ if isinstance(records._records, types.ModuleType) else None
from rayk.client import hand_out
seen["hand_out"] = getattr(hand_out.HandOut, "__module__", None)
from rayk.client import send_path
seen["send_path"] = getattr(send_path.SendPath, "__module__", None)
from rayk import native_paths
seen["native"] = native_paths.built()
try:
    import rayk.spark
    seen["spark"] = "imported"
except ImportError as e:
    seen["spark"] = str(e)

import ray


@ray.remote(num_cpus=0)
def workers_view():
    import importlib.util
    import sys

    import rayk
    from rayk.storage import records

    return {"executable": sys.executable, "prefix": sys.prefix, "rayk": rayk.__file__,
            "codec": getattr(records._records, "__file__", None),
            "pyspark": importlib.util.find_spec("pyspark") is not None}


ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
try:
    cluster = rayk.start(1, data_dir, namespace="packaging",
                         config={"listeners": "", "offsets.topic.num.partitions": 1, "offsets.topic.replication.factor": 1})
    try:
        cluster.create_topic("packaged", 1, 1)
        with cluster.producer(acks="all") as producer:
            producer.send("packaged", key=b"k", value=b"from the wheel").result()
        consumer = cluster.consumer(auto_offset_reset="earliest")
        consumer.assign([("packaged", 0)])
        got = []
        for _ in range(40):
            for batch in consumer.poll(timeout_ms=500).values():
                got += [[r.key.decode(), r.value.decode()] for r in batch]
            if got:
                break
        consumer.close()
        seen["consumed"] = got
        seen["worker"] = ray.get(workers_view.remote())
    finally:
        cluster.shutdown()
finally:
    ray.shutdown()
print(json.dumps(seen))
"""


@pytest.mark.slow
def test_the_wheel_runs_a_cluster_without_spark(dists, tmp_path):
    _, wheel = dists
    python = _fresh_environment(tmp_path, _wheel_metadata(wheel).get_all("Requires-Dist"))
    env = tmp_path / "env"
    install = subprocess.run(
        [sys.executable, "-m", "pip", "--python", python, "install", "--no-deps", "--no-index", "--quiet", wheel],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert install.returncode == 0, install.stderr[-3000:]

    run = tmp_path / "run"  # the driver's cwd, and so its workers': no rayk/ beside it
    run.mkdir()
    child_env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "RAY_ADDRESS")}
    child_env.update(VIRTUAL_ENV=str(env), PATH=f"{env / 'bin'}{os.pathsep}{os.environ.get('PATH', '')}")
    done = subprocess.run(
        [python, "-c", DRIVER, tmp_path / "data"], cwd=run, env=child_env, capture_output=True, text=True, timeout=180
    )
    assert done.returncode == 0, done.stderr[-4000:]
    seen = json.loads(done.stdout.splitlines()[-1])

    site = str(env / "lib" / PY / "site-packages")
    assert seen["prefix"] == str(env)
    assert {seen["pyspark"], seen["py4j"], seen["raydp"]} == {"missing"}
    assert seen["rayk"].startswith(site + os.sep), seen["rayk"]
    assert seen["codec"] and seen["codec"].startswith(site + os.sep), seen["codec"]
    assert seen["hand_out"] == "rayk.client._hand_out", "the consumer's iteration compiled"
    assert seen["send_path"] == "rayk.client._send", "the producer's send compiled"
    assert seen["native"] == CARGO, "the native produce path built where cargo is"
    assert "pip install 'rayk[spark]'" in seen["spark"], seen["spark"]
    assert seen["consumed"] == [["k", "from the wheel"]]
    worker = seen["worker"]
    assert (worker["prefix"], worker["executable"]) == (str(env), seen["executable"])
    assert worker["rayk"] == seen["rayk"] and worker["codec"] == seen["codec"] and not worker["pyspark"]
