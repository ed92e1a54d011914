"The models: shapes, parameter counts, where biases go, and the activations' values."
from functools import partial
import pytest, torch
import torch.nn.functional as F
from torch import nn

from aisaac.models import conv, get_model_conv, get_model, GeneralRelu, act_gr, ResBlock, get_model_resnet

def n_params(m): return sum(p.numel() for p in m.parameters())

@pytest.mark.parametrize('size,ks,stride,out', [(28, 3, 2, 14), (7, 3, 2, 4), (28, 5, 1, 28), (28, 1, 1, 28), (2, 3, 2, 1)])
def test_conv_shapes(size, ks, stride, out):
    assert conv(3, 5, ks=ks, stride=stride)(torch.randn(2, 3, size, size)).shape == (2, 5, out, out)

@pytest.mark.parametrize('norm,has_bias', [(None, True), (nn.BatchNorm2d, False), (partial(nn.BatchNorm2d, momentum=0.2), False),
                                           (partial(nn.InstanceNorm2d, affine=True), False), (partial(nn.GroupNorm, 2), True)])
def test_conv_bias_only_without_batchnorm(norm, has_bias):
    "A batchnorm or instance norm subtracts each channel's mean, so the bias goes; a group norm does not, so it stays"
    assert (conv(4, 8, norm=norm)[0].bias is not None) == has_bias
    assert conv(4, 8, norm=norm, bias=False)[0].bias is None

def test_conv_layers_and_explicit_bias():
    assert [type(m) for m in conv(1, 8, act=None)] == [nn.Conv2d]
    assert [type(m) for m in conv(1, 8, act=nn.SiLU, norm=nn.BatchNorm2d)] == [nn.Conv2d, nn.BatchNorm2d, nn.SiLU]
    assert conv(1, 8, norm=nn.BatchNorm2d, bias=True)[0].bias.shape == (8,)
    assert conv(1, 8, bias=False)[0].bias is None
    assert conv(1, 8, norm=False)[0].bias is not None  # AIsaac passes `norm=False` for "none"

def test_conv_takes_aisaacs_kernel_size_keyword():
    "AIsaac's `conv(ni, nf, kernel_size=3, ...)`: the same layer as `ks=`, padded to keep the size at stride 1"
    c = conv(8, 8, kernel_size=5, stride=1)
    assert c[0].kernel_size == (5, 5) and c[0].padding == (2, 2)
    assert c(torch.randn(2, 8, 28, 28)).shape == (2, 8, 28, 28)
    assert conv(8, 8, 5)[0].kernel_size == (5, 5)  # positionally, the third argument in both libraries

def test_conv_bias_gets_no_gradient_under_batchnorm():
    torch.manual_seed(0)
    c = conv(2, 4, norm=nn.BatchNorm2d, bias=True)
    c(torch.randn(8, 2, 10, 10)).pow(2).sum().backward()
    assert c[0].bias.grad.abs().max() < 1e-4 * c[0].weight.grad.abs().max()

def test_get_model_conv_default_architecture_unchanged():
    "`get_model_conv()` is the same net as before issue 11: the tutorials, benchmarks and the demo call it without arguments"
    m = get_model_conv()
    convs = [l for l in m.modules() if isinstance(l, nn.Conv2d)]
    assert [(c.in_channels, c.out_channels, c.kernel_size, c.stride, c.padding) for c in convs] == \
           [(a, b, (3, 3), (2, 2), (1, 1)) for a, b in [(1, 8), (8, 16), (16, 32), (32, 64), (64, 10)]]
    assert all(c.bias is not None for c in convs)
    assert sum(isinstance(l, nn.ReLU) for l in m.modules()) == 4
    assert n_params(m) == 30_154
    assert m(torch.randn(3, 1, 28, 28)).shape == (3, 10)

