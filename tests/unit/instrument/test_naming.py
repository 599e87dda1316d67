"""Groups of parameters that live outside the watched model: a seq2seq script's decoder under
the encoder's optimizer (PyTorch's translation tutorial, many of its copies), a metric
learning head, two towers of one class. Real monitors, real models, frames to a real engine.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import nn

from sentinel.instrument.naming import parameter_names
from tests.helpers import MLP, make_monitor
from tests.integration.scripts.seq2seq_models import Decoder, Encoder


def test_a_decoder_outside_the_watched_model_gets_its_own_groups() -> None:
    torch.manual_seed(0)
    enc, dec = Encoder(), Decoder()
    opt = torch.optim.Adam(list(enc.parameters()) + list(dec.parameters()), lr=1e-3)
    mon, sender = make_monitor(enc, opt)
    try:
        for _ in range(3):
            y = torch.randint(0, 20, (4, 5))
            loss = nn.functional.cross_entropy(dec(y, enc(torch.randint(0, 20, (4, 6)))).reshape(-1, 20),
                                               y.reshape(-1))
            opt.zero_grad()
            loss.backward()
            opt.step()
        frame = sender.steps()[-1]
        assert frame["groups"] == ["Encoder.emb", "Encoder.rnn", "Decoder.emb", "Decoder.rnn", "Decoder.out"]
        # each group's sum of squares is its own parameters' (nothing merged, nothing lost)
        by_group = dict(zip(frame["groups"], frame["grad_sumsq"]))
        want = float(sum(p.grad.pow(2).sum() for p in dec.out.parameters()))  # type: ignore[union-attr]
        assert abs(by_group["Decoder.out"] - want) <= 1e-6 * want
    finally:
        mon.close()


def test_names_stay_the_models_own_when_it_holds_every_parameter_and_bare_ones_keep_their_place() -> None:
    model = MLP()
    scale = nn.Parameter(torch.ones(()))  # a learned temperature no module holds
    opt = torch.optim.SGD([{"params": model.parameters()}, {"params": [scale]}], lr=0.1)
    names, loose = parameter_names(model, [opt])
    assert names == {id(p): n for n, p in model.named_parameters()}  # no prefix, no scan's names
    assert id(scale) not in names  # the layout names it optimizer0.group1.0
    assert loose == {id(scale)}


def test_two_towers_of_one_class_and_no_model() -> None:
    left, right = MLP(), MLP()
    opt = torch.optim.SGD(list(left.parameters()) + list(right.parameters()), lr=0.1)
    names, loose = parameter_names(left, [opt])
    assert not loose
    assert names[id(left.head.weight)] == "MLP.head.weight"
    assert names[id(right.head.weight)] == "MLP_2.head.weight"
    assert names[id(right.layers[0][0].bias)] == "MLP_2.layers.0.0.bias"
    # a monitor without a model (watch(None, opt)): the modules holding them name them
    both, _ = parameter_names(None, [opt])
    assert {both[id(left.head.weight)], both[id(right.head.weight)]} == {"MLP.head.weight", "MLP_2.head.weight"}


def test_a_data_parallel_model_has_the_groups_of_the_model_it_wraps() -> None:
    """``model = nn.DataParallel(model)`` (older single-node scripts; on the CPU it calls its
    module directly): the groups are the wrapped model's, as under DDP, not ``module.0``."""
    torch.manual_seed(0)
    groups = []
    for wrap in (False, True):
        mlp = MLP()
        model = nn.DataParallel(mlp) if wrap else mlp
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        mon, sender = make_monitor(model, opt)
        try:
            for _ in range(2):
                opt.zero_grad()
                model(torch.randn(8, 16)).pow(2).mean().backward()
                opt.step()
        finally:
            mon.close()
        groups.append(sender.steps()[-1]["groups"])
    assert groups[1] == groups[0] == ["layers.0", "layers.1", "layers.2", "head"]


def test_parametrized_weights_are_in_their_modules_groups() -> None:
    """``torch.nn.utils.parametrizations.weight_norm`` / ``spectral_norm`` (HiFi-GAN-style
    vocoders, SNGAN scripts written for today's API) keep a weight as
    ``post.parametrizations.weight.original0``: it is ``post``'s, in ``post``'s group,
    as without the parametrization (not a group ``post.parametrizations`` of its own)."""
    from torch.nn.utils.parametrizations import spectral_norm, weight_norm

    class Net(nn.Module):
        def __init__(self, wrap: Any) -> None:
            super().__init__()
            self.convs = nn.ModuleList(wrap(nn.Conv1d(4, 4, 3, padding=1)) for _ in range(2))
            self.post = wrap(nn.Conv1d(4, 1, 3, padding=1))
            self.scale = nn.Linear(1, 1)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            for conv in self.convs:
                x = nn.functional.leaky_relu(conv(x))
            return self.scale(self.post(x).transpose(1, 2))

    groups = []
    for wrap in (lambda m: m, weight_norm, spectral_norm):
        torch.manual_seed(0)
        model = Net(wrap)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        mon, sender = make_monitor(model, opt)
        try:
            for _ in range(2):
                opt.zero_grad()
                model(torch.randn(2, 4, 16)).pow(2).mean().backward()
                opt.step()
        finally:
            mon.close()
        groups.append(sender.steps()[-1]["groups"])
    assert groups[0] == groups[1] == groups[2] == ["convs.0", "convs.1", "post", "scale"], groups


