"""What the machine can do, as the config's ``${auto_…:}`` settings read it: native bf16, DataLoader workers, how
often training logs."""

from pathlib import Path

__all__ = ["auto_precision", "native_bf16", "cpu_bf16", "auto_workers", "auto_log_interval", "cores_per_job",
           "threads_per_job", "set_torch_threads", "return_freed_memory"]


def auto_precision() -> str:
    """Lightning precision: ``bf16-mixed`` where bf16 is supported natively (a CUDA GPU with bf16, or a
    CPU with AVX512-BF16/AMX), else ``32-true``. ``MULTIPOS_BF16=0`` (or ``1``) decides instead of the hardware:
    for example fp32 everywhere on a bf16 machine, to continue or compare with runs made where bf16 is not native
    (training, encoding and teacher scoring then all run in fp32).

    Raises ValueError for another value of ``MULTIPOS_BF16``."""
    import os

    import torch

    forced = os.environ.get("MULTIPOS_BF16", "")
    if forced:
        if forced not in ("0", "1"):
            raise ValueError(f"MULTIPOS_BF16={forced!r}: use 0 (fp32) or 1 (bf16-mixed)")
        return "bf16-mixed" if forced == "1" else "32-true"

    if torch.cuda.is_available():
        return "bf16-mixed" if torch.cuda.is_bf16_supported() else "32-true"
    return "bf16-mixed" if cpu_bf16() else "32-true"


def cpu_bf16() -> bool:
    """True where /proc/cpuinfo lists AVX512-BF16 or AMX-BF16 (the CPU computes bf16 natively), whatever
    ``MULTIPOS_BF16`` says; False where the file cannot be read."""
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:
        return False
    return "avx512_bf16" in flags or "amx_bf16" in flags


def native_bf16() -> bool:
    """True where bf16 is native (:func:`auto_precision` is ``bf16-mixed``): ``${auto_bf16:}`` and the meaning of
    ``bf16=None`` in :mod:`multipos.retrieval.encoding`."""
    return auto_precision() == "bf16-mixed"


def auto_workers() -> int:
    """DataLoader workers for training: tokenization runs in worker processes when a CUDA GPU trains (on an
    H100 it took 75–80 % of each step in the main process), and in the main process on a CPU, whose cores
    the model's own compute already uses (workers would only compete with it)."""
    import os

    import torch

    return min(4, max(1, (os.cpu_count() or 2) - 1)) if torch.cuda.is_available() else 0


def auto_log_interval() -> int:
    """Training steps between two logs of the loss (``trainer.log_every_n_steps``): 10 where a CUDA GPU is present, else
    1. Each log, and each refresh of the progress bar (:func:`multipos.training.fit.progress_bar`), reads the loss back
    from the
    training device; on a GPU that makes the host wait until the step has finished, so between logs the host prepares
    the next step while the GPU still runs the last one. On a CPU a read costs nothing and every step is logged."""
    import torch

    return 10 if torch.cuda.is_available() else 1


def cores_per_job(jobs: int) -> int:
    """Torch threads for each of ``jobs`` runs side by side (``parallel_jobs=2``): this machine's cores shared
    evenly, at least one (1 on the 2-core CPU; 8 each for two runs on 16 cores). Raises ValueError for ``jobs`` < 1."""
    import os

    if int(jobs) != jobs or jobs < 1:
        raise ValueError(f"cores_per_job: a positive whole number of jobs, got {jobs!r}")
    return max(1, (os.cpu_count() or 1) // int(jobs))


def threads_per_job(jobs: int) -> int | None:
    """Torch threads of each run when ``jobs`` runs of a sweep run at once (``parallel_jobs``): None for one job
    (torch's default, one per core), else :func:`cores_per_job`. Raises ValueError for ``jobs`` < 1."""
    share = cores_per_job(jobs)
    return None if int(jobs) == 1 else share


def set_torch_threads(threads: int | None) -> str:
    """Give this process ``threads`` torch intra-op threads (config ``threads``; ``parallel_jobs=2`` shares the cores
    between its runs, :func:`cores_per_job`) → ``", <n> torch thread(s)"`` for the run's device description, or ``""``
    when ``threads`` is None (torch's default, one per core, is left as it is). Raises ValueError for a value
    below 1."""
    if threads is None:
        return ""
    import torch

    n = int(threads)
    if n < 1 or n != threads:
        raise ValueError(f"threads: a positive whole number of torch threads or null, got {threads!r}")
    torch.set_num_threads(n)
    return f", {n} torch thread{'s' * (n > 1)}"


#: glibc ``mallopt`` parameters (malloc.h): ``M_TRIM_THRESHOLD`` and ``M_MMAP_THRESHOLD``.
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3
#: Blocks from this size (bytes) up are served by ``mmap`` and unmapped when freed (config ``return_freed_memory``).
MMAP_THRESHOLD = 64 * 1024


def return_freed_memory(enabled: bool) -> bool:
    """Make the C allocator of this process hand freed memory back to the operating system (config
    ``return_freed_memory``): glibc ``mallopt(M_MMAP_THRESHOLD, 64 KiB)`` serves every block of 64 KiB or more by
    ``mmap``, unmapped when it is freed, and ``mallopt(M_TRIM_THRESHOLD, 0)`` releases the top of the heap whenever
    it is free; the same as the environment variables ``MALLOC_MMAP_THRESHOLD_=65536 MALLOC_TRIM_THRESHOLD_=0``, but
    set by the run itself, in whichever process runs it (``parallel_jobs=2``'s included).

    Why: glibc raises its mmap threshold to the largest block freed so far (up to 32 MiB on 64-bit), so the
    activations of a two-tower CPU step, freed at every step, stay in the heap and the resident size climbs: 30 steps
    of ``experiment=two_tower`` peaked at 7.2 GB by default and 4.7 GB with these settings, but took 1.37x the wall
    time (331 s against 241 s; a fixed 4 MiB mmap threshold alone cost the same), so it is off by default; use it to run
    two-tower seeds side by side on a small machine (docs/two-tower.md, "Objectives at the default recipe"). Tensor
    memory that torch caches itself (CUDA) is not affected.

    Returns True when the settings were applied; False when ``enabled`` is false, or when this process's C library
    is not glibc (musl, macOS), where it warns and leaves the allocator as it is. Raises ValueError for a value that
    is not a bool."""
    if not isinstance(enabled, bool):
        raise ValueError(f"return_freed_memory: true or false, got {enabled!r}")
    if not enabled:
        return False
    import ctypes
    import warnings

    try:
        mallopt = ctypes.CDLL(None).mallopt  # the symbols this process already has loaded, its C library's among them
    except (OSError, AttributeError):
        warnings.warn("return_freed_memory: this C library has no mallopt (not glibc); the allocator is left as it is",
                      RuntimeWarning, stacklevel=2)
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    if not (mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD) and mallopt(_M_TRIM_THRESHOLD, 0)):
        warnings.warn("return_freed_memory: mallopt refused the settings; the allocator is left as it is",
                      RuntimeWarning, stacklevel=2)
        return False
    return True
