"""Issue 37, real image folders: gsd's input pipeline and ``gsd rank`` on folders of large images,
against the decode+resize floor, in one run.

Four sets are GENERATED (nothing is downloaded), ``--n`` images each (default 2,000), 1024 x 1024,
two class folders per set, into ``--cache`` (default ``~/.cache/gsd-bench/folders``; reused when
present):

* ``png8``: 8-bit grey PNG (ChestX-ray14 ships its X-rays so);
* ``png16``: 16-bit grey PNG (PIL mode ``I;16``);
* ``jpeg``: baseline colour JPEG, quality 90 (ISIC-style dermatology photos);
* ``dicom``: 16-bit MONOCHROME2 DICOM, 12 bits stored, with a window (a chest X-ray's header),
  uncompressed (Explicit VR Little Endian).

The pictures are smooth structures (random fields at 3-4 scales, an X-ray-like body outline and
ribs for the grey sets) plus pixel noise, so that they compress and decode like photographs and
radiographs (a constant image would decode many times faster).

Per set, ``--m`` files are drawn as ``gsd rank`` draws them and read once into the page cache (the
timings are of decoding, not of the disk); then the seconds to turn them into the model's input
(``gsd rank``'s default model, the probe: 224 x 224 x 3, normalised float32):

* **floor**: the fastest of the ways the installed libraries do it, each on every core (a pool of
  ``os.cpu_count()`` threads, and one of processes with torch at one thread each): PIL (with
  ``Image.draft`` for JPEG, which decodes at 1/2..1/8 scale in the DCT) and PIL's own resize, or
  torch's antialiased resize; torchvision.io's decoders (``decode_jpeg`` / ``decode_png``) and
  torch's resize; pydicom's ``pixel_array`` then the resize (no VOI window: less than gsd does).
  Every way runs once on 100 files; the fastest is then timed on all ``--m``;
* **gsd**: :func:`gsd_cli.data.loader.model_batches` over the drawn sample (what ``gsd rank``
  consumes), at gsd's chunk size for the probe on the CPU, alternately with the floor, ``--repeats``
  times (the minimum is reported); and, once, the pipeline before issue 37 (a chunk decoded whole in
  one thread, every JPEG pixel, then resized);
* **compute and end to end**: :func:`gsd_cli.distance.side.sample_subspace` (a rank's work per set)
  on the same images already at 224 x 224 in memory (compute alone) and on the folder (end to end,
  without and with the chunk prepared ahead), alternately; end to end / max(input, compute). On a
  CPU both use the same cores; an accelerator's compute leaves them to the decoders, which is
  simulated by sleeping the compute's seconds per chunk (``simulated_accelerator``);
* **gsd rank**: a cold ``gsd rank`` (fresh process, empty cache) with the first set private and the
  others public, on the folders and on npz files of the same images at 224 x 224;
* **memory**: peak RSS (VmHWM) of a fresh process that runs gsd's pipeline over ``--n-small`` and
  over ``--n`` files of each set (bounded by chunks: the two should be equal).

    python benchmarks/bench_image_folders.py --n 2000 --n-small 500 --m 500 --json benchmarks/results/cpu_image_folders.json

(the run on docs/speed.md: 2,000 files per set generated, 500 drawn per set for the timings, which
took 8.3 minutes on 2 shared cores; generating the 8,000 files took 11 minutes more, once).

Every time is the minimum of ``--repeats`` runs; the load average is recorded before and after (the
machine may be shared: compare the ratios taken in one run, not seconds across runs).
"""

from __future__ import annotations

if __name__ == "__main__" and not __package__:  # run as a file: as python -m benchmarks.bench_image_folders
    import _rerun  # noqa: F401 (benchmarks/_rerun.py; never returns)

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor
from pathlib import Path

import numpy as np

from .harness import add_json, child_env, write_json

SIZE = 1024
SETS = ("png8", "png16", "jpeg", "dicom")
EXT = {"png8": ".png", "png16": ".png", "jpeg": ".jpg", "dicom": ".dcm"}


