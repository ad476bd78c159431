#!/usr/bin/env python3
# kevo_torch.py: kevo's PyTorch helper for KernelBench-format problems (a file with `class Model(nn.Module)`,
# module-level sizes, `get_inputs()` and `get_init_inputs()`). Trusted: it runs beside kevo's checker, never
# in a candidate's jail. Embedded in kevo/eval/harness/embedded_sources.hpp and written to kevo's cache.
#
#   python3 kevo_torch.py describe FILE [--scale F] [--device cpu|cuda]   one JSON line: the problem kevo learns
#   python3 kevo_torch.py serve FILE [--scale F] [--device D]              the checker's reference (binary, stdin/stdout)
#   python3 kevo_torch.py serve-runs FILE --control-fd N [...]             the same for one checker run after another, kept
#                                                                         alive by kevo's evaluator: each run a connection
#   python3 kevo_torch.py time FILE [--scale F] [--device D] [--repetitions N] [--peers]
#                                                                         PyTorch eager (and torch.compile) timed
#
# Tensors cross the wire as 4-byte words: float32 and int32 as they are, int64 narrowed to int32 (every value
# must fit, else the call fails), float16 as its two bytes widened to a word's low half.
import argparse
import importlib.util
import inspect
import json
import math
import os
import socket
import struct
import sys
import time
import traceback


class Unusable(Exception):
    """The file cannot be a kevo problem; the message says why, in one line."""


KERNEL_TYPES = {"float32": "float", "float16": "half", "int32": "int", "int64": "int"}


def load_module(path, scale):
    import torch

    spec = importlib.util.spec_from_file_location("kevo_problem_module", path)
    if spec is None or spec.loader is None:
        raise Unusable("it is not a Python file")
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except BaseException as e:  # SystemExit from a script body counts too
        raise Unusable(f"importing it raised {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}".rstrip(": "))
    model = getattr(module, "Model", None)
    if not (isinstance(model, type) and issubclass(model, torch.nn.Module)):
        raise Unusable("it defines no `class Model(nn.Module)`")
    if not callable(getattr(module, "get_inputs", None)):
        raise Unusable("it defines no `get_inputs()`")
    scaled = {}
    if scale != 1.0:
        # Sizes are the module's integer constants of 64 or more; smaller ones are dims, kernel sizes and counts.
        for name, value in list(vars(module).items()):
            if type(value) is int and value >= 64 and not name.startswith("_"):
                new = max(16, int(round(value * scale)))
                setattr(module, name, new)
                scaled[name] = [value, new]
    return module, scaled


def instantiate(module, seed, device):
    """The Model and its inputs under `seed`: the module's own get_init_inputs() and get_inputs()."""
    import torch

    seed %= 1 << 62  # torch takes seeds below 2^64; kevo's are any 64-bit value
    torch.manual_seed(seed)
    get_init = getattr(module, "get_init_inputs", None)
    try:
        init = list(get_init()) if callable(get_init) else []
    except Exception as e:
        raise Unusable(f"get_init_inputs() raised {type(e).__name__}: {e}")
    try:
        model = module.Model(*init)
    except Exception as e:
        raise Unusable(f"Model(*get_init_inputs()) raised {type(e).__name__}: {e}")
    model = model.to(device).eval()
    torch.manual_seed(seed + 0x5EED)
    try:
        inputs = module.get_inputs()
    except Exception as e:
        raise Unusable(f"get_inputs() raised {type(e).__name__}: {e}")
    if not isinstance(inputs, (list, tuple)):
        raise Unusable(f"get_inputs() returned a {type(inputs).__name__}, not a list of tensors")
    for i, t in enumerate(inputs):
        if not isinstance(t, torch.Tensor):
            raise Unusable(f"get_inputs() item {i} is a {type(t).__name__}, not a tensor (kevo passes only tensors to kernels)")
    return model, [t.to(device) for t in inputs]


def state_tensors(model):
    """The module's parameters and buffers, in a fixed order: candidates receive them as inputs."""
    return list(model.named_parameters()) + [(n, b) for n, b in model.named_buffers() if b is not None]


