"""What a PyTorch user writes first and gets wrong, each met by one sentence naming their line (a
new user's trial of the Python API): numpy on traced Tensors, verbs Mica lacks, optimizers built
torch's way, gradients of integers, and a compiled program's inputs of the wrong kind or structure.
Also the Tensor methods torch.Tensor has whose functions Mica has."""
import importlib
import inspect

import numpy as np
import pytest

import mica
import mica.nn.functional as F
from mica.errors import GradError, MissingVerbError, TraceError
from test_cuda import needs_simulator

HERE = __file__


def _line(offset=0):
    """This file:line of the caller's line (plus offset)."""
    return f"test_user_mistakes.py:{inspect.currentframe().f_back.f_lineno + offset}"


def _refused(fn, *specs, error=TraceError):
    with pytest.raises(error) as e:
        mica.trace(fn, *specs)
    return str(e.value)


def test_numpy_on_a_traced_tensor_is_one_sentence_and_numpy_scalars_stay_operands():
    line = _line(1)
    said = _refused(lambda a: np.exp(a).sum(), mica.f32[8, 8])
    assert said.startswith("numpy's exp cannot take a traced Tensor; use mica.exp instead") and line in said
    assert "numpy cannot read it; use mica's verbs" in _refused(lambda a: np.asarray(a), mica.f32[3])
    assert "numpy's sum cannot take a traced Tensor; use mica.sum" in _refused(lambda a: np.sum(a), mica.f32[3])
    # a numpy scalar beside a Tensor is a number, as it was: 2x + 3x - 1 + (2 > x)
    program = mica.trace(lambda a: np.float64(2.0) * a + a * np.float32(3) - np.int64(1) + (np.float32(2) > a),
                         mica.f32[4])
    x = np.array([0.5, 1.5, 2.5, -1.0], np.float32)
    np.testing.assert_allclose(mica.reference.run(program, x), 5 * x - 1 + (x < 2), rtol=1e-12)
    said = _refused(lambda a: np.ones(4) * a, mica.f32[4])
    assert said.startswith("mul cannot take a ndarray (array([1., 1., 1., 1.])); pass a traced Tensor or a number (a "
                           "numpy array becomes a constant Tensor with mica.tensor(array))")
    said = _refused(lambda a: mica.nn.Linear(4, 2)(a), mica.f32[4])
    assert "cannot take a Parameter (Parameter(f32[2, 4]" in said and "); pass a traced Tensor or a number (a " \
        "module's Parameter: call the model through mica.nn.functional_call(model, params, ...), or inside `with " \
        "model.bind(params):`, in the trace)" in said


@pytest.mark.parametrize("make, says", [
    (lambda a: a[a > 0], "indexing with a bool Tensor (a mask) picks a number of elements known only when the program "
                         "runs, which a static shape cannot hold; use mica.where(mask, x, 0), masked_fill, or x[mask] = "
                         "value"),
    (lambda a: a[a[:, 0].long(), [True, False, True, False]], "an index mixing a list with a Tensor is not supported; "
                                                               "make the list a Tensor"),
    (lambda a: a.__setitem__(a > 0, a), "x[mask] = value takes one value for the masked elements, or one per "
                                        "selected element (a 1-d tensor of their count), got f32[3, 4]; use "
                                        "mica.where(mask, values, x) for a tensor of x's shape"),
    (lambda a: a.__setitem__(a, 1.0), "x[index] = value takes a Tensor index as integer positions, or as a bool mask "
                                      "of x's shape [3, 4] or of its leading dims (torch's), got f32[3, 4]"),
    (lambda a: a.expand(2, 3, 4).add_(1.0), "an in-place step on an expanded tensor would write one element of its "
                                            "input many times, which torch refuses; take .clone()"),
])
def test_python_operators_mica_lacks_are_one_sentence_at_the_users_line(make, says):
    """What a static shape cannot hold of torch's indexing, and what torch refuses of item assignment
    and in-place steps, name the user's line instead of Python's TypeError."""
    with pytest.raises(mica.MicaError) as e:
        mica.trace(make, mica.f32[3, 4])
    assert str(e.value).startswith(says) and "test_user_mistakes.py:" in str(e.value), str(e.value)