# ---------------------------------------------------------------- generation
def _field(rng: np.random.Generator, channels: int, octaves=((6, 1.0), (24, 0.45), (96, 0.2), (384, 0.08))) -> np.ndarray:
    """A smooth random picture: Gaussian fields drawn at a few resolutions, upsampled bicubically, summed."""
    from PIL import Image

    out = np.zeros((SIZE, SIZE, channels), np.float32)
    for res, amp in octaves:
        for c in range(channels):
            small = rng.standard_normal((res, res)).astype(np.float32)
            out[..., c] += amp * np.asarray(Image.fromarray(small).resize((SIZE, SIZE), Image.BICUBIC))
    return out


_BANK: dict = {}


def _bank(kind: str) -> list[np.ndarray]:
    """Per process, 8 pictures of ``kind`` built from scratch (:func:`_xray`, :func:`_photo`) and one
    of pixel noise; every image mixes two pictures and the noise at random offsets (cheap, all distinct)."""
    if kind not in _BANK:
        rng = np.random.default_rng([SETS.index(kind), 37])  # the same bank in every process: a reproducible set
        make = _photo if kind == "jpeg" else _xray
        ch = 3 if kind == "jpeg" else 1
        _BANK[kind] = [make(rng) for _ in range(8)] + [rng.standard_normal((SIZE, SIZE, ch)).astype(np.float32).squeeze(-1 if ch == 1 else None)]
    return _BANK[kind]