def test_a_parametrized_root_weight_is_its_own_group() -> None:
    from sentinel.instrument.groups import group_name

    assert group_name("parametrizations.weight.original0") == "weight" == group_name("weight")
    assert group_name("enc.parametrizations.weight.original", depth=1) == "enc"


def test_a_group_name_longer_than_a_frame_takes_is_shortened_and_stays_apart() -> None:
    """Two ``ModuleDict`` entries under keys of 255 characters that share their first 240
    (a model built from a config whose keys spell the block out): each group keeps a name of
    the 200 characters a frame takes, its first characters and a checksum of the whole, and
    the engine takes the frame's groups and norms. It dropped them from every frame: the
    run had no gradient norm at all."""
    from sentinel import wire

    stem = ("residual_block_" + "with_gated_linear_units_" * 10)[:240]
    keys = [stem + "a" * 15, stem + "b" * 15]
    torch.manual_seed(0)
    model = nn.ModuleDict({keys[0]: nn.Linear(4, 4), keys[1]: nn.Linear(4, 4)})
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    mon, sender = make_monitor(model, opt)
    x = torch.randn(8, 4)
    for _ in range(2):
        opt.zero_grad()
        (model[keys[0]](x) + model[keys[1]](x)).pow(2).mean().backward()
        opt.step()
    mon.close()
    groups = sender.steps()[-1]["groups"]
    assert [len(g) for g in groups] == [wire.MAX_GROUP_NAME_LENGTH] * 2 and groups[0] != groups[1]
    assert [g[:191] for g in groups] == [k[:191] for k in keys]
    assert sender.engine.fields_dropped == {}
    base = (("job", "train"), ("rank", "0"), ("run", mon.options.run))
    norm = sender.engine.store.last("sentinel_grad_norm", base)
    assert norm is not None and norm[2] == pytest.approx(
        float(torch.nn.utils.get_total_norm([p.grad for p in model.parameters()])), rel=1e-5)


def test_a_keras_variables_path_names_its_layer() -> None:
    """Keras 3 on the torch backend keeps every variable of a model in one ``ParameterDict``
    keyed by its path: the module path alone put every layer in one group,
    ``_functional._torch_params``, so a vanishing gradient could not say where."""
    from sentinel.instrument.groups import assign_groups, group_name

    sequential = ["_functional._torch_params.sequential/conv2d/bias", "_functional._torch_params.sequential/conv2d/kernel",
                  "_functional._torch_params.sequential/dense/bias", "_functional._torch_params.sequential/dense/kernel"]
    assert assign_groups(sequential) == (["sequential/conv2d", "sequential/dense"], [0, 0, 1, 1])
    # the functional API: layers made before their model, so no model name in their paths
    assert group_name("_torch_params.embedding/embeddings") == "embedding"
    assert group_name("_torch_params.multi_head_attention/query/kernel") == "multi_head_attention/query"
    assert group_name("_torch_params.multi_head_attention/query/kernel", depth=1) == "multi_head_attention"
    assert group_name("layers.7.attn.q.weight") == "layers.7"  # torch's own names as before


def test_a_compiled_models_groups_are_named_as_the_model_names_them() -> None:
    """``sentinel.watch(torch.compile(model), opt)``, as a script that compiles before it
    watches calls it: the groups are those of the model watched plainly, not
    ``_orig_mod.``-prefixed (Opacus's ``GradSampleModule`` keeps the model as ``_module``
    the same way; checked by hand with opacus 1.6.0, which the test extras do not install)."""
    def groups(compile: bool) -> list[str]:
        torch.manual_seed(0)
        model = MLP()
        watched = torch.compile(model, backend="eager") if compile else model
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        mon, sender = make_monitor(watched, opt)
        opt.zero_grad()
        watched(torch.randn(4, 16)).square().mean().backward()
        opt.step()
        mon.close()
        [frame] = sender.steps()
        return list(frame["groups"])

    plain = groups(False)
    assert plain == ["layers.0", "layers.1", "layers.2", "head"]
    assert groups(True) == plain