@pytest.mark.parametrize("make, says", [
    (lambda a: F.ctc_loss(a, a, a, a), "Mica has no mica.nn.functional.ctc_loss (torch.nn.functional.ctc_loss); "
                                       "write it from the verbs it has (dir(mica.nn.functional) lists them)"),
    (lambda a: mica.kron(a, a), "Mica has no mica.kron (torch.kron)"),
    (lambda a: a.cummax(0), "Mica has no Tensor.cummax (torch.Tensor.cummax); write it from the verbs it has "
                            "(dir(mica.Tensor) lists them)"),
])
def test_a_verb_mica_lacks_is_one_sentence_and_still_an_attribute_error(make, says):
    with pytest.raises(MissingVerbError) as e:
        mica.trace(make, mica.f32[4, 4])
    assert str(e.value).startswith(says) and "test_user_mistakes.py:" in str(e.value)
    assert isinstance(e.value, AttributeError) and not hasattr(F, "ctc_loss") and not hasattr(mica, "kron")
    assert importlib.import_module("mica.bench.step")  # (submodules still import past the module's __getattr__)


def test_tensor_methods_of_the_functions_mica_has():
    def methods(a, b):
        return (a.narrow(1, 1, 2), a.amin(1), a.argmin(1), a.eq(b), a.ne(b), a.lt(b), a.le(b), a.gt(b), a.ge(b),
                a.gt(0).logical_and(b.gt(0)), a.gt(0).logical_or(b.gt(0)), a.gt(0).logical_not(),
                a.where(a > b, b), a[0].outer(b[1]))

    def functions(a, b):
        return (mica.narrow(a, 1, 1, 2), mica.amin(a, 1), mica.argmin(a, 1), mica.eq(a, b), mica.ne(a, b),
                mica.lt(a, b), mica.le(a, b), mica.gt(a, b), mica.ge(a, b),
                mica.logical_and(mica.gt(a, 0), mica.gt(b, 0)), mica.logical_or(mica.gt(a, 0), mica.gt(b, 0)),
                mica.logical_not(mica.gt(a, 0)), mica.where(a > b, a, b), mica.outer(a[0], b[1]))

    rng = np.random.default_rng(5)
    a, b = (np.round(rng.standard_normal((3, 4)), 1).astype(np.float32) for _ in range(2))
    got = mica.reference.run(mica.trace(methods, mica.f32[3, 4], mica.f32[3, 4]), a, b)
    want = mica.reference.run(mica.trace(functions, mica.f32[3, 4], mica.f32[3, 4]), a, b)
    for g, w in zip(got, want):
        np.testing.assert_array_equal(g, w)
    np.testing.assert_array_equal(got[12], np.where(a > b, a, b))


def test_an_optimizer_built_torchs_way_takes_the_parameters_and_says_what_else_it_takes():
    model = mica.nn.Linear(3, 4)
    params = model.init(0)
    opt = mica.optim.AdamW(model.parameters(), lr=1e-3)  # (torch's: one group of the model's Parameters)
    assert [names for _, names in opt.groups(list(params))] == [["weight", "bias"]]
    assert mica.optim.AdamW([{"params": ["weight"], "weight_decay": 0.0}], lr=1e-3).param_groups
    with pytest.raises(mica.MicaError, match=r"^AdamW takes the model's Parameters, or param_groups \(a list of dicts "
                                             r"like .*; the values come to init\(params\) and update\(params, grads, "
                                             r"state\) \(Mica's optimizers are functional\) \(.*test_user_mistakes"):
        mica.optim.AdamW(params, lr=1e-3)


def test_gradients_asked_of_what_has_none_or_the_wrong_way():
    line = _line(1)
    said = _refused(lambda a, i: mica.grad((a * i).sum(), i), mica.f32[4], mica.i64[4], error=GradError)
    assert said.startswith("mica.grad: wrt holds i64[4], which has no gradient (only floating Tensors do)")
    assert line in said
    said = _refused(lambda a: mica.grad(lambda x: x.sum())(a), mica.f32[4])
    assert said.startswith("mica.grad(loss, wrt) differentiates a traced loss Tensor with respect to `wrt`; for a "
                           "function, mica.value_and_grad(fn)(*args)")
    said = _refused(lambda a: mica.value_and_grad(lambda a: (a.sum(), a))(a), mica.f32[4])
    assert "got tuple; a function returning (loss, extra) goes to mica.value_and_grad(fn, has_aux=True)" in said