def forward_names(model, count):
    try:
        params = list(inspect.signature(model.forward).parameters.values())
    except (TypeError, ValueError):
        params = []
    names = [p.name for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    if len(names) < count:
        names = [f"in{i}" for i in range(count)]
    return names[:count]


def outputs_of(result):
    import torch

    if isinstance(result, torch.Tensor):
        return [result]
    if isinstance(result, (list, tuple)) and result and all(isinstance(t, torch.Tensor) for t in result):
        return list(result)
    if isinstance(result, (list, tuple)):
        raise Unusable("forward() returns a nested or non-tensor sequence (kevo takes a tensor or a flat tuple of tensors)")
    raise Unusable(f"forward() returns a {type(result).__name__}, not a tensor")


def type_of(tensor, what):
    name = str(tensor.dtype).replace("torch.", "")
    if name not in KERNEL_TYPES:
        raise Unusable(f"{what} is {name}: kevo has no kernel type for it (float32, float16, int32 and int64 are taken)")
    return name


def unique_names(names):
    seen, out = set(), []
    for n in names:
        n = "".join(c if c.isalnum() or c == "_" else "_" for c in n) or "t"
        if n[0].isdigit():
            n = "t" + n
        base, k = n, 1
        while n in seen or n in ("shape", "Shape", "kernel", "reference"):
            n, k = f"{base}_{k}", k + 1
        seen.add(n)
        out.append(n)
    return out


# ---- the template families: a forward of one op kevo has a template for ----


def _prod(xs):
    p = 1
    for x in xs:
        p *= int(x)
    return p


def _split(shape, dim):
    dim = dim % len(shape)
    return _prod(shape[:dim]), int(shape[dim]), _prod(shape[dim + 1:])


def traced_ops(model):
    """(kind, name, args, kwargs) of every call in forward, as torch.fx sees it; None where it cannot trace."""
    import torch
    import torch.fx

    try:
        graph = torch.fx.symbolic_trace(model).graph
    except Exception:
        return None
    ops = []
    for node in graph.nodes:
        if node.op == "call_function":
            ops.append(("function", getattr(node.target, "__name__", str(node.target)), node.args, dict(node.kwargs)))
        elif node.op == "call_method":
            ops.append(("method", node.target, node.args, dict(node.kwargs)))
        elif node.op == "call_module":
            ops.append(("module", type(model.get_submodule(node.target)).__name__, node.args, dict(node.kwargs), model.get_submodule(node.target)))
    return ops


ELEMENTWISE = {  # op name in a trace -> (family op, torch function of x and its parameters)
    "relu": "relu", "ReLU": "relu", "leaky_relu": "leaky_relu", "LeakyReLU": "leaky_relu", "sigmoid": "sigmoid",
    "Sigmoid": "sigmoid", "tanh": "tanh", "Tanh": "tanh", "gelu": "gelu", "GELU": "gelu", "elu": "elu", "ELU": "elu",
    "selu": "selu", "SELU": "selu", "softplus": "softplus", "Softplus": "softplus", "softsign": "softsign",
    "Softsign": "softsign", "hardtanh": "hardtanh", "Hardtanh": "hardtanh", "hardsigmoid": "hardsigmoid",
    "Hardsigmoid": "hardsigmoid", "silu": "silu", "SiLU": "silu", "mish": "mish", "Mish": "mish",
    "hardswish": "hardswish", "Hardswish": "hardswish",
}


def elementwise_reference(op, x, p):
    import torch.nn.functional as F

    return {
        "relu": lambda: F.relu(x), "leaky_relu": lambda: F.leaky_relu(x, p["negative_slope"]), "sigmoid": lambda: x.sigmoid(),
        "tanh": lambda: x.tanh(), "gelu": lambda: F.gelu(x, approximate=p["approximate"]), "elu": lambda: F.elu(x, p["alpha"]),
        "selu": lambda: F.selu(x), "softplus": lambda: F.softplus(x, p["beta"], p["threshold"]), "softsign": lambda: F.softsign(x),
        "hardtanh": lambda: F.hardtanh(x, p["min_val"], p["max_val"]), "hardsigmoid": lambda: F.hardsigmoid(x),
        "silu": lambda: F.silu(x), "mish": lambda: F.mish(x), "hardswish": lambda: F.hardswish(x),
    }[op]()


def floats_in(call):
    """Every float literal among a traced call's arguments and keyword arguments, and a module's float attributes."""
    values = [a for a in call[2] if isinstance(a, float)] + [v for v in call[3].values() if isinstance(v, float)]
    if call[0] == "module":
        values += [v for v in vars(call[4]).values() if isinstance(v, float)]
    return values


def ints_in(call):
    values = [a for a in call[2][1:] if isinstance(a, int) and not isinstance(a, bool)]
    values += [v for k, v in call[3].items() if k == "dim" and isinstance(v, int)]
    return values


def elementwise_hypotheses(call):
    op = ELEMENTWISE[call[1]]
    floats = floats_in(call)
    kw = call[3]
    module = call[4] if call[0] == "module" else None
    get = lambda name, default: getattr(module, name, kw.get(name, default)) if module is not None else kw.get(name, default)
    if op == "leaky_relu":
        for s in ([get("negative_slope", None)] if get("negative_slope", None) is not None else []) + floats + [0.01]:
            yield {"negative_slope": float(s)}
    elif op == "gelu":
        yield {"approximate": get("approximate", "none")}
    elif op == "elu":
        for a in [get("alpha", 1.0)] + floats:
            yield {"alpha": float(a)}
    elif op == "softplus":
        yield {"beta": float(get("beta", 1.0)), "threshold": float(get("threshold", 20.0))}
    elif op == "hardtanh":
        lo, hi = get("min_val", None), get("max_val", None)
        if lo is None and len(floats) >= 2:
            lo, hi = floats[0], floats[1]
        yield {"min_val": float(-1.0 if lo is None else lo), "max_val": float(1.0 if hi is None else hi)}
    else:
        yield {}


def family_hypotheses(model, inputs, params, out):
    """Families the traced ops suggest, each a description with a PyTorch formula to confirm it by."""
    import torch

    ops = traced_ops(model)
    if ops is None:
        return
    names = [c[1] for c in ops]
    single = len(inputs) == 1 and not params and out.shape == inputs[0].shape and inputs[0].dtype == out.dtype
    x = inputs[0] if inputs else None
    shape = list(x.shape) if x is not None else []

    if single and len(ops) == 1 and ops[0][1] in ELEMENTWISE:
        op = ELEMENTWISE[ops[0][1]]
        for p in elementwise_hypotheses(ops[0]):
            yield {"family": "elementwise", "op": op, "params": p, "n": x.numel()}, (lambda p=p: elementwise_reference(op, x, p))

    if single and any(n in ("softmax", "log_softmax", "Softmax", "LogSoftmax") for n in names) and len(ops) == 1:
        log = "log" in names[0].lower()
        call = ops[0]
        dims = [getattr(call[4], "dim", None)] if call[0] == "module" else ints_in(call)
        for d in [d for d in dims if d is not None] or list(range(len(shape))):
            o, r, i = _split(shape, d)
            f = (lambda d=d: torch.log_softmax(x, d)) if log else (lambda d=d: torch.softmax(x, d))
            yield {"family": "softmax", "log": log, "outer": o, "reduce": r, "inner": i}, f

    if len(inputs) == 1 and out.shape == x.shape and x.is_floating_point():
        # The module's own small floats first (its eps), then the usual defaults: a tiny eps also passes the
        # numeric confirmation, so the first that does must be the module's where it has one.
        own = [float(v) for v in vars(model).values() if isinstance(v, float) and 0 < v < 0.1]
        eps_guesses = list(dict.fromkeys(own + [1e-5, 1e-6, 1e-8, 1e-12]))
        if "LayerNorm" in names or "layer_norm" in names:
            ln = next((c[4] for c in ops if c[1] == "LayerNorm"), None)
            k = len(ln.normalized_shape) if ln is not None else 1
            eps = ln.eps if ln is not None else 1e-5
            o, r = _prod(shape[:-k]), _prod(shape[-k:])
            affine = ln is not None and ln.weight is not None
            if len(params) == (2 if affine else 0):
                yield ({"family": "norm", "kind": "layer", "eps": eps, "affine": affine, "outer": o, "reduce": r, "inner": 1},
                       lambda: torch.nn.functional.layer_norm(x, shape[-k:], ln.weight if affine else None, ln.bias if affine else None, eps))
        if not params:
            for d in range(len(shape)):
                o, r, i = _split(shape, d)
                if "mean" in names and ("sqrt" in names or "rsqrt" in names):
                    for eps in eps_guesses:
                        yield ({"family": "norm", "kind": "rms", "eps": eps, "affine": False, "outer": o, "reduce": r, "inner": i},
                               lambda d=d, eps=eps: x / torch.sqrt(torch.mean(x * x, dim=d, keepdim=True) + eps))
                if "abs" in names and "sum" in names:
                    yield ({"family": "norm", "kind": "l1", "eps": 0.0, "affine": False, "outer": o, "reduce": r, "inner": i},
                           lambda d=d: x / torch.sum(torch.abs(x), dim=d, keepdim=True))
                if "norm" in names:
                    yield ({"family": "norm", "kind": "l2", "eps": 0.0, "affine": False, "outer": o, "reduce": r, "inner": i},
                           lambda d=d: x / torch.norm(x, p=2, dim=d, keepdim=True))
            if "norm" in names:
                yield ({"family": "norm", "kind": "fro", "eps": 0.0, "affine": False, "outer": 1, "reduce": x.numel(), "inner": 1},
                       lambda: x / torch.norm(x, p="fro"))

    reductions = {"sum": "sum", "mean": "mean", "max": "max", "min": "min", "amax": "max", "amin": "min", "argmax": "argmax", "argmin": "argmin"}
    if len(inputs) == 1 and not params and x.is_floating_point():
        for call in ops:
            op = reductions.get(call[1])
            if op is None:
                continue
            for d in range(len(shape)):
                o, r, i = _split(shape, d)
                for keep in (True, False):
                    def f(op=op, d=d, keep=keep):
                        if op in ("max", "min"):
                            return getattr(torch, "a" + op)(x, dim=d, keepdim=keep)
                        return getattr(torch, op)(x, dim=d, keepdim=keep)
                    yield {"family": "reduction", "op": op, "keepdim": keep, "outer": o, "reduce": r, "inner": i}, f

    matmuls = {"matmul", "mm", "bmm", "linear", "Linear"}
    if any(n in matmuls for n in names):
        operands = list(inputs) + [t for _, t in params]
        if "linear" in names or "Linear" in names:
            if len(inputs) == 1 and len(params) in (1, 2) and x.dim() == 2:
                w = params[0][1]
                b = params[1][1] if len(params) == 2 else None
                m, k = x.shape
                n = w.shape[0]
                yield ({"family": "matmul", "batch": 1, "m": m, "n": n, "k": k, "trans_a": False, "trans_b": True, "bias": b is not None},
                       lambda: torch.nn.functional.linear(x, w, b))
        elif len(operands) == 2 and operands[0].dim() == operands[1].dim() and operands[0].dim() in (2, 3):
            a, b = operands
            for ta in (False, True):
                for tb in (False, True):
                    A = a.transpose(-1, -2) if ta else a
                    B = b.transpose(-1, -2) if tb else b
                    if A.shape[-1] != B.shape[-2] or (a.dim() == 3 and a.shape[0] != b.shape[0]):
                        continue
                    batch = a.shape[0] if a.dim() == 3 else 1
                    yield ({"family": "matmul", "batch": batch, "m": A.shape[-2], "n": B.shape[-1], "k": A.shape[-1], "trans_a": ta,
                            "trans_b": tb, "bias": False}, (lambda A=A, B=B: torch.matmul(A, B)))


def match_family(model, inputs, params, out):
    """The first suggested family whose formula gives the module's own output (float64 on both sides, so
    that rounding cannot tell them apart), with a reason where none does."""
    import torch

    with torch.no_grad():
        for description, formula in family_hypotheses(model, inputs, params, out):
            try:
                got = formula()
            except Exception:
                continue
            if got.shape != out.shape or got.dtype != out.dtype:
                continue
            if out.is_floating_point():
                if torch.allclose(got.double(), out.double(), rtol=1e-3, atol=1e-5, equal_nan=True):
                    return description
            elif torch.equal(got, out):
                return description
    return None


# ---- describe ----


def describe(args):
    import torch

    module, scaled = load_module(args.file, args.scale)
    model, inputs = instantiate(module, 1, args.device)
    input_names = forward_names(model, len(inputs))
    state = state_tensors(model)
    held = sum(t.numel() * t.element_size() for t in inputs) + sum(t.numel() * t.element_size() for _, t in state)
    if args.max_bytes and 2 * held > args.max_bytes:  # before forward allocates its outputs too
        raise Unusable(f"its inputs take {held / 2**30:.2f} GiB a call, and this target holds {args.max_bytes / 2**30:.2f} GiB "
                       "for two calls' worth (try --size-scale)")
    with torch.no_grad():
        try:
            result = model(*inputs)
        except Exception as e:
            raise Unusable(f"forward(*get_inputs()) raised {type(e).__name__}: {e}")
    outputs = outputs_of(result)
    names = unique_names(input_names + [n for n, _ in state] + (["out"] if len(outputs) == 1 else [f"out{i}" for i in range(len(outputs))]))
    tensors = []
    entries = [("input", t, f"input {input_names[i]}") for i, t in enumerate(inputs)] + \
              [("state", t, f"parameter {n}") for n, t in state] + [("output", t, "output " + str(i)) for i, t in enumerate(outputs)]
    for name, (role, t, what) in zip(names, entries):
        dtype = type_of(t, what)
        if dtype == "int64" and t.numel() and (t.max().item() > 2**31 - 1 or t.min().item() < -(2**31)):
            raise Unusable(f"{what} holds int64 values beyond int32, kevo's integer kernel type")
        tensors.append({"name": name, "role": "output" if role == "output" else "input", "from": role, "dtype": dtype,
                        "type": KERNEL_TYPES[dtype], "shape": [int(s) for s in t.shape]})
    family = match_family(model, inputs, state, outputs[0]) if len(outputs) == 1 else None
    ops = traced_ops(model)
    constants = {k: v for k, v in vars(module).items() if type(v) is int and not k.startswith("_")}
    output_rms = []
    for t in outputs:
        output_rms.append(float(t.double().pow(2).mean().sqrt().item()) if t.numel() else 0.0)
    with open(args.file, encoding="utf-8", errors="replace") as f:
        source = f.read()
    print(json.dumps({"ok": True, "tensors": tensors, "family": family, "ops": None if ops is None else [c[1] for c in ops],
                      "constants": constants, "scaled": scaled, "output_rms": output_rms, "torch": torch.__version__,
                      "has_compile": hasattr(torch, "compile"), "source": source}))


# ---- serve: the checker's reference ----


def read_exact(stream, n):
    data = bytearray()
    while len(data) < n:
        chunk = stream.read(n - len(data))
        if not chunk:
            raise EOFError("the checker closed the pipe")
        data += chunk
    return bytes(data)


def to_words(t):
    """A tensor as 4-byte words, flattened."""
    import torch

    t = kernel_view(t).contiguous().cpu()
    if t.dtype == torch.float16:
        t = t.view(torch.int16).to(torch.int32) & 0xFFFF
    return t.numpy().tobytes()


def from_words(data, spec, device):
    import numpy
    import torch

    words = numpy.frombuffer(data, dtype=numpy.uint32).copy()
    if spec["dtype"] == "float32":
        t = torch.from_numpy(words.view(numpy.float32))
    elif spec["dtype"] == "float16":
        t = torch.from_numpy((words & 0xFFFF).astype(numpy.uint16).view(numpy.float16))
    else:
        t = torch.from_numpy(words.view(numpy.int32)).to(getattr(torch, spec["dtype"]))
    return t.reshape(spec["shape"]).to(device)


def map_exchange(fd, size):
    """The CUDA checker's exchange: its device memory, exported as descriptor `fd`, mapped here through the
    driver's virtual memory API (as kevo's runner maps its arena) and seen as one uint8 CUDA tensor; and the
    function that unmaps it."""
    import ctypes

    import torch

    torch.zeros(1, device="cuda")  # the primary context, current on this thread
    cuda = ctypes.CDLL("libcuda.so.1")
    u64, size_t, ptr = ctypes.c_uint64, ctypes.c_size_t, ctypes.c_void_p

    class Location(ctypes.Structure):
        _fields_ = [("type", ctypes.c_int), ("id", ctypes.c_int)]

    class AccessDesc(ctypes.Structure):
        _fields_ = [("location", Location), ("flags", ctypes.c_int)]

    def call(name, argtypes, *values):
        fn = getattr(cuda, name)
        fn.argtypes, fn.restype = argtypes, ctypes.c_int
        status = fn(*values)
        if status != 0:
            raise RuntimeError(f"{name} failed with CUresult {status} (mapping the checker's exchange)")

    handle, base = u64(), u64()
    posix_fd, device_location, read_write = 1, 1, 3  # CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, ..._LOCATION_TYPE_DEVICE, ..._PROT_READWRITE
    call("cuMemImportFromShareableHandle", [ctypes.POINTER(u64), ptr, ctypes.c_int], ctypes.byref(handle), ptr(fd), posix_fd)
    call("cuMemAddressReserve", [ctypes.POINTER(u64), size_t, size_t, u64, u64], ctypes.byref(base), size, 0, 0, 0)
    call("cuMemMap", [u64, size_t, size_t, u64, u64], base, size, 0, handle, 0)
    access = AccessDesc(Location(device_location, torch.cuda.current_device()), read_write)
    call("cuMemSetAccess", [u64, size_t, ctypes.POINTER(AccessDesc), size_t], base, size, ctypes.byref(access), 1)

    class Memory:  # what torch.as_tensor reads to wrap device memory without a copy
        __cuda_array_interface__ = {"shape": (size,), "typestr": "|u1", "data": (base.value, False), "version": 3}

    def release():
        """Unmapped when the run ends: a helper that serves many runs would otherwise hold every run's memory."""
        torch.cuda.synchronize()
        call("cuMemUnmap", [u64, size_t], base, size)
        call("cuMemAddressFree", [u64, size_t], base, size)
        call("cuMemRelease", [u64], handle)
        os.close(fd)

    return torch.as_tensor(Memory(), device="cuda"), release


def kernel_view(t):
    """A tensor as its kernel type sees it, flattened: int64 narrowed to int32, where every value fits."""
    import torch

    t = t.detach().reshape(-1)
    if t.dtype == torch.int64:
        if t.numel() and (t.max().item() > 2**31 - 1 or t.min().item() < -(2**31)):
            raise ValueError("an int64 value does not fit int32, kevo's integer kernel type")
        t = t.to(torch.int32)
    return t


class PipeStream:
    """A checker's requests on stdin and the answers on stdout (serve: the checker started this helper); the
    CUDA checker's exchange descriptor is inherited as fd 3."""

    def __init__(self):
        self.inp, self.out = sys.stdin.buffer, sys.stdout.buffer

    def readline(self):
        return self.inp.readline()

    def read(self, n):
        return self.inp.read(n)

    def write(self, data):
        self.out.write(data)

    def flush(self):
        self.out.flush()

    def take_fd(self):
        return 3


class SocketStream:
    """One checker run's connection (serve-runs): requests and answers on one socket, on which the CUDA checker
    also sends its exchange's descriptor (SCM_RIGHTS, with the request's bytes)."""

    def __init__(self, sock):
        self.sock, self.buffer, self.fds, self.pending = sock, bytearray(), [], bytearray()

    def _fill(self):
        data, fds, _, _ = socket.recv_fds(self.sock, 1 << 16, 4)
        self.fds += fds
        self.buffer += data
        return bool(data)

    def readline(self):
        while b"\n" not in self.buffer:
            if not self._fill():
                line, self.buffer = bytes(self.buffer), bytearray()
                return line
        end = self.buffer.index(b"\n") + 1
        line, self.buffer = bytes(self.buffer[:end]), self.buffer[end:]
        return line

    def read(self, n):
        if not self.buffer:
            self._fill()
        chunk, self.buffer = bytes(self.buffer[:n]), self.buffer[n:]
        return chunk

    def write(self, data):
        self.pending += data

    def flush(self):
        self.sock.sendall(self.pending)
        self.pending = bytearray()

    def take_fd(self):
        if not self.fds:
            raise ValueError("the exchange came without its descriptor")
        return self.fds.pop(0)

    def close(self):
        for fd in self.fds:
            os.close(fd)
        self.sock.close()


class Reference:
    """The module, loaded and instantiated once; serves one checker run's requests at a time (serve_run)."""

    def __init__(self, args):
        import torch

        torch.set_grad_enabled(False)
        self.args = args
        self.module, _ = load_module(args.file, args.scale)
        self.model, first_inputs = instantiate(self.module, 1, args.device)
        self.params = [t for _, t in state_tensors(self.model)]
        # The dtypes the module draws (an int64 input crosses as int32 and is widened back).
        self.natural = [t.dtype for t in first_inputs + self.params]

    def draw(self, seed):
        m, xs = instantiate(self.module, seed, self.args.device)
        return xs + [t for _, t in state_tensors(m)]

    def draw_with_window(self, seed, extra):
        """Each kernel input under `seed`, flattened to its kernel type and followed by `extra` elements of further
        draws (the timing pool's window past the end)."""
        import torch

        parts = [[kernel_view(t)] for t in self.draw(seed)]
        have = [p[0].numel() for p in parts]
        more = 1
        while any(h < p[0].numel() + extra for h, p in zip(have, parts)):
            for k, t in enumerate(self.draw(seed + (more << 32))):
                again = kernel_view(t)
                take = min(again.numel(), parts[k][0].numel() + extra - have[k])
                if take == 0 and have[k] < parts[k][0].numel() + extra:
                    raise ValueError(f"input {k} is empty: its timing pool cannot be filled")
                parts[k].append(again[:take])
                have[k] += take
            more += 1
        return [torch.cat(p) if len(p) > 1 else p[0] for p in parts]

    def forward(self, given):
        """The module on the kernel's inputs (the module's own inputs, then its parameters and buffers)."""
        xs, ps = given[: len(given) - len(self.params)], given[len(given) - len(self.params):]
        for p, v in zip(self.params, ps):
            p.copy_(v)
        return outputs_of(self.model(*xs))

    def serve_run(self, stream):
        """Requests, one line each, then binary payloads; answers on the stream. First the checker's spec (a JSON
        line: each kernel tensor's role, dtype and shape), answered "ready".
          draw SEED EXTRA   -> for each kernel input: u64 count, count words (the module's get_inputs() and fresh
                               parameters under SEED, each tensor followed by EXTRA more elements of another draw)
          forward           <- for each kernel input: u64 count, count words
                            -> "ok\n" then for each output: u64 count, count words; or "error MESSAGE\n"
          time SEED REPETITIONS PEERS  -> one JSON line: PyTorch eager (and torch.compile where PEERS is 1) timed
        The CUDA checker's requests, whose tensors cross in its device memory (its descriptor: stream.take_fd())
        instead:
          exchange OFFSET... BYTES  map it; tensor i's slot starts at OFFSET i           -> "ok\n"
          draw_shared SEED EXTRA    as draw, into the inputs' slots (kernel types)       -> "ok\n", a u64 count an input
          forward_shared            the inputs from their slots, outputs into theirs     -> "ok\n", a u64 count an output
        """
        import torch

        args = self.args
        first = stream.readline()
        if not first:
            return
        spec = json.loads(first)
        kernel_inputs = [t for t in spec if t["role"] == "input"]
        input_slots = [i for i, t in enumerate(spec) if t["role"] == "input"]
        output_slots = [i for i, t in enumerate(spec) if t["role"] == "output"]
        shared, release, slots = None, None, []

        def slot(i, count):
            kernel_dtype = getattr(torch, spec[i]["dtype"])
            begin = slots[i]
            return shared[begin : begin + count * torch.empty(0, dtype=kernel_dtype).element_size()].view(kernel_dtype)

        stream.write(b"ready\n")
        stream.flush()
        try:
            while True:
                line = stream.readline().decode().split()
                if not line or line[0] == "quit":
                    return
                try:
                    if line[0] == "draw":
                        payload = b""
                        for t in self.draw_with_window(int(line[1]), int(line[2])):
                            words = to_words(t)
                            payload += struct.pack("<Q", len(words) // 4) + words
                        stream.write(b"ok\n" + payload)
                    elif line[0] == "exchange":
                        slots = [int(v) for v in line[1:-1]]
                        shared, release = map_exchange(stream.take_fd(), int(line[-1]))
                        stream.write(b"ok\n")
                    elif line[0] == "draw_shared":
                        counts = []
                        for k, t in enumerate(self.draw_with_window(int(line[1]), int(line[2]))):
                            slot(input_slots[k], t.numel()).copy_(t)
                            counts.append(t.numel())
                        torch.cuda.synchronize()
                        stream.write(b"ok\n" + b"".join(struct.pack("<Q", c) for c in counts))
                    elif line[0] == "forward_shared":
                        given = []
                        for k, i in enumerate(input_slots):
                            shape = spec[i]["shape"]
                            given.append(slot(i, _prod(shape)).reshape(shape).to(self.natural[k]).clone())
                        counts = []
                        for i, r in zip(output_slots, self.forward(given)):
                            flat = kernel_view(r)
                            slot(i, flat.numel()).copy_(flat)
                            counts.append(flat.numel())
                        torch.cuda.synchronize()  # done before the checker reads them
                        stream.write(b"ok\n" + b"".join(struct.pack("<Q", c) for c in counts))
                    elif line[0] == "forward":
                        given = []
                        for k, t in enumerate(kernel_inputs):
                            (count,) = struct.unpack("<Q", read_exact(stream, 8))
                            given.append(from_words(read_exact(stream, 4 * count), t, args.device).to(self.natural[k]))
                        payload = b""
                        for r in self.forward(given):
                            words = to_words(r)
                            payload += struct.pack("<Q", len(words) // 4) + words
                        stream.write(b"ok\n" + payload)
                    elif line[0] == "time":
                        result = timed(self.module, args.device, int(line[1]), int(line[2]), line[3] == "1")
                        stream.write((json.dumps(result) + "\n").encode())
                    else:
                        stream.write(f"error unknown request {line[0]}\n".encode())
                except EOFError:
                    return
                except Exception as e:
                    stream.write(("error " + f"{type(e).__name__}: {e}".replace("\n", " ") + "\n").encode())
                stream.flush()
        finally:
            shared = None
            if release:
                release()


def serve(args):
    """One checker run: the checker started this helper, and talks to it on stdin and stdout."""
    Reference(args).serve_run(PipeStream())


def serve_runs(args):
    """One checker run after another, for as long as kevo's evaluator keeps the control socket open: each run is a
    connection whose descriptor comes on the control socket (SCM_RIGHTS). The module is loaded, PyTorch imported
    and the device's context made once, not once a run (about 6 s on the GPU machine, more than a run)."""
    import torch

    reference = Reference(args)
    control = socket.socket(fileno=args.control_fd)
    control.sendall(f"ready {os.getpid()}\n".encode())
    while True:
        data, fds, _, _ = socket.recv_fds(control, 16, 4)
        if not data:
            return
        for fd in fds:
            control.sendall(b"a")  # taken: kevo knows this helper is alive and serves the run
            stream = SocketStream(socket.socket(fileno=fd))
            try:
                reference.serve_run(stream)
            except (OSError, EOFError):  # the checker went away mid-run: its run is over, not the helper
                pass
            finally:
                stream.close()
                if args.device.startswith("cuda"):
                    torch.cuda.empty_cache()  # the device's memory back for the next candidate


# ---- time: the peers, on kevo's clock ----


def time_calls(fn, input_sets, device, warmup, repetitions):
    """Median seconds of fn over fresh inputs, caches flushed before each call: CUDA events on a GPU; on the
    CPU the larger of wall time and the process's CPU time over its CPUs, as kevo's CPU checker times kernels."""
    import torch

    cpus = max(1, len(os.sched_getaffinity(0)))
    flush = torch.empty(64 << 20 if device == "cpu" else 256 << 20, dtype=torch.uint8, device=device)
    samples = []
    for k in range(warmup + repetitions):
        xs = input_sets[k % len(input_sets)]
        flush.add_(1)
        if device == "cpu":
            w0, c0 = time.perf_counter(), time.process_time()
            fn(*xs)
            seconds = max(time.perf_counter() - w0, (time.process_time() - c0) / cpus)
        else:
            torch.cuda.synchronize()
            start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn(*xs)
            stop.record()
            stop.synchronize()
            seconds = start.elapsed_time(stop) / 1e3
        if k >= warmup:
            samples.append(seconds)
    samples.sort()
    return samples[len(samples) // 2]


def timed(module, device, seed, repetitions, peers):
    """PyTorch eager on fresh inputs (and torch.compile where `peers`), on kevo's clock: a dict for one JSON line."""
    import torch

    model, _ = instantiate(module, seed, device)
    input_sets = [instantiate(module, seed + 1000 * (k + 1), device)[1] for k in range(3)]
    result = {"ok": True, "eager_seconds": time_calls(model, input_sets, device, 2, repetitions)}
    if peers:
        if not hasattr(torch, "compile"):
            result["compile_note"] = f"PyTorch {torch.__version__} has no torch.compile"
        else:
            try:
                compiled = torch.compile(model)
                result["compile_seconds"] = time_calls(compiled, input_sets, device, 3, repetitions)
            except Exception as e:
                result["compile_note"] = f"torch.compile failed: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
    return result


def time_peers(args):
    import torch

    torch.set_grad_enabled(False)
    module, _ = load_module(args.file, args.scale)
    print(json.dumps(timed(module, args.device, args.seed, args.repetitions, args.peers)))


def main():
    parser = argparse.ArgumentParser(description="kevo's PyTorch helper for KernelBench-format problems")
    parser.add_argument("mode", choices=["describe", "serve", "serve-runs", "time"])
    parser.add_argument("file")
    parser.add_argument("--scale", type=float, default=1.0)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--repetitions", type=int, default=15)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--peers", action="store_true")
    parser.add_argument("--control-fd", type=int, default=-1, help="serve-runs: the socket on which each run's connection comes")
    parser.add_argument("--max-bytes", type=int, default=0, help="describe: refuse inputs whose two calls' worth exceed this")
    args = parser.parse_args()
    try:
        import torch  # noqa: F401
    except Exception as e:
        print(json.dumps({"ok": False, "error": f"PyTorch cannot be imported by {sys.executable}: {e}"}))
        return 0
    try:
        if args.device.startswith("cuda"):
            import torch

            if not torch.cuda.is_available():
                raise Unusable(f"{sys.executable}'s PyTorch sees no CUDA device")
            # Full fp32 on both sides: no TF32 in the reference (a candidate of a fp32 problem gets none either).
            torch.backends.cuda.matmul.allow_tf32 = False
            torch.backends.cudnn.allow_tf32 = False
        {"describe": describe, "serve": serve, "serve-runs": serve_runs, "time": time_peers}[args.mode](args)
    except Unusable as e:
        print(json.dumps({"ok": False, "error": str(e)}))
    except Exception as e:
        print(json.dumps({"ok": False, "error": f"{type(e).__name__}: {e}", "trace": traceback.format_exc()[-2000:]}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
