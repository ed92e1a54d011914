"Helpers shared by the benchmark scripts (not a benchmark itself)"
import os, platform
import torch
from aisaac.data import pil_to_tensor
from aisaac.utils import inplace

XMEAN, XSTD = 0.28, 0.35  # Fashion-MNIST pixel mean and standard deviation, as in the tutorial

@inplace
def tfm(b):
    "The tutorial's `with_transform`: images as normalised tensors"
    b['image'] = [(pil_to_tensor(o) - XMEAN) / XSTD for o in b['image']]

def machine(threads=None):
    "CPU model, core count, Python and torch versions, and torch's thread count (`threads`, else the current one)"
    cpu = next((l.split(':', 1)[1].strip() for l in open('/proc/cpuinfo') if l.startswith('model name')), platform.processor())
    return (f"{cpu}, nproc {os.cpu_count()}, python {platform.python_version()}, torch {torch.__version__}, "
            f"torch threads {torch.get_num_threads() if threads is None else threads}")