def test_a_compiled_programs_inputs_of_the_wrong_kind_or_structure():
    def lookup(p, i):
        return F.linear(F.embedding(i, p["w"]), p["l"]).sum()

    exe = mica.compile(lookup, {"w": mica.f32[5, 3], "l": mica.f32[2, 3]}, mica.i64[3], name="lookup")
    rng = np.random.default_rng(2)
    p = {"w": rng.standard_normal((5, 3)).astype(np.float32), "l": rng.standard_normal((2, 3)).astype(np.float32)}
    want = float(exe(p, np.array([0, 4, 2])))
    # what converts as numpy's and torch's assignments convert: float64 weights, int32 indices
    assert float(exe({k: v.astype(np.float64) for k, v in p.items()}, np.array([0, 4, 2], np.int32))) == want
    for bad, says in (
            (np.array([0.5, 4.2, 2.9]), "lookup: input 2 (i) is i64[3] and got float64 values; pass an array of "
                                        "integers "
                                        "(e.g. np.asarray(x, np.int64))"),
            (np.array([1 + 2j, 0, 0]), "lookup: input 2 (i) is i64[3] and got complex128 values"),
            (np.array(["a", "b", "c"]), "lookup: input 2 (i) is i64[3] and got <U1 values")):
        with pytest.raises(mica.MicaError) as e:
            exe(p, bad)
        assert str(e.value).startswith(says)
    with pytest.raises(mica.MicaError, match=r"^lookup: input 0 \(p\['w'\]\) is f32\[5, 3\] and got complex64 values; "
                                             r"pass an array of real numbers"):
        exe({"w": p["w"].astype(np.complex64), "l": p["l"]}, np.array([0, 1, 2]))
    with pytest.raises(mica.MicaError, match=r"^lookup: input 2 \(i\) is i64\[3\] and got shape \(2,\); pass an "
                                             r"array of shape \(3,\)"):
        exe.set_input(2, np.array([0, 1]))
    for args, says in (
            (({"w": p["w"]}, np.arange(3)), "argument 0 lacks 'l'"),
            (({**p, "b": p["l"]}, np.arange(3)), "argument 0 has 'b', which the traced one does not"),
            ((p, [0, 1, 2]), "argument 1 is a list where an array was traced (pass it as one: np.asarray)"),
            ((p,), "called with 1 argument, traced with 2")):
        with pytest.raises(TraceError) as e:
            exe(*args)
        said, line = str(e.value), _line(-1)  # (the call's line, which the sentence names)
        assert said.startswith(f"lookup: the arguments differ from the traced ones: {says} (") and said.endswith(
            f"{line})"), said


@pytest.mark.parametrize("target", ["cpu", pytest.param("cuda-sim", marks=needs_simulator)])
def test_integers_out_of_an_inputs_range_and_a_bad_dropout_key_are_sentences(target):
    """numpy's cast wrapped 2**40 + 5 into an int32 input as 5, silently; a seed of 'a' was Python's
    ValueError. Both are sentences at the call's line; a seed of 64 bits (unsigned too) is a key, an
    offset 32 bits (above, it repeated the masks of the offset 2**32 below)."""
    options = {"simulate": True} if target == "cuda-sim" else {}
    exe = mica.trace(lambda a: a * 2, mica.i32[2]).lower(target.split("-")[0], **options).build()
    with pytest.raises(mica.MicaError, match=r"input 0 \(a\) is i32\[2\] and got 1099511627781, outside int32's range; "
                                             r"pass values from -2147483648 to 2147483647 \(.*test_user_mistakes"):
        exe(np.array([1, 2 ** 40 + 5]))
    with pytest.raises(mica.MicaError, match=r"input 0 \(a\) is i32\[2\] and got -2147483649, outside"):
        exe(np.array([-2 ** 31 - 1, 0]))
    for key in (dict(seed="a"), dict(seed=2 ** 64), dict(seed=True)):
        with pytest.raises(mica.MicaError, match=r"seed must be a whole number of 64 bits"):
            exe(np.array([1, 2]), **key)
    for key in (dict(offset=1.5), dict(offset=2 ** 32), dict(offset=-1), dict(offset=(3 << 32) | 5)):
        # (the offset is one 32-bit word of Philox's counter: a larger one repeated a smaller one's masks)
        with pytest.raises(mica.MicaError, match=r"offset must be a whole number from 0 to 2\*\*32 - 1"):
            exe(np.array([1, 2]), **key)
    assert np.array_equal(exe(np.array([1, -3]), seed=2 ** 64 - 1, offset=np.int64(4)), [2, -6])


