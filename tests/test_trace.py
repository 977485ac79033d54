"""Tracing: signatures, pytrees, the IR text, and the errors a user meets."""
import os
import warnings

import numpy as np
import pytest
import torch

import mica
from helpers import rel_err


def _line_of(marker):
    """Line number in this file of the line containing `marker`."""
    with open(__file__) as f:
        for i, line in enumerate(f, 1):
            if marker in line and "_line_of(" not in line:
                return i
    raise AssertionError(marker)


def test_specs_of_every_dtype():
    specs = [mica.f32[4, 8], mica.bf16[2], mica.f16[3, 1], mica.i32[5], mica.i64[2, 3], mica.f64[()]]
    prog = mica.trace(lambda *xs: [x for x in xs], *specs)
    assert prog.inputs == tuple(specs)
    assert prog.outputs == list(specs)
    assert repr(mica.f32[4, 8]) == "f32[4, 8]" and mica.i64[2, 3].dtype is mica.int64


def test_pytree_arguments_and_results():
    def fn(batch, params):
        h = batch["x"] @ params[0]["w"] + params[1]
        return {"out": h, "parts": (h.sum(), [batch["n"] * 2])}

    specs = ({"x": mica.f32[2, 3], "n": mica.i32[4]}, [{"w": mica.f32[3, 5]}, mica.f32[5]])
    prog = mica.trace(fn, *specs)
    assert prog.inputs == specs
    assert prog.outputs == {"out": mica.f32[2, 5], "parts": (mica.f32[()], [mica.i32[4]])}
    assert prog.input_names == ["batch['x']", "batch['n']", "params[0]['w']", "params[1]"]
    rng = np.random.default_rng(0)
    x, w, b, n = rng.standard_normal((2, 3)), rng.standard_normal((3, 5)), rng.standard_normal(5), np.arange(4)
    out = mica.reference.run(prog, {"x": x, "n": n}, [{"w": w}, b])
    assert rel_err(out["out"], x @ w + b) < 1e-14
    assert out["parts"][1][0].dtype == np.int32 and list(out["parts"][1][0]) == [0, 2, 4, 6]


def test_static_arguments_pass_through():
    prog = mica.trace(lambda x, k, name: x * k, mica.f32[3], 4, "scale")
    assert prog.inputs == (mica.f32[3], 4, "scale")
    assert list(mica.reference.run(prog, np.ones(3, np.float32), 4, "scale")) == [4, 4, 4]


def test_ir_prints_one_node_per_line_with_the_users_line():
    def fn(x, w):
        h = x @ w  # the product
        return mica.gelu(h)

    prog = mica.trace(fn, mica.f32[768, 128], mica.f32[128, 384])
    lines = prog.ir.splitlines()
    product = next(l for l in lines if " = matmul " in l)
    assert product.startswith("%2:f32[768, 384] = matmul %0, %1")
    assert product.rstrip().endswith(f"# test_trace.py:{_line_of('# the product')}")
    assert any(" = gelu " in l and "approximate=none" in l for l in lines)
    assert lines[-1].startswith("return %")


def test_common_subexpressions_are_built_once():
    def fn(x):
        return x.exp() + x.exp(), (x * 2) * (x * 2)

    prog = mica.trace(fn, mica.f32[3])
    ops = [n.op for n in prog.graph.nodes]
    assert ops.count("exp") == 1 and ops.count("mul") == 2


def test_shape_error_names_verb_shapes_file_and_line():
    def fn(x, w):
        return x @ w  # wrong inner size

    with pytest.raises(mica.ShapeError) as e:
        mica.trace(fn, mica.f32[4, 8], mica.f32[7, 3])
    msg = str(e.value)
    assert "matmul" in msg and "f32[4, 8]" in msg and "f32[7, 3]" in msg
    assert f"test_trace.py:{_line_of('# wrong inner size')}" in msg
    assert e.value.loc[0] == os.path.abspath(__file__)