def test_get_model_conv_aisaac_argument_order():
    m = get_model_conv(nn.LeakyReLU, [1, 4, 8, 16, 32], nn.BatchNorm2d)
    assert sum(isinstance(l, nn.LeakyReLU) for l in m.modules()) == 4
    assert sum(isinstance(l, nn.BatchNorm2d) for l in m.modules()) == 4
    nfs = (1, 4, 8, 16, 32)
    assert n_params(m) == sum(a*b*9 + 2*b for a, b in zip(nfs, nfs[1:])) + 32*10*9 + 10
    assert [l[0].bias is None for l in m[:5]] == [True]*4 + [False]
    assert m(torch.randn(2, 1, 28, 28)).shape == (2, 10)
    assert get_model_conv(n_out=3)(torch.randn(2, 1, 28, 28)).shape == (2, 3)
    assert get_model is get_model_conv  # miniai's name

def test_general_relu_values():
    x = torch.tensor([-10., -1., 0., 0.5, 5.])
    assert torch.equal(GeneralRelu()(x), F.relu(x))
    torch.testing.assert_close(GeneralRelu(leak=0.1)(x), torch.tensor([-1., -0.1, 0., 0.5, 5.]))
    torch.testing.assert_close(GeneralRelu(sub=0.4)(x), torch.tensor([-0.4, -0.4, -0.4, 0.1, 4.6]))
    torch.testing.assert_close(GeneralRelu(maxv=1.)(x), torch.tensor([0., 0., 0., 0.5, 1.]))
    torch.testing.assert_close(act_gr(maxv=3.)(x), torch.tensor([-1.4, -0.5, -0.4, 0.1, 3.]))
    assert act_gr(leak=0.2).leak == 0.2 and act_gr().sub == 0.4

def test_general_relu_leaves_its_input_alone_and_passes_gradients():
    x = torch.tensor([-1., 2.], requires_grad=True)
    y = GeneralRelu(leak=0.1, sub=0.4, maxv=1.)(x)
    assert torch.equal(x.detach(), torch.tensor([-1., 2.]))
    y.sum().backward()
    torch.testing.assert_close(x.grad, torch.tensor([0.1, 0.]))  # 2 is clamped: no gradient

def test_resblock_identity_and_projection():
    torch.manual_seed(0)
    same = ResBlock(6, 6, act=nn.ReLU)
    assert isinstance(same.idconv, nn.Identity) and isinstance(same.pool, nn.Identity)
    with torch.no_grad():
        for m in same.convs: m[0].weight.zero_(); m[0].bias.zero_()
    x = torch.randn(2, 6, 9, 9)
    assert torch.equal(same(x), F.relu(x))
    down = ResBlock(6, 12, stride=2)
    assert down(torch.randn(2, 6, 28, 28)).shape == (2, 12, 14, 14)
    assert down(x).shape == (2, 12, 5, 5)
    assert down.idconv[0].kernel_size == (1, 1)

def test_resblock_batchnorm_drops_conv_biases():
    rb = ResBlock(4, 8, stride=2, norm=nn.BatchNorm2d)
    assert [m[0].bias for m in rb.convs] == [None, None]
    assert [type(m) for m in rb.convs[0]] == [nn.Conv2d, nn.BatchNorm2d, GeneralRelu]

def test_get_model_resnet():
    torch.manual_seed(0)
    m = get_model_resnet()
    assert m(torch.randn(3, 1, 28, 28)).shape == (3, 10)
    assert sum(isinstance(l, ResBlock) for l in m) == 6
    assert m[-2].bias is None and isinstance(m[-1], nn.BatchNorm1d)
    assert n_params(m) == 1_227_900
    small = get_model_resnet(act_gr, nfs=(4, 8, 8, 16, 16, 32), n_in=3, n_out=5)
    assert small(torch.randn(2, 3, 28, 28)).shape == (2, 5)
    with pytest.raises(RuntimeError):  # too few blocks for 28x28: the linear layer says the shapes disagree
        get_model_resnet(nfs=(8, 16, 32))(torch.randn(2, 1, 28, 28))