def test_a_boolean_input_takes_0_1_integers_and_refuses_floats():
    from types import SimpleNamespace

    from mica.inputs import check_input

    mask = SimpleNamespace(dtype=mica.bool_, shape=(3,))
    assert check_input(np.array([1, 0, 1]), mask, 0, "f").dtype.kind == "i"
    with pytest.raises(mica.MicaError, match=r"^f: input 0 is b8\[3\] and got float64 values; pass an array of "
                                             r"booleans"):
        check_input(np.array([0.5, 1.0, 0.0]), mask, 0, "f")


def test_a_compiled_programs_call_and_options_are_sentences_at_the_users_line():
    """What a new user tried on the compiled program: simulate given to build() (as docs/api.md's
    comment reads), keywords the call does not take, threads that are no count, remat='yes', text
    for an array; lower()'s own refusals name the line too, and a kernel's failure at run time names
    the line that traced its verb."""
    def step(w, x):
        return (x @ w).square().mean()

    program = mica.trace(step, mica.f32[16, 8], mica.f32[4, 16])

    def said(fn):
        with pytest.raises(mica.MicaError) as e:
            fn()
        assert e.value.loc and e.value.loc[0] == HERE, e.value  # (this file's line that called)
        return e.value.sentence

    assert said(lambda: program.lower("cuda").build(simulate=True)).startswith(
        "build() takes no options here, not simulate=...; the target's options (simulate, tf32, ...) are lower()'s")
    assert said(lambda: program.lower("cpu", frob=1)).startswith("the cpu target has no option 'frob'")
    assert said(lambda: program.lower("cpu", remat="yes")) == "remat must be True or False, got 'yes'"
    exe = program.lower("cpu").build()
    w, x = np.random.randn(16, 8), np.random.randn(4, 16)
    assert said(lambda: exe(w, x, device="cuda")).startswith(
        "a compiled program takes its traced arguments and the keywords threads, seed, offset, not device=...")
    for bad in (-1, 0, "2", True):
        assert said(lambda: exe(w, x, threads=bad)).startswith("threads must be a positive whole number")
    assert said(lambda: exe("hello", x)) == "step: input 0 (w) is f32[16, 8] and got <U5 values; pass an array " \
                                            "of real numbers (e.g. np.asarray(x, np.float32))"
    np.testing.assert_allclose(exe(w, x, threads=2), ((x @ w) ** 2).mean(), rtol=1e-5)

    def lookup(table, idx, t):
        return F.cross_entropy(F.embedding(idx, table), t)

    looked = mica.compile(lookup, mica.f32[10, 5], mica.i64[4], mica.i64[4])
    table = np.random.randn(10, 5).astype(np.float32)
    with pytest.raises(mica.MicaError) as e:
        looked(table, np.array([1, 2, 12, 3]), np.array([0, 1, 2, 3]))
    assert e.value.sentence == "embedding: index 12 is out of range for 10 embeddings; give indices below the " \
                               "table's row count (a data id beyond the vocabulary?)"
    assert e.value.loc == (HERE, lookup.__code__.co_firstlineno + 1)  # (the line that traced the embedding)