@pytest.mark.parametrize("bad,needle", [
    (lambda x, y: x + y, "do not broadcast"),
    (lambda x, y: x.view(5, 5), "cannot view"),
    (lambda x, y: mica.layer_norm(x, (3,)), "normalized_shape"),
    (lambda x, y: x.transpose(0, 4), "out of range"),
    (lambda x, y: mica.cat([x, y], 0), "cat"),
    (lambda x, y: x[5], "out of range"),
    (lambda x, y: mica.cross_entropy(x, y), "cross_entropy"),
])
def test_shape_errors_are_sentences(bad, needle):
    with pytest.raises(mica.ShapeError, match=needle) as e:
        mica.trace(bad, mica.f32[4, 6], mica.f32[3, 5])
    assert "test_trace.py:" in str(e.value)
    assert "\n" not in str(e.value)


def test_dtype_mismatch_is_a_shape_error():
    with pytest.raises(mica.ShapeError, match="one element type"):
        mica.trace(lambda a, b: a @ b, mica.f32[2, 3], mica.bf16[3, 2])
    with pytest.raises(mica.ShapeError, match="integers"):
        mica.trace(lambda i, w: mica.embedding(i, w), mica.f32[3], mica.f32[4, 2])


def _while_building(m):
    """What torch code computes in a model's __init__, before any trace: nanoGPT's and minGPT's
    causal mask, llama2.c's rotary frequencies, and numpy's same-named methods used torch's way."""
    freqs = 1.0 / (10000.0 ** (m.arange(0, 8, 2)[: (8 // 2)].float() / 8))
    angles = m.outer(m.arange(5).float(), freqs)
    return (m.tril(m.ones(4, 4)).view(1, 1, 4, 4), angles.cos(), m.triu(m.full((4, 4), float("-inf")), diagonal=1),
            m.arange(3).repeat(2), m.ones(2, 3).repeat(2, 1), m.arange(4) / 3, m.ones(2, 3).sum(-1, keepdim=True),
            m.zeros(3, 3).masked_fill(m.ones(3, 3).tril() == 0, -1.0), m.arange(6).view(2, 3).transpose(0, 1),
            m.stack([m.arange(3), m.arange(3) * 2], 0), m.exp(m.tensor([0.5, 1.0])), m.softmax(m.ones(3), -1))


def test_verbs_outside_a_trace_compute_as_torchs_eager_tensors():
    """Outside a trace a verb computes (a one-verb program on the oracle) and gives a host tensor:
    a numpy array whose torch methods mean torch's (repeat, view, size, sum(dim, keepdim),
    transpose), with torch's element types (int / int is float32); inside a trace it is a constant."""
    got, want = _while_building(mica), _while_building(torch)
    for g, w in zip(got, want):
        assert isinstance(g, mica.HostTensor) and g.shape == tuple(w.shape) and str(g.dtype) == str(w.dtype).split(".")[1]
        assert np.allclose(g, w.numpy(), rtol=1e-6, atol=0)  # (cos: Mica's own, within an ulp of torch's)
    a = mica.arange(12).float().view(3, 4)  # (numpy's functions on a host tensor keep numpy's meaning)
    plain = np.arange(12, dtype=np.float32).reshape(3, 4)
    for f in (lambda x: np.max(x, axis=0), lambda x: np.min(x, axis=1, keepdims=True), np.std,
              lambda x: np.var(x, axis=0, ddof=1), lambda x: np.mean(x, axis=1), np.transpose, np.sum):
        assert np.allclose(f(a), f(plain), rtol=1e-6)
    assert a.max(0)[1].tolist() == [2, 2, 2, 2]  # (torch's max(dim): values and indices)
    mask = got[0]
    assert mica.ones(2, 3).size(0) == 2 and mica.ones(2, 3).size() == (2, 3) and mica.ones(2, 3).size == 6
    exe = mica.compile(lambda x: (x.masked_fill(mask[:, :, :3, :3] == 0, 0.0) * mask[:, :, :3, :3]).sum(),
                       mica.f32[1, 1, 3, 3])
    assert exe(np.full((1, 1, 3, 3), 2.0, np.float32)) == 12.0


def test_values_a_verb_cannot_take_get_a_sentence():
    with pytest.raises(mica.TraceError, match="cannot take a str"):
        mica.trace(lambda x: x + "one", mica.f32[3])
    with pytest.raises(mica.TraceError, match="mica.where"):
        mica.trace(lambda x: x if x.sum() > 0 else -x, mica.f32[3])
    with pytest.raises(mica.TraceError, match="cannot read"):
        mica.trace(lambda x: float(x.sum()), mica.f32[3])
    with pytest.raises(mica.TraceError, match="Tensor"):
        mica.trace(lambda x: mica.matmul(x, [[1.0]]).sum() + mica.exp("x"), mica.f32[1, 1])


def test_tensors_cannot_escape_a_trace():
    kept = []
    mica.trace(lambda x: kept.append(x) or x, mica.f32[3])
    with pytest.raises(mica.TraceError, match="finished"):
        mica.trace(lambda y: y + kept[0], mica.f32[3])


def test_oracle_checks_argument_shapes():
    prog = mica.trace(lambda d: d["a"] * 2, {"a": mica.f32[3]})
    with pytest.raises(mica.MicaError, match=r"input 0 \(d\[.a.\]\) is f32\[3\] and got shape \(4,\); pass an array "
                                             r"of shape \(3,\)"):
        mica.reference.run(prog, {"a": np.ones(4)})


def test_in_place_methods_rebind_the_handle():
    def fn(p, g):
        p.mul_(0.5).add_(g, alpha=-2.0)
        return p

    prog = mica.trace(fn, mica.f64[3], mica.f64[3])
    p, g = np.array([1.0, 2.0, 3.0]), np.array([0.5, 0.25, 1.0])
    assert list(mica.reference.run(prog, p, g)) == list(p * 0.5 - 2 * g)


def test_type_promotion_follows_torch():
    import torch

    cases = [(mica.f32[2], 2), (mica.i64[2], 2.5), (mica.i32[2], mica.i64[()]), (mica.bf16[2], mica.f32[()]),
             (mica.bf16[2], mica.f16[2]), (mica.b8[2], 3), (mica.i32[2], mica.f64[()]), (mica.f16[()], 1.5)]
    tmap = {"float32": torch.float32, "int64": torch.int64, "int32": torch.int32, "bfloat16": torch.bfloat16,
            "float16": torch.float16, "bool": torch.bool, "float64": torch.float64}
    for a, b in cases:
        ta = torch.zeros(a.shape, dtype=tmap[a.dtype.name])
        tb = torch.zeros(b.shape, dtype=tmap[b.dtype.name]) if isinstance(b, mica.Spec) else b
        want = (ta + tb).dtype
        specs = (a, b) if isinstance(b, mica.Spec) else (a,)
        prog = mica.trace(lambda x, y=b: x + y, *specs)
        assert tmap[prog.outputs.dtype.name] == want, (a, b)


def _host_writes(m):
    h = m.arange(6).float().view(2, 3)
    h.add_(1)
    h.mul_(2)
    h.masked_fill_(h > 10, 0.0)
    h.clamp_(max=8)
    h.transpose(0, 1).mul_(0.5)  # (a torch view shares its tensor's memory: the write reaches h)
    h.narrow(1, 0, 1).zero_()
    a = m.arange(4).float()
    a[:2].fill_(7)
    n = m.ones(3)
    n.unsqueeze(0)[0, 1] = 5.0
    return h, a, n, m.arange(6).sum().float(), h[1, 2] * 2.5


def test_host_tensors_write_in_place_through_their_views_and_compare_types_as_torch():
    got, want = _host_writes(mica), _host_writes(torch)
    for g, w in zip(got, want):
        assert g.shape == tuple(w.shape) and str(g.dtype) == str(w.dtype).split(".")[1], (g, w)
        assert np.array_equal(g, w.numpy())
    assert mica.arange(3).float().dtype == mica.float32 and mica.arange(3).dtype == mica.int64
    assert mica.ones(2).dtype != mica.bfloat16 and np.dtype(mica.int32) == np.int32
    assert mica.arange(3).float().half().dtype == mica.float16 and (mica.ones(2).half() + 1.1).dtype == np.float16
    with pytest.raises(mica.MicaError, match=r"^view: a tensor laid out as this one .* use .reshape"):
        mica.ones(2, 3).T.view(-1)


_VIEW_STEPS = [lambda x: x.transpose(0, -1), lambda x: x.permute(*reversed(range(x.ndim))), lambda x: x[..., ::2],
               lambda x: x[1:], lambda x: x.unsqueeze(1), lambda x: x[:, 0] if x.ndim > 1 else x,
               lambda x: x.flatten() if x.ndim > 1 else x, lambda x: x.mT if x.ndim >= 2 else x,
               lambda x: x.expand(2, *x.shape), lambda x: x.squeeze(),
               lambda x: x.diagonal(1, 0, -1) if x.ndim > 1 else x,
               lambda x: x.unfold(-1, 2, 3) if x.ndim and x.shape[-1] > 1 else x]


def _writes_through_diagonal_and_unfold(m):
    def f(x, w):
        y = x * w
        y.diagonal().mul_(3.0)            # (a view: the write reaches y)
        d = y.diagonal(1)
        y.mul_(2.0)                       # (and y's write reaches d)
        y.unfold(1, 2, 2).add_(w[:, :4].unfold(1, 2, 2))
        windows = y.unfold(0, 2, 1)       # (overlapping windows: read only)
        return y, d * 1.0, windows.sum(-1)
    return f


def test_diagonal_and_unfold_are_views_written_through_as_torchs():
    """diagonal() and unfold() are torch's views: an in-place step on one writes the tensor, one on
    the tensor shows in them, with torch's values and gradients (they were copies, so both writes
    were lost silently)."""
    rng = np.random.default_rng(3)
    xv, wv, gv = (rng.standard_normal((3, 4)).astype(np.float32) for _ in range(3))
    f = _writes_through_diagonal_and_unfold(mica)
    grads = mica.value_and_grad(lambda x, w: sum((o * o).sum() for o in f(x, w)), argnums=(0, 1))
    (loss, (gx, gw)), outs = mica.compile(grads)(xv, wv), mica.compile(f)(xv, wv)
    tx, tw = (torch.tensor(v, dtype=torch.float64, requires_grad=True) for v in (xv, wv))
    touts = _writes_through_diagonal_and_unfold(torch)(tx, tw)
    tloss = sum((o * o).sum() for o in touts)
    tloss.backward()
    for a, b in zip(outs, touts):
        assert rel_err(np.asarray(a), b.detach().numpy()) < 1e-6
    assert abs(float(loss) - tloss.item()) <= 1e-5 * tloss.item()
    assert rel_err(np.asarray(gx), tx.grad.numpy()) < 1e-5 and rel_err(np.asarray(gw), tw.grad.numpy()) < 1e-5
    for lib in (mica, torch):  # (outside a trace too)
        y = lib.arange(12.0).view(3, 4)
        y.diagonal().fill_(-1.0)
        y.unfold(1, 2, 2)[1].mul_(10.0)
        assert np.asarray(y).tolist() == [[-1, 1, 2, 3], [40, -10, 60, 70], [8, 9, -1, 11]]
    # overlapping windows: eagerly a write into one window (or a slice of them) reaches the tensor as torch's
    # (numpy's strides over the same memory); in a trace it is a sentence (which windows a write changed is
    # not in the values, and a write that leaves a value as it was must still pass its gradient)
    def overlapping(y):
        y.unfold(0, 3, 1)[1].mul_(-1.0)
        y.unfold(0, 5, 3)[:, ::2].add_(10.0)
        return y
    want = overlapping(torch.arange(12.0)).numpy()
    assert want.tolist() == [10, -1, 8, 7, 14, 15, 16, 17, 18, 9, 20, 11]
    assert np.array_equal(np.asarray(overlapping(mica.arange(12.0))), want)
    with pytest.raises(mica.MicaError, match=r"^an in-place step through unfold\(0, 3, 1\)'s windows, which overlap"):
        mica.compile(lambda y: overlapping(y * 1.0))(np.arange(12.0, dtype=np.float32))


def test_views_have_torchs_strides_so_reshape_views_or_copies_as_torchs():
    """Random chains of view steps: every view's strides are torch's (size-1 dims aside), and
    whether it can be viewed as another shape (else reshape copies and view refuses) is torch's."""
    from mica.tensor import strides_of, view_strides

    rng = np.random.default_rng(14)
    checked = 0
    for _ in range(150):
        shape = tuple(int(n) for n in rng.integers(1, 5, rng.integers(2, 5)))
        steps = [_VIEW_STEPS[i] for i in rng.integers(0, len(_VIEW_STEPS), rng.integers(1, 5))]
        t = torch.zeros(shape)
        try:
            for step in steps:
                t = step(t)
        except (RuntimeError, IndexError, TypeError):
            continue
        seen = {}

        def chain(x):
            v = x * 1.0
            for step in steps:
                v = step(v)
            seen["strides"] = strides_of(v)
            return v

        mica.trace(chain, mica.Spec(shape, mica.f32))
        if t.numel():
            assert [s for s, n in zip(seen["strides"], t.shape) if n != 1] == \
                [s for s, n in zip(t.stride(), t.shape) if n != 1], (shape, t.shape, t.stride(), seen)
        for new in ((-1,), tuple(reversed(t.shape)) or (1,)):
            target = tuple(torch.empty(t.shape).reshape(*new).shape)
            try:
                t.view(*new)
                viewable = True
            except RuntimeError:
                viewable = False
            assert viewable == (view_strides(tuple(t.shape), tuple(t.stride()), target) is not None)
        checked += 1
    assert checked > 100
    with pytest.raises(mica.MicaError, match=r"^view: this tensor's elements .* cannot be read as shape \[12\] without "
                                             r"a copy, as in torch; use .reshape"):
        mica.trace(lambda x: x.T.view(-1), mica.f32[3, 4])


def test_calls_from_two_threads_take_turns():
    """One compiled program (one arena) called from two Python threads: every result is the one a
    single thread gets (an outside tester found up to half of them mixed), in both forms."""
    import threading

    exe = mica.compile(lambda x, w: mica.tanh(x @ w).sum(0), mica.f32[16, 32], mica.f32[32, 8])
    lazy = mica.compile(lambda x, w: mica.tanh(x @ w).sum(0))
    rng = np.random.default_rng(0)
    w = rng.standard_normal((32, 8)).astype(np.float32)
    xs = [rng.standard_normal((16, 32)).astype(np.float32) for _ in range(8)]
    want = [exe(x, w) for x in xs]
    wrong = []

    def hammer(f, k):
        for i in range(60):
            j = (i + k) % len(xs)
            if not np.array_equal(f(xs[j], w), want[j]):
                wrong.append(j)

    threads = [threading.Thread(target=hammer, args=(f, k)) for f in (exe, lazy) for k in (0, 3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert wrong == []
    # different functions traced for the first time at once: the traces take turns (a trace's state
    # is the process's)
    fresh = [mica.compile(lambda x, k=k: (x * k).sum()) for k in range(4)]
    got = [None] * 4
    threads = [threading.Thread(target=lambda k=k: got.__setitem__(k, float(fresh[k](xs[0])))) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert all(abs(g - float((xs[0].astype(np.float64) * k).sum())) < 1e-3 for g, k in zip(got, range(4))), got


def test_the_torch_compile_form_takes_keyword_arguments_and_says_what_it_cannot():
    """mica.compile(fn) as torch.compile: keyword arguments the function takes are its own (an
    `offset` parameter was taken as dropout's offset, silently), the rest of threads/seed/offset are
    run options; a bad call is Python's complaint as a sentence at the user's line; the program of
    the last call is inspectable; and the API's corners an outside fuzz found crash no more."""
    @mica.compile
    def shift(x, offset=np.float32(0), *, scale=1.0):
        return (x + offset) * scale

    x = np.arange(3, dtype=np.float32)
    with pytest.raises(mica.MicaError, match=r"shift is compiled at its first call"):
        shift.memory_report
    assert shift(x).tolist() == [0, 1, 2] and shift(x=x, offset=np.float32(10)).tolist() == [10, 11, 12]
    assert shift(x, np.float32(1), scale=2.0, threads=1).tolist() == [2, 4, 6]
    assert "memory plan for shift" in shift.memory_report and "input" in shift.ir and shift.source
    with pytest.raises(mica.MicaError, match=r"^shift\(\): got an unexpected keyword argument 'bogus' \(.*test_trace"):
        shift(x, bogus=1)
    with pytest.raises(mica.MicaError, match=r"^<lambda> was given 1 spec for its arguments \(x, y\)"):
        mica.trace(lambda x, y: x + y, mica.f32[3])
    two = lambda x, y: (x * y).sum()  # noqa: E731
    for bad, says in ((dict(argnums=2), r"argnums names argument 2, and the function was given 2 positional"),
                      (dict(argnums=1.0), r"argnums is an argument's index or a tuple of them, got 1.0"),
                      (dict(has_aux=True), r"has_aux=True\): the function must return a pair \(loss, aux\)")):
        with pytest.raises(mica.MicaError, match=says):
            mica.trace(lambda x, y: mica.value_and_grad(two, **bad)(x, y), mica.f32[3], mica.f32[3])
    with pytest.raises(mica.MicaError, match=r"^iteration over a 0-d tensor"):
        mica.trace(lambda x: [r for r in x], mica.f32[()])
    with pytest.raises(mica.MicaError, match=r"complex64 values cannot be an input"):
        mica.compile(lambda x: x * 2)(np.ones(3, np.complex64))
    exe = mica.compile(lambda x: x * 2, mica.f32[3])
    with pytest.raises(mica.MicaError, match=r"set_input's index is an input's place, 0 to 0, got 5"):
        exe.set_input(5, np.ones(3))
    exe.set_input(np.int64(0), np.ones(3))  # (a numpy integer is an index, as Python's)
    assert exe(torch.ones(3, requires_grad=True)).tolist() == [2, 2, 2]  # (its values, as torch's .detach())
    gelu0 = mica.trace(lambda x: mica.nn.functional.gelu(x.amax()), mica.f32[2])  # (the oracle on a 0-d erf)
    assert abs(float(mica.reference.run(gelu0, np.array([0.5, 1.0], np.float32))) - 0.8413447460685429) < 1e-12
    assert abs(float(mica.erf(mica.tensor(0.3))) - 0.32862676) < 1e-6


def test_an_ordered_dict_comes_back_an_ordered_dict_and_keys_its_own_program():
    from collections import OrderedDict

    x = np.random.default_rng(0).standard_normal(3).astype(np.float32)
    f = mica.compile(lambda d: type(d)(b=d["a"] * 2, a=d["a"]))
    got = f(OrderedDict(a=x))
    assert type(got) is OrderedDict and list(got) == ["b", "a"]
    np.testing.assert_array_equal(np.asarray(got["b"]), x * 2)
    plain = f({"a": x})  # (a dict of the same keys is another tree: its own program, a dict back)
    assert type(plain) is dict and list(plain) == ["b", "a"]


def test_python_numbers_a_compiled_function_returns_come_back_as_they_are():
    """An outside fuzzer's: x.shape, a flag or a count returned from a torch.compile-form function
    came back as 0-d tensors; torch.compile gives the Python values (each program keeps its own:
    a step's model.training follows the mode it was made for). mica.trace's programs still make
    them outputs."""
    x = np.ones((2, 3), np.float32)
    f = mica.compile(lambda a: (a * 2, a.shape, a.dtype == mica.float32, {"n": a.ndim, "half": 0.5}))
    for _ in range(2):
        doubled, shape, flag, extra = f(x)
        assert shape == (2, 3) and type(shape[0]) is int and flag is True and extra == {"n": 2, "half": 0.5}
        np.testing.assert_array_equal(np.asarray(doubled), x * 2)
    model = mica.nn.Linear(3, 1)

    @mica.compile
    def forward(a):
        return model(a).sum(), model.training

    for mode, want in (("train", True), ("eval", False), ("train", True)):
        getattr(model, mode)()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            assert forward(x)[1] is want
    assert mica.trace(lambda a: (a * 2, 3), mica.f32[3]).outputs[1].shape == ()


def test_item_returned_from_a_compiled_step_is_the_calls_python_number():
    """The char-RNN tutorial's `train()` ends `return output, loss.item()`: inside a trace .item() is
    the number the program gives back, a Python number after the call (float, int or bool as the
    tensor's type); meeting a verb it is the value without a gradient; used as a Python number while
    tracing, one sentence."""
    import torch

    rng = np.random.default_rng(14)
    x = rng.standard_normal((4, 3)).astype(np.float32)
    nets = []
    for lib in (torch, mica):
        lib.manual_seed(0)
        nets.append(lib.nn.Linear(3, 2))
    nets[1].load_state_dict(nets[0].state_dict())
    opts = [torch.optim.SGD(nets[0].parameters(), lr=0.1), mica.optim.SGD(nets[1].parameters(), lr=0.1)]

    def train(lib, net, opt, x):
        out = net(x)
        loss = out.square().mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        return out, loss.item(), (out > 0).sum().item(), (out > -100).all().item(), out * loss.item()

    mnet, mopt = nets[1], opts[1]  # (the step reads Mica's objects only: torch's change at each of its steps)
    step = mica.compile(lambda x: train(mica, mnet, mopt, x))
    for _ in range(3):
        got, want = step(mica.tensor(x)), train(torch, nets[0], opts[0], torch.tensor(x))
        assert type(got[1]) is float and type(got[2]) is int and got[3] is True
        np.testing.assert_allclose(got[1], want[1], rtol=1e-6)
        assert got[2] == want[2]
        np.testing.assert_allclose(np.asarray(got[4]), want[4].detach().numpy(), rtol=1e-5)
    assert len({id(p) for p in step.built.values()}) == 1
    with pytest.raises(mica.MicaError, match=r"^x\.item\(\) inside a traced step has no value while tracing"):
        mica.compile(lambda x: x * 2 if x.sum().item() > 0 else x)(x)
    with pytest.raises(mica.MicaError, match=r"^a Tensor with 12 elements cannot be converted to a number"):
        mica.compile(lambda x: x.item())(x)


def test_tensor_of_traced_values_is_their_detached_copy_as_torchs():
    """actor_critic.py's `F.smooth_l1_loss(value, torch.tensor([R]))`, R an element of a traced
    tensor: torch.tensor copies the values, without their history."""
    import torch

    returns, value = np.array([1.0, 2.0, 2.5], np.float32), np.array([0.5], np.float32)

    def f(lib, returns, value):
        R = returns[2]
        loss = lib.nn.functional.smooth_l1_loss(value, lib.tensor([R]))
        mixed = lib.tensor([[R, 1.0], [2, R * 2]])
        counted = lib.tensor([(returns > 1.5).sum(), 3])
        return loss, mixed, counted, (lib.tensor([R]) * returns[2]).sum() + returns.sum()

    def with_grads(returns, value):
        loss, mixed, counted, total = f(mica, returns, value)
        return loss, mixed, counted, mica.grad(loss, value), mica.grad(total, returns)

    got = mica.compile(with_grads)(mica.tensor(returns), mica.tensor(value))
    tr, tv = torch.tensor(returns, requires_grad=True), torch.tensor(value, requires_grad=True)
    loss, mixed, counted, total = f(torch, tr, tv)
    loss.backward()
    total.backward()
    for g, w in zip(got[:3], (loss, mixed, counted)):
        np.testing.assert_array_equal(np.asarray(g), w.detach().numpy())
        assert np.asarray(g).dtype == w.detach().numpy().dtype
    np.testing.assert_array_equal(np.asarray(got[3]), tv.grad.numpy())
    np.testing.assert_array_equal(np.asarray(got[4]), tr.grad.numpy())
