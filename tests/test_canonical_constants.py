"""Constants and forms are canonical at capture (issue 16 item 1): every spelling of one program
reaches the e-graph as one term, so no rule depends on how a constant was written."""
import math

import numpy as np
import onnx
import pytest
import torch
from onnx import TensorProto, helper

from egraph_opt import capture
from egraph_opt.frontends.onnx_frontend import import_model
from egraph_opt.lang.term import Term, evaluate, postorder

C64, C32 = torch.tensor(0.1, dtype=torch.float64), torch.tensor(0.1)


def key(t: Term):
    """The structure of a term: what the e-graph hash-conses into one e-node per subterm."""
    return (t.op, t.attrs, tuple(key(a) for a in t.args))


def captured(fn, dtype=torch.float32):
    program, _ = capture(fn, (torch.rand(2, 3, dtype=dtype) + 1,))
    (root,) = program.roots()
    return root


#: (name, spellings that must give one term)
SPELLINGS = [
    ("int-float-0d", [lambda x: x + 2, lambda x: x + 2.0, lambda x: x + torch.tensor(2.0),
                      lambda x: x + torch.tensor(2), lambda x: x + torch.tensor(2.0, dtype=torch.float64)]),
    ("float64-float32", [lambda x: x * 0.1, lambda x: x * C64, lambda x: x * C32,
                         lambda x: x * float(np.float32(0.1))]),
    ("sub-add-negative", [lambda x: x - 3.0, lambda x: x + (-3.0), lambda x: x + torch.tensor(-3),
                          lambda x: torch.sub(x, 3), lambda x: -3 + x]),
    ("add-sub-negative", [lambda x: x + 3.0, lambda x: x - (-3.0), lambda x: 3 + x, lambda x: torch.add(3.0, x)]),
    ("div-power-of-two", [lambda x: x / 4, lambda x: x * 0.25, lambda x: x * (1 / 4), lambda x: 0.25 * x,
                          lambda x: x / torch.tensor(4.0)]),
    ("const-left-mul", [lambda x: 2.0 * x, lambda x: x * 2, lambda x: torch.mul(2, x)]),
    ("sqrt-difference", [lambda x: torch.sqrt(x + 1) - torch.sqrt(x),
                         lambda x: torch.sqrt(1.0 + x) - x.sqrt(),
                         lambda x: torch.sqrt(x - (-1)) - torch.sqrt(x)]),
]


@pytest.mark.parametrize("name,spellings", SPELLINGS, ids=[s[0] for s in SPELLINGS])
def test_every_spelling_gives_one_term(name, spellings):
    terms = [captured(f) for f in spellings]
    assert len({key(t) for t in terms}) == 1, [repr(t) for t in terms]


def test_division_by_other_constants_stays_a_division():
    """x / 3 rounds once; x * 0.33333334 rounds twice: another program, not a spelling."""
    assert key(captured(lambda x: x / 3)) != key(captured(lambda x: x * (1 / 3)))
    assert captured(lambda x: x / 3).op == "div"
    assert captured(lambda x: x / 1e-39).op == "div"  # 1e39 is no float32: kept as written


def test_canonical_forms_compute_what_torch_computes():
    x = torch.randn(64) * 1e3
    x[:4] = torch.tensor([0.0, -0.0, math.inf, -math.inf])
    for fn in (lambda x: x - 3.0, lambda x: x + (-0.0), lambda x: x - (-0.0), lambda x: x / 4,
               lambda x: 0.1 * x, lambda x: x * C64, lambda x: 2 + x):
        root = captured(fn)
        (got,) = evaluate([root], {"x": x})
        torch.testing.assert_close(got, fn(x), rtol=0, atol=0, equal_nan=True)
        assert torch.equal(got.signbit(), fn(x).signbit())


def test_a_constant_beside_float64_keeps_its_value():
    (c,) = [t for t in postorder([captured(lambda x: x * 0.1, torch.float64)]) if t.op == "const"]
    assert c.attrs == (0.1,)


def test_a_0d_tensor_that_promotes_is_no_constant_of_the_other_dtype():
    """A 0-d float64 tensor beside a 0-d float32 one makes a float64 result: not a scalar of x."""
    program, _ = capture(lambda x: x * C64, (torch.tensor(2.0),))
    assert not any(t.op == "const" for t in postorder(program.roots()))


def test_onnx_constants_take_the_same_form():
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])
    c = helper.make_tensor("c", TensorProto.FLOAT, [], [-3.0])
    model = helper.make_model(helper.make_graph([helper.make_node("Add", ["x", "c"], ["y"])],
                                                "g", [x], [y], [c]))
    program = import_model(helper.make_model(model.graph, opset_imports=[helper.make_opsetid("", 18)])).program
    (root,) = program.roots()
    assert key(root) == key(captured(lambda x: x - 3.0))