_EAGER_MISTAKES = [
    (lambda t: t.ones(4, 8) @ t.ones(4, 8), r"matmul: cannot multiply f32\[4, 8\] by f32\[4, 8\]"),
    (lambda t: t.arange(12).view(3, 4) @ t.ones(4, 2), r"matmul: operands must have one element type, got i64"),
    (lambda t: t.ones(4, 8) + t.ones(3, 8), r"add: shapes \[4, 8\] and \[3, 8\] do not broadcast"),
    (lambda t: t.ones(4, 8) < t.ones(3, 8), r"lt: shapes \[4, 8\] and \[3, 8\] do not broadcast"),
    (lambda t: t.ones(4, 8).view(5, 7), r"cannot view f32\[4, 8\] \(32 elements\) as shape \[5, 7\]"),
    (lambda t: t.ones(4, 8)[:, :4].view(5, 7), r"cannot view f32\[4, 4\] \(16 elements\) as shape \[5, 7\]"),
    (lambda t: t.ones(4, 8).reshape(-1, 5), r"cannot view f32\[4, 8\] as shape \[-1, 5\]"),
    (lambda t: t.ones(4, 8)[5], r"indexing: index 5 is out of bounds for axis 0 with size 4"),
    (lambda t: t.ones(4, 8)[:, :2.5], r"slice indices must be whole numbers or None, got None:2.5"),
    (lambda t: t.ones(4, 8).permute(0, 2, 1), r"permute: \[0, 2, 1\] names 3 dims but the tensor has 2"),
    (lambda t: t.tensor([[1, 2], [3]]), r"tensor: the nested lists are of different lengths"),
    (lambda t: t.nn.functional.cross_entropy(t.ones(2, 10), t.tensor([1, 10])), r"cross_entropy: target 10 is out"),
    (lambda t: t.ones(2, 3).gather(1, t.tensor([[0], [3]])), r"an index tensor holds 3, out of range"),
    (lambda t: t.ones(4, 8).split(2.5, 1), r"split: split_size_or_sections is a whole number or a list"),
    (lambda t: t.ones(4, 8).repeat(-1, 2), r"repeat: the counts \[-1, 2\] must be 0 or more"),
    (lambda t: t.ones(4, 8).masked_fill(t.ones(4, 7) > 0, 0.0), r"masked_fill: the mask's shape \[4, 7\] does not"),
    (lambda t: t.nn.functional.scaled_dot_product_attention(t.ones(2, 8, 4), t.ones(2, 8, 4), t.ones(2, 8, 4),
                                                            attn_mask=t.ones(8, 7)),
     r"scaled_dot_product_attention: attn_mask f32\[8, 7\] does not broadcast to the scores' shape \[2, 8, 8\]"),
    (lambda t: t.nn.Sequential(t.nn.Linear(4, 4), "relu"), r"Sequential holds mica.nn.Module objects, got a str"),
    (lambda t: t.f32[4, -1], r"a shape holds whole numbers >= 0; got \(4, -1\)"),
]


@pytest.mark.parametrize("mistake, sentence", _EAGER_MISTAKES, ids=[str(i) for i in range(len(_EAGER_MISTAKES))])
def test_a_mistake_outside_a_trace_is_one_sentence_at_the_users_line(mistake, sentence):
    """Outside a trace (a model's __init__, a sampling loop, a notebook) the mistakes a trace names
    in one sentence were numpy's messages, Python's TypeError or a Mica error without a line, each
    a traceback through Mica's frames: now each is Mica's sentence at this file's line; torch
    refuses every one of them too. An index out of range is an IndexError too, as torch's."""
    with pytest.raises(mica.MicaError, match=sentence) as e:
        mistake(mica)
    assert e.value.loc and e.value.loc[0] == __file__, e.value
    import torch

    if "shape holds" not in sentence:  # (torch refuses the same, where torch has the verb: not mica.f32)
        with pytest.raises((RuntimeError, ValueError, IndexError, TypeError)):
            mistake(torch)
    with pytest.raises(IndexError):
        mica.ones(4, 8)[:, 10]


def test_an_index_out_of_range_at_run_time_names_the_line_that_indexed():
    """A compiled x[idx] (or gather) whose index is out of range when it runs stops with the
    sentence at the line that indexed, not the call's (the check's sentence names no verb)."""
    def pick(table, idx):
        return table[idx].sum()  # the line the error names

    exe = mica.compile(pick, mica.f32[10, 3], mica.i64[3])
    line = inspect.getsourcelines(pick)[1] + 1
    with pytest.raises(mica.MicaError, match=r"an index tensor holds 13, out of range") as e:
        exe(np.ones((10, 3), np.float32), np.array([1, 2, 13]))
    assert e.value.loc == (__file__, line), e.value


def test_backward_on_a_loss_nothing_trainable_reaches_says_what_to_make_a_parameter():
    """W = torch.randn(8, 4) without requires_grad in a compiled step: backward() said to put the
    step under @mica.compile, where it already was; it says what torch says and what to make."""
    W = mica.randn(8, 4)

    @mica.compile
    def step(x):
        loss = (x @ W).square().mean()
        loss.backward()
        return loss

    with pytest.raises(mica.MicaError, match=r"^backward\(\): no tensor this loss is computed from requires a gradient"
                                             r".*requires_grad=True.*test_user_mistakes"):
        step(np.ones((2, 8), np.float32))