def _picture(kind: str, rng: np.random.Generator) -> np.ndarray:
    bank = _bank(kind)
    i, j = rng.choice(8, 2, replace=False)
    w = rng.uniform(0.6, 0.9)
    roll = lambda a: np.roll(a, tuple(rng.integers(-SIZE // 16, SIZE // 16, 2)), axis=(0, 1))  # noqa: E731
    noise = np.roll(bank[8], tuple(rng.integers(0, SIZE, 2)), axis=(0, 1))
    if rng.random() < 0.5:
        noise = noise[::-1]
    return np.clip(w * roll(bank[i]) + (1 - w) * roll(bank[j]) + (0.02 if kind == "jpeg" else 0.015) * noise, 0, 1)


def _xray(rng: np.random.Generator) -> np.ndarray:
    """An X-ray-like grey picture in [0, 1]: a body outline, two darker lung fields, ribs, texture."""
    yy, xx = np.mgrid[-1:1:SIZE * 1j, -1:1:SIZE * 1j].astype(np.float32)
    body = 1 / (1 + np.exp(-(0.85 - np.sqrt((xx / 0.95) ** 2 + (yy / 1.1) ** 2)) * 25))
    cx = 0.35 + 0.05 * rng.standard_normal()
    lungs = sum(np.exp(-(((xx - s * cx) / 0.22) ** 2 + ((yy + 0.05) / 0.45) ** 2) ** 2) for s in (-1, 1))
    ribs = 0.5 + 0.5 * np.sin(yy * (18 + 2 * rng.standard_normal()) + 3 * np.abs(xx) ** 1.5)
    tex = _field(rng, 1)[..., 0]
    return np.clip(0.15 + 0.6 * body - 0.35 * lungs * (0.8 + 0.2 * ribs) + 0.04 * tex, 0, 1).astype(np.float32)


def _photo(rng: np.random.Generator) -> np.ndarray:
    """A photo-like colour picture in [0, 1]: a skin-toned background, a blob with a textured rim."""
    base = np.array([0.78, 0.6, 0.5], np.float32) + 0.05 * rng.standard_normal(3).astype(np.float32)
    tex = _field(rng, 3)
    yy, xx = np.mgrid[-1:1:SIZE * 1j, -1:1:SIZE * 1j].astype(np.float32)
    r = np.sqrt(((xx - 0.1 * rng.standard_normal()) / 0.5) ** 2 + (yy / 0.4) ** 2) + 0.15 * tex[..., 0]
    lesion = (1 / (1 + np.exp((r - 1) * 12)))[..., None] * np.array([-0.45, -0.4, -0.3], np.float32)
    return np.clip(base + lesion + 0.06 * tex, 0, 1)


def _write(kind: str, file: Path, seed: int) -> None:
    from PIL import Image

    rng = np.random.default_rng(seed)
    img = _picture(kind, rng)
    if kind == "jpeg":
        Image.fromarray((img * 255 + 0.5).astype(np.uint8)).save(file, quality=90)
        return
    if kind == "png8":
        Image.fromarray((img * 255 + 0.5).astype(np.uint8)).save(file, compress_level=3)
    elif kind == "png16":
        Image.fromarray((img * 65535 + 0.5).astype(np.uint16)).save(file, compress_level=3)
    else:
        _write_dicom(file, (img * 4095 + 0.5).astype(np.uint16), seed)


def _write_dicom(file: Path, pixels: np.ndarray, seed: int) -> None:
    """A DX-like 12-bit MONOCHROME2 DICOM, uncompressed, with a window (as chest X-ray headers have)."""
    from pydicom.dataset import FileDataset, FileMetaDataset
    from pydicom.uid import ExplicitVRLittleEndian, generate_uid

    meta = FileMetaDataset()
    meta.MediaStorageSOPClassUID = "1.2.840.10008.5.1.4.1.1.1.1"  # Digital X-Ray Image Storage - For Presentation
    meta.MediaStorageSOPInstanceUID = generate_uid(entropy_srcs=[str(seed)])
    meta.TransferSyntaxUID = ExplicitVRLittleEndian
    ds = FileDataset(str(file), {}, file_meta=meta, preamble=b"\0" * 128)
    ds.SOPClassUID, ds.SOPInstanceUID = meta.MediaStorageSOPClassUID, meta.MediaStorageSOPInstanceUID
    ds.Modality, ds.PatientID = "DX", f"synthetic-{seed}"
    ds.Rows, ds.Columns = pixels.shape
    ds.SamplesPerPixel, ds.PhotometricInterpretation = 1, "MONOCHROME2"
    ds.BitsAllocated, ds.BitsStored, ds.HighBit, ds.PixelRepresentation = 16, 12, 11, 0
    ds.WindowCenter, ds.WindowWidth = 2048, 4000
    ds.PixelData = pixels.astype("<u2").tobytes()
    ds.save_as(file, enforce_file_format=True)


def _write_many(job: tuple[str, list[tuple[str, int]]]) -> int:
    kind, items = job
    for file, seed in items:
        _write(kind, Path(file), seed)
    return len(items)


def generate(cache: Path, n: int, workers: int) -> dict[str, Path]:
    """``{set: folder}`` with ``n`` images per set in two class folders (reused when present)."""
    folders, todo = {}, []
    for kind in SETS:
        root = cache / f"{kind}-{SIZE}"
        folders[kind] = root
        for i in range(n):
            file = root / f"c{i % 2}" / f"{i:05d}{EXT[kind]}"
            if not file.exists():
                file.parent.mkdir(parents=True, exist_ok=True)
                todo.append((kind, str(file), 1000 * SETS.index(kind) + i))
    if todo:
        t0 = time.perf_counter()
        jobs = [(k, [(f, s) for kk, f, s in todo[j::workers * 4] if kk == k]) for j in range(workers * 4) for k in SETS]
        with ProcessPoolExecutor(workers) as pool:
            done = sum(pool.map(_write_many, [j for j in jobs if j[1]]))
        print(f"generated {done} images in {time.perf_counter() - t0:.0f} s into {cache}", flush=True)
    return folders


# ---------------------------------------------------------------- the floor
def _layout(t, channels: int):
    """``t`` (c, S, S) float in [0, 1] -> the model's (channels, S, S), normalised as gsd does."""
    from gsd_cli.data.transform import MEAN, STD

    t = (t - MEAN) / STD
    return t.expand(channels, -1, -1) if t.shape[0] == 1 else t


def _resize(t, side: int):
    """torch's antialiased bilinear resize of (c, H, W) (uint8 stays uint8: torch has a fast kernel for it)."""
    import torch.nn.functional as F

    return F.interpolate(t[None], size=(side, side), mode="bilinear", antialias=True, align_corners=False)[0]


def floor_one(job: tuple[str, str, int, int]):
    """One file -> its model input row, by ``method`` (see :data:`METHODS`); float32 (channels, S, S)."""
    import torch

    method, file, side, channels = job
    if method.startswith("pil"):
        from PIL import Image

        with Image.open(file) as im:
            if im.format == "JPEG":
                im.draft(im.mode, (side, side))
            if method == "pil":  # PIL's own resize (antialiased when it reduces), on the integer pixels
                im = im.resize((side, side), Image.BILINEAR)
            a = np.asarray(im)
        t = torch.from_numpy(a.astype(np.float32) / (65535.0 if a.dtype == np.uint16 else 255.0))
        t = t[None] if t.ndim == 2 else t.permute(2, 0, 1)
        return _layout(t if method == "pil" else _resize(t, side), channels)
    if method == "torchvision":
        import torchvision.io as tio

        data = tio.read_file(file)
        t = tio.decode_jpeg(data) if file.lower().endswith(".jpg") else tio.decode_png(data, tio.ImageReadMode.UNCHANGED)
        if t.dtype == torch.uint8:
            return _layout(_resize(t, side).float() / 255.0, channels)
        return _layout(_resize(t.to(torch.float32) / 65535.0, side), channels)
    if method == "pydicom":  # the stored values scaled by their bits (no VOI window: less than gsd does)
        import pydicom

        ds = pydicom.dcmread(file)
        t = torch.from_numpy(ds.pixel_array.astype(np.float32) / (2.0 ** int(ds.BitsStored) - 1))
        return _layout(_resize(t[None], side), channels)
    raise ValueError(method)


def _floor_many(jobs: list[tuple[str, str, int, int]]) -> np.ndarray:
    import torch

    return torch.stack([floor_one(j) for j in jobs]).numpy()


#: The ways to produce the model input per set (each run on a pool of threads and of processes).
METHODS = {"png8": ("pil", "pil+torch", "torchvision"), "png16": ("pil", "pil+torch", "torchvision"),
           "jpeg": ("pil", "pil+torch", "torchvision"), "dicom": ("pydicom",)}


def cpu_seconds(pids: list[int] = ()) -> float:
    """CPU seconds used so far by this process (all its threads) and by the processes ``pids``."""
    tick = os.sysconf("SC_CLK_TCK")
    total = time.process_time()
    for pid in pids:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        total += (int(fields[11]) + int(fields[12])) / tick  # utime, stime
    return total


def timed(fn) -> tuple[float, float]:
    """(wall, CPU) seconds of ``fn()`` in this process."""
    c0, t0 = cpu_seconds(), time.perf_counter()
    fn()
    return time.perf_counter() - t0, cpu_seconds() - c0


def _one_thread() -> None:
    """A floor worker process's torch runs one thread (not in a thread pool: torch's count is the process's,
    and the rank's compute measured after the floor would run on one thread)."""
    import torch

    torch.set_num_threads(1)


class Floor:
    """Pools of ``workers`` threads and ``workers`` processes, started before any clock, that turn files
    into model input by one of :data:`METHODS`."""

    def __init__(self, side: int, channels: int, workers: int):
        self.side, self.channels, self.workers = side, channels, workers
        self.pools = {"threads": ThreadPoolExecutor(workers),
                      "processes": ProcessPoolExecutor(workers, initializer=_one_thread)}
        list(self.pools["processes"].map(abs, range(4 * workers)))  # the processes exist before timing

    def run(self, method: str, pool: str, files: list[str]) -> tuple[float, float]:
        """(wall, CPU) seconds to produce the model input of ``files`` (stacked, float32) by ``method``
        on ``pool`` (CPU: this process's threads and the pool's processes)."""
        import torch

        jobs = [(method, f, self.side, self.channels) for f in files]
        pids = list(getattr(self.pools[pool], "_processes", None) or {})
        c0, t0 = cpu_seconds(pids), time.perf_counter()
        if pool == "threads":
            torch.stack(list(self.pools[pool].map(floor_one, jobs)))
        else:
            per = max(1, len(jobs) // (self.workers * 8))
            np.concatenate(list(self.pools[pool].map(_floor_many, [jobs[i : i + per] for i in range(0, len(jobs), per)])))
        return time.perf_counter() - t0, cpu_seconds(pids) - c0

    def close(self) -> None:
        for p in self.pools.values():
            p.shutdown()


def _seconds(fn) -> float:
    """Wall seconds of one call of ``fn``; its result is dropped at once (a decoded set is large)."""
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def best(fn, repeats: int) -> tuple[float, None]:
    """The fastest of ``repeats`` calls (results not kept)."""
    return min(_seconds(fn) for _ in range(repeats)), None


# ---------------------------------------------------------------- gsd
def _consume(batches) -> int:
    return sum(x.shape[0] for _, x in batches)


def gsd_input(sample, side: int, channels: int, chunk: int, **kw) -> int:
    """gsd's input pipeline as ``gsd rank`` consumes it (:func:`gsd_cli.data.loader.model_batches`)."""
    from gsd_cli.data.loader import model_batches

    return _consume(model_batches(sample.source, sample.indices, side, channels, chunk, "cpu", **kw))


def gsd_input_before(sample, side: int, channels: int, chunk: int) -> int:
    """The pipeline before issue 37: each chunk decoded whole in one thread (every JPEG pixel), then resized."""
    from gsd_cli.data import read_images, to_model_input

    n = 0
    for start in range(0, len(sample), chunk):
        n += len(to_model_input(read_images(sample.source, sample.indices[start : start + chunk]), side, channels))
    return n


def _put(row: dict, name: str, runs: list[tuple[float, float]]) -> None:
    """``name_s`` (least wall seconds), ``name_cpu_s`` (least CPU seconds) and every run's pair."""
    row[f"{name}_s"] = round(min(w for w, _ in runs), 3)
    row[f"{name}_cpu_s"] = round(min(c for _, c in runs), 3)
    row[f"{name}_runs"] = [[round(w, 2), round(c, 2)] for w, c in runs]


def simulated(sample, side: int, channels: int, chunk: int, step: float, ahead: int) -> None:
    """gsd's pipeline feeding a device step of ``step`` seconds per chunk that leaves the CPU free."""
    from gsd_cli.data.loader import model_batches

    for _ in model_batches(sample.source, sample.indices, side, channels, chunk, "cpu", ahead=ahead):
        time.sleep(step)


def preresized(sample, side: int, channels: int, chunk: int) -> np.ndarray:
    """The sample's model input as uint8 images at the model's size (what the compute-only rank reads)."""
    from gsd_cli.data.loader import model_batches

    import torch

    grey = sample.source.images([int(sample.indices[0])])[0].ndim == 2
    rows = []
    for _, x in model_batches(sample.source, sample.indices, side, channels, chunk, "cpu", ahead=0):
        u = ((x * 0.5 + 0.5).clamp(0, 1) * 255 + 0.5).to(torch.uint8)
        rows.append((u[:, 0] if grey else u.permute(0, 2, 3, 1)).numpy())
    return np.concatenate(rows)


def subspace_seconds(net, names, sample, side: int, channels: int, prefetch: int, repeats: int) -> float:
    """Seconds of :func:`gsd_cli.distance.side.sample_subspace` (what ``gsd rank`` computes per set)."""
    from gsd_cli.distance.side import sample_subspace

    kw = dict(k=16, input_size=side, channels=channels, num_classes=2, names=names, device="cpu")
    return best(lambda: sample_subspace(net, sample, prefetch=prefetch, **kw), repeats)[0]


def peak_rss_child(root: Path, n: int, side: int, channels: int, chunk: int, before: bool) -> float:
    """Peak RSS (MB, VmHWM: ru_maxrss would carry this process's peak over the fork) of a fresh process
    that runs the pipeline over ``n`` files of ``root``."""
    code = (f"import importlib; b = importlib.import_module({__spec__.name!r})\n"
            f"from gsd_cli.data import draw, resolve\n"
            f"s = draw(resolve('folder:{root}'), {n}, 0)\n"
            f"(b.gsd_input_before(s, {side}, {channels}, {chunk}) if {before} else b.gsd_input(s, {side}, {channels}, {chunk}, ahead=0))\n"
            f"print([int(l.split()[1]) / 1024 for l in open('/proc/self/status') if l.startswith('VmHWM')][0])")
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True, env=child_env()).stdout
    return round(float(out.split()[-1]), 1)


def rank_seconds(private: str, public: list[str], m: int) -> dict:
    """Wall and CPU seconds (all threads) of a cold ``gsd rank`` (a fresh process and an empty cache), and
    the rank's own seconds."""
    import resource

    def children_cpu() -> float:
        u = resource.getrusage(resource.RUSAGE_CHILDREN)
        return u.ru_utime + u.ru_stime

    with tempfile.TemporaryDirectory() as cache:
        out = Path(cache) / "rank.json"
        env = dict(os.environ, GSD_CACHE_DIR=cache)
        c0, t0 = children_cpu(), time.perf_counter()
        subprocess.run([sys.executable, "-m", "gsd_cli.cli", "rank", "-q", "--private", private, "--public", *public,
                        "-m", str(m), "--json", str(out)], env=env, check=True, stdout=subprocess.DEVNULL)
        wall, cpu = time.perf_counter() - t0, children_cpu() - c0
        r = json.loads(out.read_text())
    return {"wall_s": round(wall, 1), "cpu_s": round(cpu, 1), "rank_s": r.get("seconds"),
            "distances": {x["public"]: x.get("distance") for x in r.get("results", [])}}


# ---------------------------------------------------------------- the run
def main(argv: list[str] | None = None) -> None:
    import torch

    from gsd_cli.data import ArraySource, draw, resolve
    from gsd_cli.gradients import default_chunk_size, select_parameters
    from probes import get_model_spec

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=2000, help="images generated per set (and the large set of the memory test)")
    ap.add_argument("--n-small", type=int, default=500, help="the small set of the memory test")
    ap.add_argument("--m", type=int, default=2000, help="images drawn per set for the timings (<= --n)")
    ap.add_argument("--sets", nargs="*", default=list(SETS), choices=SETS)
    ap.add_argument("--cache", type=Path, default=Path.home() / ".cache" / "gsd-bench" / "folders")
    ap.add_argument("--workers", type=int, default=None, help="pool size of the floor (default: the cores)")
    ap.add_argument("--repeats", type=int, default=3, help="timed runs of the floor and gsd's input (the rank's: one fewer)")
    ap.add_argument("--skip-rank", action="store_true", help="skip the two gsd rank processes")
    ap.add_argument("--skip-memory", action="store_true", help="skip the peak-RSS processes")
    ap.add_argument("--malloc", choices=["gsd", "system"], default="gsd",
                    help="gsd: the gsd command's allocator setting (keep_freed_memory) in this process, as gsd rank "
                         "runs; system: glibc's defaults (a fresh, page-faulted mapping per large array)")
    add_json(ap)
    args = ap.parse_args(argv)
    if args.malloc == "gsd":
        from gsd_cli.allocator import keep_freed_memory

        keep_freed_memory()
    from gsd_cli.data.loader import decode_workers

    workers = args.workers or decode_workers()
    spec = get_model_spec("probe")  # gsd rank's default model
    side, channels = spec.input_size, spec.channels
    net = spec.build(num_classes=2, seed=0)
    names = select_parameters(net, None)
    chunk = default_chunk_size(torch.device("cpu"), sum(p.numel() for n, p in net.named_parameters() if n in names))
    t0 = time.perf_counter()
    folders = generate(args.cache, args.n, workers)
    threads = torch.get_num_threads()
    result = {"benchmark": "bench_image_folders", "argv": sys.argv[1:], "cpu_count": os.cpu_count(), "workers": workers,
              "torch_threads": torch.get_num_threads(), "platform": platform.platform(), "torch": torch.__version__,
              "model": "probe", "input": [side, channels], "chunk": chunk, "n": args.n, "m": args.m,
              "generate_s": round(time.perf_counter() - t0, 1), "malloc": args.malloc, "loadavg_before": os.getloadavg(), "sets": []}
    npz_dir = Path(tempfile.mkdtemp(prefix="gsd-bench-npz-"))
    for kind in args.sets:
        src = resolve(f"folder:{folders[kind]}")
        sample = draw(src, args.m, 0)
        files = [src.example_file(int(i)) for i in sample.indices]
        for f in files:  # into the page cache: the timings are of decoding, not of the disk
            Path(f).read_bytes()
        row = {"set": kind, "examples": len(sample), "load_start": os.getloadavg()[0]}
        floor = Floor(side, channels, workers)
        try:  # every way once on the first 100 files, then the fastest against gsd, alternately, --repeats times
            sub = files[:100]
            ways = {(m, p): floor.run(m, p, sub) for m in METHODS[kind] for p in floor.pools}
            row["floor_ways_first_100"] = {f"{m}, {workers} {p}": {"wall_s": round(w, 3), "cpu_s": round(c, 3)}
                                           for (m, p), (w, c) in ways.items()}
            way = min(ways, key=lambda k: ways[k][1])  # the least work: the floor on a machine others share
            row["floor_way"] = f"{way[0]}, {workers} {way[1]}"
            gsd_input(draw(src, 32, 1), side, channels, chunk, ahead=0)  # warm
            f_runs, g_runs = [], []
            for _ in range(args.repeats):
                f_runs.append(floor.run(*way, files))
                g_runs.append(timed(lambda: gsd_input(sample, side, channels, chunk, ahead=0)))
        finally:
            floor.close()
        assert torch.get_num_threads() == threads, "the floor changed torch's threads"
        _put(row, "floor", f_runs)
        _put(row, "gsd_input", g_runs)
        _put(row, "gsd_input_before", [timed(lambda: gsd_input_before(sample, side, channels, chunk))])
        pre = preresized(sample, side, channels, chunk)
        np.savez(npz_dir / f"{kind}.npz", x=pre, y=sample.labels(), classes=np.array(src.classes))
        mem = draw(ArraySource(f"{kind}-{side}", pre.astype(np.float32) / 255, sample.labels(), 2), None, 0)
        subspace_seconds(net, names, draw(mem.source, 32, 1), side, channels, 0, 1)  # warm
        runs: dict[str, list] = {"compute": [], "end_to_end_prefetch0": [], "end_to_end_prefetch1": []}
        for _ in range(max(1, args.repeats - 1)):  # alternately, so that a change of load hits all three
            runs["compute"].append(timed(lambda: subspace_seconds(net, names, mem, side, channels, 0, 1)))
            for prefetch in (0, 1):
                runs[f"end_to_end_prefetch{prefetch}"].append(
                    timed(lambda: subspace_seconds(net, names, sample, side, channels, prefetch, 1)))
        for k, v in runs.items():
            _put(row, k, v)
        # an accelerator's compute leaves the CPU to the decoders: simulated by sleeping the compute's
        # seconds per chunk, with the next chunk prepared ahead (gsd's default on an accelerator) or not
        step = row["compute_s"] / -(-len(sample) // chunk)
        for ahead in (0, 1):
            row[f"simulated_accelerator_ahead{ahead}_s"] = round(best(lambda: simulated(sample, side, channels, chunk, step, ahead), 1)[0], 3)
        row["simulated_over_max"] = round(row["simulated_accelerator_ahead1_s"] / max(row["gsd_input_s"], row["compute_s"]), 2)
        e2e = min(row["end_to_end_prefetch0_s"], row["end_to_end_prefetch1_s"])
        row["input_over_floor"] = round(row["gsd_input_s"] / row["floor_s"], 2)
        row["input_cpu_over_floor"] = round(row["gsd_input_cpu_s"] / row["floor_cpu_s"], 2)
        row["before_over_floor"] = round(row["gsd_input_before_s"] / row["floor_s"], 2)
        row["before_cpu_over_floor"] = round(row["gsd_input_before_cpu_s"] / row["floor_cpu_s"], 2)
        row["end_to_end_over_max"] = round(e2e / max(row["gsd_input_s"], row["compute_s"]), 2)
        row["end_to_end_over_sum"] = round(e2e / (row["gsd_input_s"] + row["compute_s"]), 2)
        # the most any overlap can do on this CPU: the decoding's and the compute's CPU seconds spread over
        # every core (each already runs on all of them), or the longer of the two if that is more
        cores = decode_workers()
        bound = max(row["gsd_input_s"], row["compute_s"], (row["gsd_input_cpu_s"] + row["compute_cpu_s"]) / cores)
        row["cpu_bound_s"] = round(bound, 3)
        row["cpu_bound_over_max"] = round(bound / max(row["gsd_input_s"], row["compute_s"]), 2)
        row["end_to_end_over_cpu_bound"] = round(e2e / bound, 2)
        row["load_end"] = os.getloadavg()[0]
        result["sets"].append(row)
        print(json.dumps(row), flush=True)
    if not args.skip_rank:
        folder_specs = [f"folder:{folders[k]}" for k in args.sets]
        npz_specs = [f"npz:{npz_dir / (k + '.npz')}" for k in args.sets]
        result["rank"] = {"folders": rank_seconds(folder_specs[0], folder_specs[1:], args.m),
                          "npz_at_model_size": rank_seconds(npz_specs[0], npz_specs[1:], args.m)}
        inputs = sum(r["gsd_input_s"] for r in result["sets"])
        result["rank"]["input_s"] = round(inputs, 2)
        r = result["rank"]
        r["folders_over_max"] = round(r["folders"]["rank_s"] / max(inputs, r["npz_at_model_size"]["rank_s"]), 2)
        # whole processes: the least any overlap allows on this CPU (every side already uses every core)
        r["input_cpu_s"] = round(sum(x["gsd_input_cpu_s"] for x in result["sets"]), 2)
        npz = r["npz_at_model_size"]
        r["cpu_bound_s"] = round(max(inputs, npz["wall_s"], (r["input_cpu_s"] + npz["cpu_s"]) / decode_workers()), 2)
        r["folders_wall_over_max"] = round(r["folders"]["wall_s"] / max(inputs, npz["wall_s"]), 2)
        r["folders_wall_over_cpu_bound"] = round(r["folders"]["wall_s"] / r["cpu_bound_s"], 2)
        print(json.dumps(result["rank"]), flush=True)
    if not args.skip_memory:
        result["peak_rss_mb"] = {}
        for kind in args.sets:
            result["peak_rss_mb"][kind] = {str(n): peak_rss_child(folders[kind], n, side, channels, chunk, False)
                                           for n in (args.n_small, args.n)}
        result["peak_rss_mb"]["jpeg, before"] = {str(args.n_small): peak_rss_child(folders["jpeg"], args.n_small, side,
                                                                                   channels, chunk, True)}
        print(json.dumps(result["peak_rss_mb"]), flush=True)
    result["loadavg_after"] = os.getloadavg()
    import shutil

    shutil.rmtree(npz_dir, ignore_errors=True)
    write_json(args.json, result, loadavg_before=result["loadavg_before"])


if __name__ == "__main__":
    main()
