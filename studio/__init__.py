import os

# One BLAS thread per process, set before anything imports numpy. The statistics on the pages
# (bootstraps: a 1,000 x 1,000 by 1,000 x 22 product) are too small to gain from threads, and
# on a busy host OpenBLAS's spinning threads made them 3-4x slower (benchmarks/scale.py).
# Web servers and workers get their parallelism from processes. An explicit setting wins.
for _variable in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_variable, "1")

from studio.celery import app as celery_app  # noqa: E402

__all__ = ["celery_app"]