def test_backward_with_nothing_requiring_a_gradient_is_its_sentence_before_the_next_line_reads_grad():
    """makemore's learners forget requires_grad: the line after backward(), p.data += -lr * p.grad,
    failed on None with a traceback in the step's first trace before the sentence could be said."""
    W = mica.randn(3, 1)
    m = mica.nn.Linear(3, 1)
    for p in m.parameters():
        p.requires_grad_(False)

    def forgot(x):
        loss = mica.nn.functional.mse_loss(x @ W, x[:, :1])
        loss.backward()
        W.data += -0.1 * W.grad
        return loss

    def frozen(x):
        loss = m(x).square().mean()
        loss.backward()
        for p in m.parameters():
            p.data += -0.1 * p.grad
        return loss

    x = np.random.default_rng(0).standard_normal((2, 3)).astype(np.float32)
    with pytest.raises(mica.MicaError, match=r"^backward\(\): no tensor this loss is computed from requires a gradient"
                                             r".*requires_grad=True.*test_user_mistakes.py:\d+\)$"):
        mica.compile(forgot)(x)
    with pytest.raises(mica.MicaError, match=r"^backward\(\) was called on a loss that no parameter requiring a "
                                             r"gradient reaches .*frozen parameters.*test_user_mistakes.py:\d+\)$"):
        mica.compile(frozen)(x)


@pytest.mark.parametrize("write", [lambda w: w.mul_(0.5), lambda w: w.__setitem__(0, 1.0), lambda w: w[0].zero_(),
                                   lambda w: w.view(-1).add_(1.0)])
def test_an_in_place_change_of_a_trained_parameter_where_gradients_are_recorded_is_refused_as_torch(write):
    """torch refuses an in-place step on a leaf that requires grad (or a view of one) outside
    no_grad; the step ran it as no_grad would, silently training another model."""
    import torch

    w = torch.nn.Linear(4, 3).weight
    with pytest.raises(RuntimeError, match="leaf Variable that requires grad"):
        write(w)
    m = mica.nn.Linear(4, 3)
    opt = mica.optim.SGD(m.parameters(), lr=0.1)

    @mica.compile
    def step(x):
        write(m.weight)  # (the line named is the lambda's, in this file)
        loss = m(x).sum()
        loss.backward()
        opt.step()
        return loss

    with pytest.raises(mica.MicaError, match=r"^the parameter weight requires a gradient and is changed in place where "
                                             r"gradients are recorded .*torch.no_grad\(\).*test_user_mistakes.py:3"):
        step(np.ones((2, 4), np.float32))


def test_a_parameters_data_and_no_grad_writes_are_torchs_in_a_compiled_step():
    """p.data is torch's detached alias (a write through it is not recorded, so allowed), as is a
    write under no_grad: the same losses and weights as torch's on the same numbers."""
    import torch

    rng = np.random.default_rng(3)
    W0, x = rng.standard_normal((3, 4)).astype(np.float32), rng.standard_normal((5, 4)).astype(np.float32)

    def run(lib, compile):
        W = mica.nn.Parameter(W0.copy()) if lib is mica else torch.tensor(W0.copy(), requires_grad=True)
        xs = x if lib is mica else torch.tensor(x)

        def step(xb):
            loss = (xb @ W.t()).tanh().square().mean()
            loss.backward()
            W.data.mul_(0.9)           # (decay through .data)
            W.data += -0.5 * W.grad    # (makemore's form)
            with lib.no_grad():
                W[0] -= 0.1 * W.grad[0]
            W.grad = None
            return loss

        step = compile(step)
        losses = [float(step(xs)) for _ in range(3)]
        return losses, np.asarray(W.detach() if lib is torch else W)

    got, want = run(mica, mica.compile), run(torch, lambda f: f)
    np.testing.assert_allclose(got[0], want[0], rtol=2e-6)
    np.testing.assert_allclose(got[1], want[1], rtol=2e-6, atol=1e-7)


