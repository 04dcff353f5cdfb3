"""module.to("ahbm") checks the whole module against the machine's HBM first
(kbtorch/tensor/module.py): HbmFull names the tensor, the HBM node and the machine before
anything moves."""
import pytest
import torch
from torch import nn

import kbtorch
from kbtorch.tensor.dispatch import is_ahbm
from kbtorch.tensor.hbm import HbmFull


def test_a_module_past_the_hbm_is_refused_before_any_tensor_moves(tiny_path):
    with torch.device("meta"):
        model = nn.Sequential(nn.Linear(64, 64), nn.Linear(1 << 16, 1 << 15, bias=False))   # 8.6 GB of fp32
    with kbtorch.use(str(tiny_path)), kbtorch.timing_only():
        with pytest.raises(HbmFull, match=r"Sequential does not fit the HBM of 'tiny' \(8\.6 GB in all\): '1\.weight' "
                                          r"\(32768, 65536\) is the first past .* in HBM node 'chip0\.cube0\.hs0' "
                                          r"\(PE 0\); nothing was moved"):
            model.to("ahbm")
        assert not any(is_ahbm(p) for p in model.parameters())
        model.to(torch.bfloat16)                     # a host-side conversion is never checked
        small = nn.Linear(64, 64).to("ahbm")
        assert is_ahbm(small.weight)
