"pytest settings for the whole suite."
import torch

# The models in the tests are tiny: one thread is faster than torch's default on a small, shared CPU (two threads per
# process thrash when several processes run), and makes CPU results reproducible from run to run.
torch.set_num_threads(1)