def test_a_parameter_changed_with_gradients_off_by_any_of_torchs_forms_is_not_refused():
    """torch's set_grad_enabled(False) called alone (not as a `with`) turns gradients off at once, and
    a Parameter with requires_grad_(False) is no trained leaf: both writes are torch's and compile;
    after opt.step() the parameter is a leaf still, so a write with gradients on is refused there too."""
    import torch

    def run(lib):
        m = lib.nn.Linear(4, 3)
        m.load_state_dict({"weight": np.arange(12, dtype=np.float32).reshape(3, 4) / 10, "bias": np.zeros(3, np.float32)}
                          if lib is mica else {"weight": torch.arange(12.).reshape(3, 4) / 10, "bias": torch.zeros(3)})
        opt = lib.optim.SGD(m.parameters(), lr=0.1)
        w = list(m.parameters())[0]

        def step(x):
            lib.set_grad_enabled(False)
            w.mul_(0.9)
            lib.set_grad_enabled(True)
            w.requires_grad_(False)
            w.add_(0.5)
            w.requires_grad_(True)
            loss = m(x).square().sum()
            loss.backward()
            opt.step()
            opt.zero_grad()
            return loss
        step = mica.compile(step) if lib is mica else step
        x = np.ones((2, 4), np.float32)
        return [float(step(x if lib is mica else torch.tensor(x))) for _ in range(2)]

    np.testing.assert_allclose(run(mica), run(torch), rtol=1e-6)

    m = mica.nn.Linear(4, 3)
    opt = mica.optim.SGD(m.parameters(), lr=0.1)

    @mica.compile
    def after(x):
        m(x).sum().backward()
        opt.step()
        m.weight.mul_(0.5)
        return x.sum()

    with pytest.raises(mica.MicaError, match="^the parameter weight requires a gradient"):
        after(np.ones((2, 4), np.float32))


def test_an_outside_sweep_of_mistakes_gets_sentences_at_the_users_line():
    """From an outside sweep of user mistakes: values torch refuses (a dropout_p outside [0, 1],
    which gave zeros or crashed the oracle; a float ignore_index, which halved the loss; a str
    correction or fill value, which raised Python's errors), a float index tensor, .numpy() in a
    trace, cat(a, b), a module without forward(), and bind()'s params missing or not a dict (both
    said at contextlib.py's line) are sentences at the user's line."""
    q = mica.f32[1, 2, 4, 8]
    for p in (2.0, -0.5, "x"):
        line = _line(1)
        said = _refused(lambda a: F.scaled_dot_product_attention(a, a, a, dropout_p=p), q, error=mica.MicaError)
        assert said.startswith(f"scaled_dot_product_attention: dropout_p must be a number in [0, 1], got {p!r}")
        assert line in said
    assert "dropout: probability must be a number in [0, 1], got 1.5" in _refused(
        lambda a: F.dropout(a, 1.5), q, error=mica.MicaError)
    for verb in (F.cross_entropy, F.nll_loss):
        said = _refused(lambda x, t: verb(x, t, ignore_index=1.5), mica.f32[4, 5], mica.i64[4], error=mica.MicaError)
        assert said.startswith(f"{verb.__name__}: ignore_index must be an int"), said
    line = _line(1)
    said = _refused(lambda x: x.var(dim=1, correction="x"), mica.f32[4, 5], error=mica.MicaError)
    assert said.startswith("var/std: correction must be a number") and line in said
    assert _refused(lambda x: x + mica.full((4, 5), "x"), mica.f32[4, 5], error=mica.MicaError).startswith(
        "full: fill_value must be a number or a bool, got 'x'")
    assert _refused(lambda x: x[x], mica.f32[4], error=mica.MicaError).startswith(
        "tensors used as indices must be integer or bool tensors, got float32")
    line = _line(1)
    said = _refused(lambda x: x.numpy(), mica.f32[4])
    assert "cannot read it; return it from the traced function" in said and line in said
    for verb in (mica.cat, mica.stack):
        assert _refused(lambda x: verb(x, x), mica.f32[4], error=mica.MicaError).startswith(
            f"{verb.__name__} takes its tensors as one list or tuple")
    for bad, says in ((lambda a: mica.eye(-2), "eye: n and m are sizes, 0 or more, got -2"),
                      (lambda a: a.unflatten(1, (4, 2)), "unflatten: sizes [4, 2] must multiply to dim 1's size 4"),
                      (lambda a: a.index_add(0, mica.tensor([0, 1]), mica.ones(3, 4)),
                       "index_add: source must be [2, 4] (the input's shape, dim 0 the index's length), got [3, 4]"),
                      (lambda a: a.reshape(7, -1), "view: cannot view f32[3, 4] as shape [7, -1]: its 12 elements "
                                                   "are not a whole number of 7s")):
        assert _refused(bad, mica.f32[3, 4], error=mica.MicaError).startswith(says)

    class NoForward(mica.nn.Module):
        def __init__(self):
            super().__init__()
            self.layer = mica.nn.Linear(2, 2)

    m = NoForward()
    line = _line(1)
    said = _refused(lambda p, x: mica.nn.functional_call(m, p, x).sum(), m.param_specs(), mica.f32[2, 2],
                    error=mica.MicaError)
    assert said.startswith("NoForward defines no forward()") and line in said
    lin = mica.nn.Linear(3, 2)
    some = {k: v for k, v in lin.param_specs().items() if k != "bias"}
    line = _line(1)
    said = _refused(lambda p, x: mica.nn.functional_call(lin, p, x).sum(), some, mica.f32[2, 3], error=mica.MicaError)
    assert said.startswith("bind: no value given for parameter 'bias'") and line in said, said

    def swapped(x, p):
        with lin.bind(p):  # (the specs given in the other order)
            return lin(x).sum()

    line = _line(-3)
    said = _refused(swapped, lin.param_specs(), mica.f32[2, 3], error=mica.MicaError)
    assert said.startswith("bind: params must be a dict of the model's parameters") and line in said, said


@pytest.mark.parametrize("call, says", [
    ("F.cross_entropy(a, t, reduce_mode='mean')",
     "cross_entropy() got an unexpected keyword argument 'reduce_mode'"),
    ("a.sum(dimm=1)", "Tensor.sum() got an unexpected keyword argument 'dimm'"),
    ("a.view(shape=(20,))", "Tensor.view() got an unexpected keyword argument 'shape'"),
    ("mica.cumsum(a)", "cumsum() missing 1 required positional argument: 'dim'"),
    ("mica.nn.functional_call(lin, p, (a, a))", "Linear.forward() takes 2 positional arguments but 3 were given"),
    ("lin.bind(p, 1).__enter__()", "Module.bind() takes 2 positional arguments but 3 were given"),
])
def test_a_call_its_signature_has_no_place_for_ends_a_script_with_a_sentence(tmp_path, call, says):
    """A verb, Tensor method or module called with arguments its signature lacks (torch refuses them
    too) ends a script with Python's reason as one sentence at the user's line, not a traceback
    through Mica's frames; the user's own TypeErrors keep Python's traceback."""
    import os
    import subprocess
    import sys

    script = tmp_path / "mine.py"
    script.write_text("import mica\nimport mica.nn.functional as F\nlin = mica.nn.Linear(5, 2)\n\n"
                      f"def step(p, a, t):\n    return {call}\n\n"
                      "mica.trace(step, lin.param_specs(), mica.f32[4, 5], mica.i64[4])\n")
    env = {**os.environ, "PYTHONPATH": os.path.dirname(os.path.dirname(os.path.abspath(__file__)))}
    env.pop("MICA_TRACEBACK", None)
    r = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, cwd=tmp_path, env=env)
    assert r.returncode == 1 and r.stderr.startswith(f"mica: error: {says}; call it with the arguments"), r.stderr
    assert r.stderr.strip().endswith("(mine.py:6)") and len(r.stderr.strip().splitlines()) == 1, r.stderr
    for text, says in (("def f(x):\n    pass\n\nf(1, 2)\n", "f() takes 1 positional argument but 2 were given"),
                       ("import contextlib\n\n@contextlib.contextmanager\ndef opened(p):\n    yield p\n\n"
                        "with opened(1, 2):\n    pass\n", "opened() takes 1 positional argument but 2 were given"),
                       ("class Tensor:\n    def sum(self, a):\n        return a\n\nTensor().sum(1, 2)\n",
                        "Tensor.sum() takes 2 positional arguments but 3 were given")):
        (tmp_path / "theirs.py").write_text("import mica\n" + text)  # (the user's own: Python's traceback)
        r = subprocess.run([sys.executable, str(tmp_path / "theirs.py")], capture_output=True, text=True, env=env)
        assert "Traceback" in r.stderr and says in r.stderr, r.stderr
